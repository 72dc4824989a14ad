//! The flags of `dualpipe train` (feature `clap`) and the one place they become a
//! [`crate::TrainConfig`]: [`TrainArgs::config`].
//!
//! The flags live here, beside the configuration they fill, so that every default is read from
//! [`TrainConfig::DEFAULT`](crate::TrainConfig::DEFAULT) (or the MLP's, or
//! [`MoeSettings::DEFAULT`](crate::MoeSettings::DEFAULT)) and the help text cannot drift from
//! the library; the binary only parses, calls and prints. Every refusal is a
//! [`TrainError::Config`] whose message names the flag and a valid value (the binary shows it
//! as a usage error, exit code 2); sizes are checked once, by
//! [`TrainConfig::check`](crate::TrainConfig::check).
//!
//! - [`args`] — [`TrainArgs`], the flags themselves, with [`Transport`] and [`Format`];
//! - [`resolve`] — [`TrainArgs::config`]: flags → configuration (and `--init-from`'s
//!   architecture);
//! - [`layout`] — [`LayoutArgs`]: partition, plan, profile, slow rank, re-balancing;
//! - [`moe`] — [`MoeArgs`]: the mixture of experts;
//! - [`observe`] — [`ObserveArgs`]: progress, metrics address, run log;
//! - [`resume`](mod@resume) — [`TrainArgs::resume_point`] and
//!   [`TrainArgs::checkpoint_options`];
//! - [`inject`] — `--inject-failure`'s `RANK:STEP:HOW` ([`Injection`]);
//! - [`run`] — [`TrainArgs::run_local`]: the run of the flags on local threads, what it tells
//!   on the way and what it leaves to write ([`Finished`]);
//! - `mpi` (feature `mpi`) — `TrainArgs::run_rank`: one process's run under an MPI
//!   launcher, which process reports and how a failing one leaves;
//! - [`failure`] — [`Failure`]: a failed run in the command line's words, usage error or not.

use std::path::Path;

use dualpipe_schedule::ir::UnknownScheduleKind;
use dualpipe_schedule::{ConfigError, Knob, Schedule, ScheduleError, ScheduleKind};

use crate::{Divergence, ModelKind, TrainConfig, TrainError};

pub mod args;
pub mod failure;
pub mod inject;
pub mod layout;
pub mod moe;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod observe;
pub mod resolve;
pub mod resume;
pub mod run;

pub use args::{Format, TrainArgs, Transport};
pub use failure::Failure;
pub use inject::{How, Injection};
pub use layout::{LayoutArgs, ProfileRun};
pub use moe::MoeArgs;
pub use observe::{rank_addr, ObserveArgs};
pub use run::Finished;

/// Parses a count flag (`--ranks`, `--micro-batches`, ...): a whole number from 0 up. Negative
/// numbers reach this check (flags use `allow_negative_numbers`) instead of being taken for an
/// unknown flag; 0 passes here and is refused, with the nearest valid value, by the library.
pub fn count(text: &str) -> Result<usize, String> {
    let t = text.trim();
    if let Ok(n) = t.parse::<usize>() {
        return Ok(n);
    }
    if t.parse::<i128>().is_ok_and(|n| n < 0) || t.parse::<f64>().is_ok_and(|x| x < 0.0) {
        return Err(format!(
            "a count cannot be negative, got {t}; give a whole number from 1 up"
        ));
    }
    if t.parse::<i128>().is_ok() {
        return Err(format!("{t} is too large (the most is {})", usize::MAX));
    }
    if t.parse::<f64>().is_ok() {
        return Err(format!("{t} is not a whole number; give a count such as 4"));
    }
    Err(format!("{t} is not a number; give a count such as 4"))
}

/// Parses a `--seed`: a whole number from 0 to 2^64 - 1. A negative number reaches this check
/// (the flag uses `allow_negative_numbers`) and gets the range, not "unexpected argument".
pub fn seed(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.parse::<u64>().map_err(|_| {
        format!(
            "{t} is not a seed; give a whole number from 0 to {}",
            u64::MAX
        )
    })
}

/// Parses a `--schedule` value, naming the valid kinds when it is unknown.
pub fn parse_kind(name: &str) -> Result<ScheduleKind, TrainError> {
    name.parse().map_err(|_: UnknownScheduleKind| {
        TrainError::Config(format!(
            "unknown schedule '{name}' (--schedule): use one of {}",
            UnknownScheduleKind::valid()
        ))
    })
}

/// Reads `--schedule-file` (our JSON or torch's compute-only CSV, validated on import); a
/// file that cannot be read or used is a [`TrainError::Config`] naming the flag.
pub fn read_schedule_file(path: &Path) -> Result<Schedule, TrainError> {
    dualpipe_schedule::format::read_schedule_file(path).map_err(|e| match e {
        ScheduleError::Parse(msg) => TrainError::Config(format!("{msg} (--schedule-file)")),
        other => TrainError::Config(format!(
            "schedule file {} (--schedule-file): {other}",
            path.display()
        )),
    })
}

/// A diverged run in the words of the command line: the flags to change (the learning rate,
/// or, when the first loss already overflows, the element type and the width).
pub fn divergence(d: &Divergence, config: &TrainConfig) -> String {
    if d.before_any_update() {
        format!(
            "the loss of step 1 is {}, before any update: the inputs or the initial weights \
             overflow {} (the learning rate is not the cause); try --dtype f64, a smaller \
             {} or fewer --layers-per-stage",
            d.loss,
            config.model.dtype,
            match config.model.kind {
                ModelKind::Gpt => "--d-model",
                ModelKind::Mlp => "--hidden",
            }
        )
    } else {
        format!(
            "training diverged at step {}: the loss is {}; lower the learning rate (now --lr {:e})",
            d.step + 1,
            d.loss,
            d.lr
        )
    }
}

/// A schedule's unsupported configuration in the command line's words: each setting by its
/// flag (`--ranks 2`, `--schedule interleaved`).
pub fn schedule_flags(err: &ConfigError) -> String {
    err.render(|knob, value| {
        let flag = match knob {
            Knob::Kind => "--schedule",
            Knob::Ranks => "--ranks",
            Knob::MicroBatches => "--micro-batches",
            Knob::VirtualStages => "--virtual-stages",
        };
        match value {
            Some(v) => format!("{flag} {v}"),
            None => flag.to_string(),
        }
    })
}

/// A configuration error's own words (without the library's prefix).
pub fn message(err: TrainError) -> String {
    match err {
        TrainError::Config(msg) => msg,
        TrainError::Schedule(ScheduleError::InvalidConfig(e)) => schedule_flags(&e),
        other => other.to_string(),
    }
}

/// A configuration error in its own words, as a [`TrainError::Config`].
fn reworded(err: TrainError) -> TrainError {
    TrainError::Config(message(err))
}

/// `unknown {what} '{value}' ({flag}): use one of ...`.
fn unknown(what: &str, flag: &str, value: &str, names: &[&str]) -> TrainError {
    TrainError::Config(format!(
        "unknown {what} '{value}' ({flag}): use one of {}",
        names.join(", ")
    ))
}
