//! [`TrainConfig`]: everything a run depends on, the one place its defaults live, and the one
//! check of its sizes ([`TrainConfig::check`]).

use std::fmt;

use dualpipe_nn::{ModelConfig, OptimizerKind};
use dualpipe_schedule::ScheduleKind;
use serde::{Deserialize, Serialize};

use crate::error::TrainError;
use crate::memory::{self, MemoryEstimate, MEMORY_LIMIT_BYTES};

/// Element type of parameters and activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit floats (fast; the default for training).
    #[default]
    F32,
    /// 64-bit floats (for exact comparisons in tests).
    F64,
}

impl DType {
    /// Names accepted by [`DType::from_name`].
    pub const NAMES: [&'static str; 2] = ["f32", "f64"];

    /// `"f32"` or `"f64"`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Parses `"f32"` or `"f64"` (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "f32" => Some(DType::F32),
            "f64" => Some(DType::F64),
            _ => None,
        }
    }

    /// The candle element type.
    pub fn candle(self) -> candle_core::DType {
        match self {
            DType::F32 => candle_core::DType::F32,
            DType::F64 => candle_core::DType::F64,
        }
    }

    /// Bytes of one value.
    pub fn size_in_bytes(self) -> u128 {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The most steps one run may ask for: the run keeps every step's loss for its summary (8 bytes
/// a step, so 8 GB at the cap), and nothing near it finishes in a lifetime anyway.
pub const MAX_STEPS: usize = 1_000_000_000;

/// Everything a training run depends on. The model and the data depend only on `seed`,
/// [`TrainConfig::model_stages`], `hidden`, `layers_per_stage`, `micro_batches`,
/// `micro_batch_size` and `dtype` — never on the schedule or the rank count — so e.g. DualPipe
/// on 4 ranks, 1F1B on 4 ranks and DualPipeV on 2 ranks (4 stages each) train the same model
/// on the same batches.
///
/// [`TrainConfig::default`] is the one source of defaults: the CLI's flags take theirs from
/// it. As JSON, missing members take their defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// The pipeline schedule (its name, e.g. `"dualpipe"`).
    #[serde(with = "schedule_name")]
    pub schedule: ScheduleKind,
    /// Pipeline ranks (one thread each locally, one process each with a
    /// [`RankTrainer`](crate::RankTrainer)).
    pub ranks: usize,
    /// Micro-batches per step, over all directions.
    pub micro_batches: usize,
    /// Rows per micro-batch.
    pub micro_batch_size: usize,
    /// Stages per rank for `interleaved` (ignored by the other schedules).
    pub virtual_stages: usize,
    /// Width of the model (each block is `hidden → 4 hidden → hidden`).
    pub hidden: usize,
    /// Residual MLP blocks per model stage.
    pub layers_per_stage: usize,
    /// Training steps of a run ([`Trainer::run`](crate::Trainer::run) runs them;
    /// [`Trainer::step`](crate::Trainer::step) runs one). At most [`MAX_STEPS`].
    pub steps: usize,
    /// Learning rate.
    pub lr: f64,
    /// The optimizer and its hyper-parameters.
    #[serde(with = "optimizer_repr")]
    pub optimizer: OptimizerKind,
    /// Element type of parameters and activations.
    pub dtype: DType,
    /// Seed of the model, the teacher and the data.
    pub seed: u64,
    /// Seconds a rank waits for a message from another rank (a neighbour's activation or
    /// gradient, locally or across processes) before the step fails naming both.
    pub recv_timeout: f64,
}

impl TrainConfig {
    /// The default run: DualPipe on 4 ranks, 4 stages of 2 blocks of width 128, 16
    /// micro-batches of 64 rows, AdamW at lr 1e-3, f32, seed 0, 600 steps (about 45 s on 2
    /// cores in release), a 60 s receive timeout.
    pub const DEFAULT: TrainConfig = TrainConfig {
        schedule: ScheduleKind::DualPipe,
        ranks: 4,
        micro_batches: 16,
        micro_batch_size: 64,
        virtual_stages: 1,
        hidden: 128,
        layers_per_stage: 2,
        steps: 600,
        lr: 1e-3,
        optimizer: OptimizerKind::adamw(),
        dtype: DType::F32,
        seed: 0,
        recv_timeout: 60.0,
    };
}

impl Default for TrainConfig {
    /// [`TrainConfig::DEFAULT`].
    fn default() -> Self {
        TrainConfig::DEFAULT
    }
}

/// A configuration field, for messages: [`Naming::Fields`] calls it by its Rust / JSON name
/// (`micro_batch_size`), [`Naming::Flags`] by its command-line flag (`--micro-batch-size`), so
/// the one check speaks the words of whoever called it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// [`TrainConfig::ranks`].
    Ranks,
    /// [`TrainConfig::micro_batches`].
    MicroBatches,
    /// [`TrainConfig::micro_batch_size`].
    MicroBatchSize,
    /// [`TrainConfig::virtual_stages`].
    VirtualStages,
    /// [`TrainConfig::hidden`].
    Hidden,
    /// [`TrainConfig::layers_per_stage`].
    LayersPerStage,
    /// [`TrainConfig::steps`].
    Steps,
    /// [`TrainConfig::lr`].
    Lr,
    /// [`TrainConfig::recv_timeout`].
    RecvTimeout,
    /// [`TrainConfig::dtype`].
    DType,
}

/// How messages name a [`Field`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Naming {
    /// By field name (`micro_batch_size`): library users.
    #[default]
    Fields,
    /// By flag (`--micro-batch-size`): the command line.
    Flags,
}

impl Field {
    /// The field's name (as in JSON).
    pub fn key(self) -> &'static str {
        match self {
            Field::Ranks => "ranks",
            Field::MicroBatches => "micro_batches",
            Field::MicroBatchSize => "micro_batch_size",
            Field::VirtualStages => "virtual_stages",
            Field::Hidden => "hidden",
            Field::LayersPerStage => "layers_per_stage",
            Field::Steps => "steps",
            Field::Lr => "lr",
            Field::RecvTimeout => "recv_timeout",
            Field::DType => "dtype",
        }
    }

    /// The field as `naming` calls it: `micro_batch_size` or `--micro-batch-size`.
    pub fn name(self, naming: Naming) -> String {
        match naming {
            Naming::Fields => self.key().to_string(),
            Naming::Flags => format!("--{}", self.key().replace('_', "-")),
        }
    }
}

impl TrainConfig {
    /// Model stages along one pipeline: `2 × ranks` for DualPipeV, `ranks × virtual_stages`
    /// for interleaved, `ranks` otherwise (saturating: absurd sizes are refused by
    /// [`TrainConfig::check`], not by an overflow).
    pub fn model_stages(&self) -> usize {
        match self.schedule {
            ScheduleKind::DualPipeV => self.ranks.saturating_mul(2),
            ScheduleKind::Interleaved => self.ranks.saturating_mul(self.virtual_stages),
            _ => self.ranks,
        }
    }

    /// The model's shape and seed.
    pub fn model(&self) -> ModelConfig {
        ModelConfig {
            seed: self.seed,
            hidden: self.hidden,
            layers_per_stage: self.layers_per_stage,
            stages: self.model_stages(),
            dtype: self.dtype.candle(),
        }
    }

    /// [`TrainConfig::check`] in field names, for a process that holds every rank.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.check(Naming::Fields, 1)
    }

    /// Checks the sizes that do not depend on the schedule (the schedule checks its own),
    /// naming fields as `naming` says. Memory is checked against [`MEMORY_LIMIT_BYTES`] for the
    /// whole model and against this machine's available memory for the share one process holds
    /// when the ranks are spread over `processes` processes (1 locally).
    pub fn check(&self, naming: Naming, processes: usize) -> Result<(), TrainError> {
        let name = |field: Field| field.name(naming);
        let positive = [
            (Field::Ranks, self.ranks),
            (Field::MicroBatches, self.micro_batches),
            (Field::MicroBatchSize, self.micro_batch_size),
            (Field::VirtualStages, self.virtual_stages),
            (Field::Hidden, self.hidden),
            (Field::LayersPerStage, self.layers_per_stage),
            (Field::Steps, self.steps),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(TrainError::Config(format!(
                    "{} is 0; it must be at least 1",
                    name(field)
                )));
            }
        }
        if self.steps > MAX_STEPS {
            return Err(TrainError::Config(format!(
                "{} {} is more than {MAX_STEPS}, the most one run takes (it keeps every step's \
                 loss); run fewer steps",
                name(Field::Steps),
                self.steps
            )));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(TrainError::Config(format!(
                "{} {}: the learning rate must be a positive number such as 0.001",
                name(Field::Lr),
                self.lr
            )));
        }
        if !(self.recv_timeout.is_finite() && self.recv_timeout > 0.0 && self.recv_timeout < 1e9) {
            return Err(TrainError::Config(format!(
                "{} {}: the timeout must be a positive number of seconds such as 60",
                name(Field::RecvTimeout),
                self.recv_timeout
            )));
        }
        self.check_memory(naming, processes, memory::available_bytes())
    }

    /// The memory part of [`TrainConfig::check`], against `available` bytes on this machine
    /// (`None`: unknown, only the documented cap applies).
    pub fn check_memory(
        &self,
        naming: Naming,
        processes: usize,
        available: Option<u128>,
    ) -> Result<(), TrainError> {
        let name = |field: Field| field.name(naming);
        let memory = self.memory_bytes();
        let gib = |bytes: u128| bytes.div_ceil(1 << 30);
        let share = |bytes: u128| bytes.div_ceil(processes.max(1) as u128);
        // Name the factor that makes the size absurd, not only the ones printed first.
        let stages = self.model_stages();
        let width_squared = (self.hidden as u128).saturating_mul(self.hidden as u128);
        let parameters_hint = if stages as u128 > width_squared && stages > self.layers_per_stage {
            format!("fewer {}", name(Field::Ranks))
        } else if self.layers_per_stage as u128 > width_squared {
            format!("fewer {}", name(Field::LayersPerStage))
        } else {
            format!(
                "a smaller {} or fewer {}",
                name(Field::Hidden),
                name(Field::LayersPerStage)
            )
        };
        let activations_hint = if self.micro_batches > self.micro_batch_size {
            format!("fewer {}", name(Field::MicroBatches))
        } else {
            format!("a smaller {}", name(Field::MicroBatchSize))
        };
        let parameters_too_big = |limit: u128, what: &str| {
            TrainError::Config(format!(
                "{} {} with {} {} on {} model stages ({} {}) needs {} GiB of parameters and \
                 optimizer state, more than {}; use {}",
                name(Field::Hidden),
                self.hidden,
                name(Field::LayersPerStage),
                self.layers_per_stage,
                stages,
                name(Field::Ranks),
                self.ranks,
                gib(memory.parameters),
                what.replace("{}", &gib(limit).to_string()),
                parameters_hint,
            ))
        };
        let activations_too_big = |limit: u128, what: &str| {
            TrainError::Config(format!(
                "{} {} with {} {} and {} {} needs {} GiB of activations per step, more than {}; \
                 use {}",
                name(Field::MicroBatchSize),
                self.micro_batch_size,
                name(Field::MicroBatches),
                self.micro_batches,
                name(Field::Hidden),
                self.hidden,
                gib(memory.activations),
                what.replace("{}", &gib(limit).to_string()),
                activations_hint,
            ))
        };
        const CAP: &str = "the {} GiB a run may use";
        if memory.parameters > MEMORY_LIMIT_BYTES {
            return Err(parameters_too_big(MEMORY_LIMIT_BYTES, CAP));
        }
        if memory.activations > MEMORY_LIMIT_BYTES {
            return Err(activations_too_big(MEMORY_LIMIT_BYTES, CAP));
        }
        if let Some(available) = available {
            const FREE: &str = "the {} GiB this machine has available";
            if share(memory.parameters) > available {
                return Err(parameters_too_big(available, FREE));
            }
            if share(memory.total()) > available {
                return Err(activations_too_big(available, FREE));
            }
        }
        Ok(())
    }

    /// An upper estimate of the memory a run needs, computed without overflow: every block's
    /// h x 4h and 4h x h weights and biases for up to two copies of each stage, each with a
    /// gradient and two optimizer moments; and one step's activations (each block keeps its
    /// input, its 4h-wide hidden activations and their GELU input).
    pub fn memory_bytes(&self) -> MemoryEstimate {
        let bytes_per_value = self.dtype.size_in_bytes();
        let h = self.hidden as u128;
        let blocks = (self.model_stages() as u128).saturating_mul(self.layers_per_stage as u128);
        let parameters = blocks
            .saturating_mul(
                h.saturating_mul(h)
                    .saturating_mul(8)
                    .saturating_add(h.saturating_mul(5)),
            )
            .saturating_mul(2 * 4 * bytes_per_value);
        let activations = (self.micro_batch_size as u128)
            .saturating_mul(self.micro_batches as u128)
            .saturating_mul(h.saturating_mul(9))
            .saturating_mul(blocks)
            .saturating_mul(bytes_per_value);
        MemoryEstimate {
            parameters,
            activations,
        }
    }
}

/// `ScheduleKind` as its name (`"dualpipe"`, `"1f1b"`, ...).
mod schedule_name {
    use dualpipe_schedule::ScheduleKind;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(kind: &ScheduleKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(kind.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ScheduleKind, D::Error> {
        let name = String::deserialize(d)?;
        ScheduleKind::from_name(&name).ok_or_else(|| {
            let names: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
            serde::de::Error::custom(format!(
                "unknown schedule '{name}': use one of {}",
                names.join(", ")
            ))
        })
    }
}

/// `OptimizerKind` as `{"name": "sgd", "momentum": 0.9}` or
/// `{"name": "adamw", "beta1": .., "beta2": .., "eps": .., "weight_decay": ..}`.
mod optimizer_repr {
    use dualpipe_nn::OptimizerKind;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(tag = "name", rename_all = "lowercase", deny_unknown_fields)]
    enum Repr {
        Sgd {
            momentum: f64,
        },
        AdamW {
            beta1: f64,
            beta2: f64,
            eps: f64,
            weight_decay: f64,
        },
    }

    pub fn serialize<S: Serializer>(kind: &OptimizerKind, s: S) -> Result<S::Ok, S::Error> {
        match *kind {
            OptimizerKind::Sgd { momentum } => Repr::Sgd { momentum },
            OptimizerKind::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => Repr::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            },
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<OptimizerKind, D::Error> {
        Ok(match Repr::deserialize(d)? {
            Repr::Sgd { momentum } => OptimizerKind::Sgd { momentum },
            Repr::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => OptimizerKind::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trips_and_missing_members_take_defaults() {
        let config = TrainConfig {
            schedule: ScheduleKind::Zb1p,
            optimizer: OptimizerKind::sgd(),
            dtype: DType::F64,
            ..TrainConfig::default()
        };
        let text = serde_json::to_string(&config).unwrap();
        assert!(text.contains("\"schedule\":\"zb1p\""), "{text}");
        assert_eq!(serde_json::from_str::<TrainConfig>(&text).unwrap(), config);
        let partial: TrainConfig = serde_json::from_str(r#"{"ranks": 2}"#).unwrap();
        assert_eq!(
            partial,
            TrainConfig {
                ranks: 2,
                ..TrainConfig::default()
            }
        );
        assert!(serde_json::from_str::<TrainConfig>(r#"{"schedule": "zigzag"}"#).is_err());
        assert!(serde_json::from_str::<TrainConfig>(r#"{"rank": 2}"#).is_err());
    }

    #[test]
    fn messages_name_fields_or_flags() {
        let config = TrainConfig {
            micro_batch_size: 0,
            ..TrainConfig::default()
        };
        let fields = config.check(Naming::Fields, 1).unwrap_err().to_string();
        let flags = config.check(Naming::Flags, 1).unwrap_err().to_string();
        assert!(fields.contains("micro_batch_size is 0"), "{fields}");
        assert!(flags.contains("--micro-batch-size is 0"), "{flags}");
    }

    #[test]
    fn memory_is_checked_against_the_cap_and_the_machine() {
        // 68 GB of parameters: under the cap, over a machine with 16 GiB available.
        let wide = TrainConfig {
            hidden: 8192,
            layers_per_stage: 1,
            micro_batch_size: 1,
            micro_batches: 4,
            ..TrainConfig::default()
        };
        assert!(wide.check_memory(Naming::Flags, 1, None).is_ok());
        let err = wide
            .check_memory(Naming::Flags, 1, Some(16 << 30))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--hidden 8192") && err.contains("16 GiB"),
            "{err}"
        );
        // Spread over 8 processes, each holds an eighth.
        assert!(wide.check_memory(Naming::Flags, 8, Some(16 << 30)).is_ok());
        // A million rows a micro-batch: activations, naming --micro-batch-size.
        let rows = TrainConfig {
            micro_batch_size: 1_000_000,
            ..TrainConfig::default()
        };
        let err = rows
            .check_memory(Naming::Flags, 1, Some(16 << 30))
            .unwrap_err()
            .to_string();
        assert!(err.contains("use a smaller --micro-batch-size"), "{err}");
        let many = TrainConfig {
            micro_batches: 1 << 40,
            micro_batch_size: 1,
            ..TrainConfig::default()
        };
        let err = many
            .check_memory(Naming::Flags, 1, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("use fewer --micro-batches"), "{err}");
        let huge = TrainConfig {
            micro_batch_size: 100_000_000,
            ..TrainConfig::default()
        };
        let err = huge.check_memory(Naming::Fields, 1, None).unwrap_err();
        assert!(err.to_string().contains("micro_batch_size"), "{err}");
    }

    #[test]
    fn steps_are_capped_and_the_default_is_six_hundred() {
        assert_eq!(TrainConfig::default().steps, 600);
        let many = TrainConfig {
            steps: 1_000_000_000_000,
            ..TrainConfig::default()
        };
        let err = many.validate().unwrap_err().to_string();
        assert!(err.contains("steps 1000000000000"), "{err}");
    }
}
