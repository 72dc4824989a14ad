//! [`Failure`]: how a job failed, in the words its user reads, and whose fault it is: the
//! request's (a bad configuration or input, a usage error: exit code 2) or the run's (exit
//! code 1).

use std::error::Error;

use dualpipe_schedule::{ConfigError, Knob, ScheduleError};

use crate::{Divergence, Field, ModelKind, Naming, TrainConfig, TrainError};

/// A failed job, worded for its user (fields named as the job's [`Naming`] says).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The whole message: a context, the error and each of its causes, joined by `": "`.
    pub message: String,
    /// Whether the request is at fault (a bad configuration or input) rather than the run.
    pub usage: bool,
    /// The signal that stopped the run at a step boundary (exit code `128 + signal`).
    pub signal: Option<i32>,
}

impl Failure {
    /// A refused request (exit code 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            usage: true,
            signal: None,
        }
    }

    /// A failure of the run told in these words alone (exit code 1).
    pub fn run(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            usage: false,
            signal: None,
        }
    }

    /// A run stopped by `signal` at a step boundary, told in these words.
    pub fn interrupted(message: impl Into<String>, signal: i32) -> Self {
        Failure {
            message: message.into(),
            usage: false,
            signal: Some(signal),
        }
    }

    /// A failure of the run: `context` (when given), `err` and every cause of it.
    pub fn error(context: Option<&str>, err: &(dyn Error + 'static)) -> Self {
        let mut message = context.map(|c| format!("{c}: ")).unwrap_or_default();
        message.push_str(&err.to_string());
        let mut cause = err.source();
        while let Some(c) = cause {
            message.push_str(": ");
            message.push_str(&c.to_string());
            cause = c.source();
        }
        Failure::run(message)
    }

    /// A set-up error: a configuration the schedule or the model rejects, and a checkpoint
    /// that cannot be used, are the request's fault; anything else cannot set up training.
    pub fn setup(err: TrainError, naming: Naming) -> Self {
        match err {
            TrainError::Config(msg) => Failure::usage(msg),
            TrainError::Checkpoint(e) => Failure::usage(e.to_string()),
            TrainError::Schedule(ScheduleError::InvalidConfig(e)) => {
                Failure::usage(schedule_settings(&e, naming))
            }
            other => Failure::error(Some("cannot set up training"), &other),
        }
    }

    /// A failed run: a diverged loss (or weights that stopped being finite) names the
    /// settings to change.
    pub fn training(err: TrainError, config: &TrainConfig, naming: Naming) -> Self {
        let name = |field: Field| field.name(naming);
        match err {
            TrainError::Diverged(d) => Failure::run(divergence(&d, config, naming)),
            TrainError::Checkpoint(e @ crate::CheckpointError::NonFinite { .. }) => {
                Failure::run(format!(
                    "{e}; lower the learning rate (now {} {:e})",
                    name(Field::Lr),
                    config.optimizer.lr
                ))
            }
            other => {
                let mut failure = Failure::error(Some("training failed"), &other);
                // The runtime's advice names its own field; the user gave (or can give) ours.
                failure.message = failure.message.replace(
                    "raise recv_timeout",
                    &format!(
                        "raise {} (now {} s)",
                        name(Field::RecvTimeout),
                        crate::config::check::compact(config.transport.recv_timeout)
                    ),
                );
                failure
            }
        }
    }

    /// The process exit code: `128 + signal` for a run a signal stopped, 2 for a usage
    /// error, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self.signal {
            Some(signal) => u8::try_from(128 + signal).unwrap_or(1),
            None if self.usage => 2,
            None => 1,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for Failure {}

/// A diverged run in the words of its user: the settings to change (the learning rate, or,
/// when the first loss already overflows, the element type and the width).
pub fn divergence(d: &Divergence, config: &TrainConfig, naming: Naming) -> String {
    let name = |field: Field| field.name(naming);
    if d.before_any_update() {
        format!(
            "the loss of step 1 is {}, before any update: the inputs or the initial weights \
             overflow {} (the learning rate is not the cause); try {} f64, a smaller {} or \
             fewer {}",
            d.loss,
            config.model.dtype,
            name(Field::DType),
            match config.model.kind {
                ModelKind::Gpt => name(Field::DModel),
                ModelKind::Mlp => name(Field::Hidden),
            },
            name(Field::LayersPerStage),
        )
    } else {
        format!(
            "training diverged at step {}: the loss is {}; lower the learning rate (now {} {:e})",
            d.step + 1,
            d.loss,
            name(Field::Lr),
            d.lr
        )
    }
}

/// A schedule's unsupported configuration, each setting by its field as `naming` says
/// (`--ranks 2`, `schedule interleaved`).
pub fn schedule_settings(err: &ConfigError, naming: Naming) -> String {
    err.render(|knob, value| {
        let field = match knob {
            Knob::Kind => Field::Schedule,
            Knob::Ranks => Field::Ranks,
            Knob::MicroBatches => Field::MicroBatches,
            Knob::VirtualStages => Field::VirtualStages,
        };
        match value {
            Some(v) => format!("{} {v}", field.name(naming)),
            None => field.name(naming),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TransportSection;

    #[test]
    fn a_timeout_names_the_setting_that_raises_it() {
        let err = || {
            TrainError::Runtime(dualpipe_runtime::RuntimeError::Timeout {
                rank: 1,
                what: "RECV_F (dir 0, stage 1, mb 0)".into(),
                peer: 0,
                timeout: std::time::Duration::from_nanos(1),
            })
        };
        let config = TrainConfig {
            transport: TransportSection {
                recv_timeout: 1e-9,
                ..TrainConfig::DEFAULT.transport
            },
            ..TrainConfig::default()
        };
        let flags = Failure::training(err(), &config, Naming::Flags);
        assert!(
            flags.message.contains("raise --recv-timeout (now 1e-9 s)"),
            "{flags}"
        );
        assert!(!flags.message.contains("ExecOptions"), "{flags}");
        let fields = Failure::training(err(), &config, Naming::Fields);
        assert!(
            fields.message.contains("raise recv_timeout (now 1e-9 s)"),
            "{fields}"
        );
    }
}
