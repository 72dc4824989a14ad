//! [`TrainConfig`]: everything a run depends on, the one place its defaults live, and the one
//! check of its sizes ([`TrainConfig::check`]).

use std::path::PathBuf;

use dualpipe_dp::Compression;
use dualpipe_nn::gpt::GptConfig;
use dualpipe_nn::{LrDecay, LrSchedule, ModelConfig, Optimizer, OptimizerKind};
use dualpipe_schedule::ScheduleKind;
use serde::{Deserialize, Serialize};

mod choice;
mod field;
mod serde_repr;

pub use choice::{DType, ModelKind, Task};
pub use field::{Field, Naming};
use serde_repr::{compression_name, lr_decay_name, optimizer_repr, schedule_name};

fn is_constant(decay: &LrDecay) -> bool {
    *decay == LrDecay::Constant
}

/// The most steps one run may ask for: the run keeps every step's loss for its summary (8 bytes
/// a step, so 8 GB at the cap), and nothing near it finishes in a lifetime anyway.
pub const MAX_STEPS: usize = 1_000_000_000;
/// Whether `b` holds (the default of [`TrainConfig::mpi_allreduce`]: not written).
fn is_true(b: &bool) -> bool {
    *b
}

/// Whether `b` does not hold (the default of [`TrainConfig::one_bit_preconditioned`]).
fn is_false(b: &bool) -> bool {
    !*b
}

/// The share of the steps 1-bit Adam's warm-up takes by default (when
/// [`TrainConfig::compression_warmup`] is `None`): a quarter (at least one step), exchanged
/// in int8. A warm-up of 1% (with the refreshes below, 96% fewer bytes over a run) diverged on
/// the default task; see docs/distributed.md for the runs behind it.
pub const ONE_BIT_ADAM_WARMUP_SHARE: f64 = 0.25;

/// By default 1-bit Adam refreshes AdamW's variance every `steps / ONE_BIT_ADAM_REFRESHES`
/// steps after its warm-up (when [`TrainConfig::variance_refresh`] is `None`; none when that
/// is below 2), each refresh exchanging the gradient in int8.
pub const ONE_BIT_ADAM_REFRESHES: u64 = 7;

/// Everything a training run depends on. The model and the data depend only on `model`,
/// `seed`, [`TrainConfig::model_stages`], the model's shape (`hidden` for the MLP; `d_model`,
/// `heads`, `seq_len` for the GPT), `layers_per_stage`, `micro_batches`, `micro_batch_size`,
/// the data options and `dtype` — never on the schedule or the rank count — so e.g. DualPipe
/// on 4 ranks, 1F1B on 4 ranks and DualPipeV on 2 ranks (4 stages each) train the same model
/// on the same batches.
///
/// [`TrainConfig::DEFAULT`] (the GPT) and [`TrainConfig::MLP`] are the one source of
/// defaults ([`TrainConfig::defaults_for`]): the CLI's flags take theirs from them. As JSON,
/// missing members take [`TrainConfig::DEFAULT`]'s.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// The model.
    pub model: ModelKind,
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
    /// Width of the MLP (each block is `hidden → 4 hidden → hidden`).
    pub hidden: usize,
    /// Blocks per model stage (residual MLP blocks, or transformer blocks).
    pub layers_per_stage: usize,
    /// Width of the GPT's hidden states.
    pub d_model: usize,
    /// The GPT's attention heads (dividing `d_model`).
    pub heads: usize,
    /// Tokens per training sequence (the GPT's context length).
    pub seq_len: usize,
    /// The GPT's training text (any file: bytes are tokens); `None`: the synthetic `task`,
    /// generated in process.
    pub data: Option<PathBuf>,
    /// The synthetic text when `data` is `None`.
    pub task: Task,
    /// The share of the text, at its end, held out for validation (in `[0, 1)`).
    pub validation_fraction: f64,
    /// Evaluate on the validation text every this many steps (0: only after the last step).
    pub eval_every: usize,
    /// Draw training windows in a seeded random order (`false`: row `r` of micro-batch `m` of
    /// step `t` is window `((t-1)·micro_batches + m)·micro_batch_size + r`, modulo the windows).
    pub shuffle: bool,
    /// Start the GPT from these safetensors weights (their metadata fixes the architecture)
    /// instead of a seeded initialisation.
    pub init_from: Option<PathBuf>,
    /// Scale the step's gradient down to this global L2 norm when it is larger (`None`: no
    /// clipping).
    pub clip_grad: Option<f64>,
    /// Training steps of a run ([`Trainer::run`](crate::Trainer::run) runs them;
    /// [`Trainer::step`](crate::Trainer::step) runs one). At most [`MAX_STEPS`].
    pub steps: usize,
    /// Learning rate: the peak of the schedule ([`TrainConfig::lr_schedule`]).
    pub lr: f64,
    /// Steps of linear learning-rate warm-up (`--lr-warmup`; 0: none; `None`: a tenth of
    /// `steps`, see [`TrainConfig::warmup_steps`]). A run shorter than its warm-up never
    /// reaches the peak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_warmup: Option<u64>,
    /// The learning rate after the warm-up (`--lr-decay`): constant, or a cosine down to
    /// `lr_min` at the last step.
    #[serde(with = "lr_decay_name", skip_serializing_if = "is_constant")]
    pub lr_decay: LrDecay,
    /// The cosine's floor (`--lr-min`; `None`: a tenth of `lr`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_min: Option<f64>,
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
    /// Data-parallel replicas of the whole pipeline (`--data-parallel`): a run has
    /// `ranks × data_parallel` workers; replica `d` trains on global micro-batches
    /// `d·micro_batches .. (d+1)·micro_batches` of every step (see `docs/distributed.md`).
    pub data_parallel: usize,
    /// Gradient bucket budget in MiB of uncompressed gradients (`--bucket-mb`).
    pub bucket_mb: f64,
    /// Start each stage's exchange during the pipeline, as soon as its gradients are final
    /// (`false`: `--no-overlap`, after the pipeline one stage's plain all-reduce after
    /// another).
    pub overlap: bool,
    /// The wire format of the gradient exchange after the warm-up (`--gradient-compression`).
    #[serde(with = "compression_name")]
    pub gradient_compression: Compression,
    /// Steps exchanged uncompressed before the compression starts (`--compression-warmup`;
    /// `None`: [`TrainConfig::compression_warmup_steps`]'s default, a share of the steps
    /// for 1-bit Adam, none otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression_warmup: Option<u64>,
    /// Under 1-bit Adam, exchange the momentum divided by Adam's frozen denominator
    /// (`true`: `--one-bit-preconditioned`, see
    /// [`Optimizer::with_preconditioned_momentum`]) instead of the raw momentum, as Tang et
    /// al. publish it (`false`, the default).
    #[serde(skip_serializing_if = "is_false")]
    pub one_bit_preconditioned: bool,
    /// Under 1-bit Adam, refresh AdamW's frozen variance on every step whose number is a
    /// multiple of this (`--variance-refresh`; 0: never, the variance frozen after the
    /// warm-up as Tang et al.'s 1-bit Adam; `None`: [`TrainConfig::variance_refresh_every`]'s
    /// default). See [`Optimizer::with_variance_refresh`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variance_refresh: Option<u64>,
    /// Keep what a lossy compression dropped and add it to the next step's gradient
    /// (`false`: `--no-error-feedback`).
    pub error_feedback: bool,
    /// Under MPI, exchange uncompressed gradients with MPI's own all-reduce (`false`:
    /// `--no-mpi-allreduce`, our point-to-point exchange, for comparison). Compressed
    /// gradients always take ours; a local run is always ours.
    #[serde(skip_serializing_if = "is_true")]
    pub mpi_allreduce: bool,
    /// The GPT's mixture-of-experts feed-forward (`--experts` and friends; `None`: dense).
    pub moe: Option<crate::moe::MoeSettings>,
    /// Blocks of each model stage, input to output (`--partition 3,2,2,1`; `None`: every
    /// stage holds `layers_per_stage`). The GPT only; see [`crate::partition`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<Vec<usize>>,
    /// For tests and demonstrations: one rank's compute made slower (`--slow-rank R:F`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_rank: Option<crate::rebalance::SlowRank>,
    /// Re-partition the stages while training when they drift apart
    /// (`--rebalance-stages`; `None`: the partition stays).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rebalance: Option<crate::rebalance::RebalanceSettings>,
}

impl TrainConfig {
    /// The default run: the GPT (d_model 64, 4 heads, 2 blocks per stage, sequences of 32
    /// bytes) learning the seeded Markov text, DualPipe on 4 ranks, 16 micro-batches of 8
    /// sequences, AdamW at lr 3e-3 after a linear warm-up over the first tenth of the steps,
    /// f32, seed 0, 300 steps (so a warm-up of 30), validation every 50, a 60 s receive timeout.
    pub const DEFAULT: TrainConfig = TrainConfig {
        model: ModelKind::Gpt,
        schedule: ScheduleKind::DualPipe,
        ranks: 4,
        micro_batches: 16,
        micro_batch_size: 8,
        virtual_stages: 1,
        hidden: 128,
        layers_per_stage: 2,
        d_model: 64,
        heads: 4,
        seq_len: 32,
        data: None,
        task: Task::Markov,
        validation_fraction: 0.1,
        eval_every: 50,
        shuffle: true,
        init_from: None,
        clip_grad: None,
        steps: 300,
        lr: 3e-3,
        lr_warmup: None,
        lr_decay: LrDecay::Constant,
        lr_min: None,
        optimizer: OptimizerKind::adamw(),
        dtype: DType::F32,
        seed: 0,
        recv_timeout: 60.0,
        data_parallel: 1,
        bucket_mb: 25.0,
        overlap: true,
        gradient_compression: Compression::None,
        compression_warmup: None,
        one_bit_preconditioned: false,
        variance_refresh: None,
        error_feedback: true,
        mpi_allreduce: true,
        moe: None,
        partition: None,
        slow_rank: None,
        rebalance: None,
    };

    /// The MLP's run (`--model mlp`, compared with DeepSeek's reference): DualPipe on 4 ranks,
    /// 4 stages of 2 blocks of width 128, 16 micro-batches of 64 rows, AdamW at a constant lr
    /// 1e-3, f32, seed 0, 600 steps (about 45 s on 2 cores in release).
    pub const MLP: TrainConfig = TrainConfig {
        model: ModelKind::Mlp,
        micro_batch_size: 64,
        steps: 600,
        lr: 1e-3,
        lr_warmup: Some(0),
        ..TrainConfig::DEFAULT
    };

    /// The defaults of `model`'s runs: [`TrainConfig::DEFAULT`] or [`TrainConfig::MLP`].
    pub const fn defaults_for(model: ModelKind) -> TrainConfig {
        match model {
            ModelKind::Gpt => TrainConfig::DEFAULT,
            ModelKind::Mlp => TrainConfig::MLP,
        }
    }
}

impl Default for TrainConfig {
    /// [`TrainConfig::DEFAULT`].
    fn default() -> Self {
        TrainConfig::DEFAULT
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

    /// The MLP's shape and seed.
    pub fn model(&self) -> ModelConfig {
        ModelConfig {
            seed: self.seed,
            hidden: self.hidden,
            layers_per_stage: self.layers_per_stage,
            stages: self.model_stages(),
            dtype: self.dtype.candle(),
        }
    }

    /// The schedule this configuration generates (`dualpipe_schedule::build` of its kind,
    /// ranks, micro-batches and virtual stages): lowered and validated.
    pub fn build_schedule(&self) -> Result<dualpipe_schedule::Schedule, crate::TrainError> {
        Ok(dualpipe_schedule::build(
            self.schedule,
            self.ranks,
            self.micro_batches,
            self.virtual_stages,
        )?)
    }

    /// The GPT's architecture: [`TrainConfig::blocks`] blocks.
    pub fn gpt(&self) -> GptConfig {
        GptConfig {
            d_model: self.d_model,
            heads: self.heads,
            layers: self.blocks(),
            seq_len: self.seq_len,
            dtype: self.dtype.candle(),
            moe: self.moe.map(|m| m.architecture(self.d_model)),
        }
    }

    /// Tokens (GPT) or rows (MLP) one step trains on (over every data-parallel replica).
    pub fn samples_per_step(&self) -> f64 {
        let rows = self.micro_batches as f64
            * self.micro_batch_size as f64
            * self.data_parallel.max(1) as f64;
        match self.model {
            ModelKind::Gpt => rows * self.seq_len as f64,
            ModelKind::Mlp => rows,
        }
    }

    /// The warm-up's length: `lr_warmup` when given, else a tenth of `steps` (rounded down;
    /// as Hugging Face's `warmup_ratio` 0.1); 0 when that is a single step, which is no
    /// warm-up at all.
    pub fn warmup_steps(&self) -> u64 {
        let n = self.lr_warmup.unwrap_or(self.steps as u64 / 10);
        if n <= 1 {
            0
        } else {
            n
        }
    }

    /// The learning rate of every step: `lr` after [`TrainConfig::warmup_steps`] linear
    /// steps, then constant
    /// or a cosine down to `lr_min` (a tenth of `lr` unless given) at step `steps`.
    pub fn lr_schedule(&self) -> LrSchedule {
        LrSchedule {
            peak: self.lr,
            warmup: self.warmup_steps(),
            decay: self.lr_decay,
            min: self.lr_min.unwrap_or(self.lr / 10.0),
            total: self.steps as u64,
        }
    }

    /// A fresh optimizer for one stage copy: the configured kind on
    /// [`TrainConfig::lr_schedule`], with 1-bit Adam's frozen variance when it applies.
    pub fn new_optimizer(&self) -> Optimizer {
        let opt = Optimizer::scheduled(self.optimizer, self.lr_schedule());
        match self.one_bit_adam_from() {
            Some(w) => opt
                .with_variance_frozen_from(w)
                .with_variance_refresh(self.variance_refresh_every())
                .with_preconditioned_momentum(self.one_bit_preconditioned),
            None => opt,
        }
    }

    /// Whether the compression is 1-bit Adam's when it starts: `--gradient-compression
    /// 1bit` under AdamW with more than one replica (whatever the warm-up).
    pub fn one_bit_adam(&self) -> bool {
        matches!(self.optimizer, OptimizerKind::AdamW { .. })
            && self.data_parallel > 1
            && self.gradient_compression == Compression::OneBit
    }

    /// The warm-up steps before the compression starts: `compression_warmup` when given;
    /// otherwise, for 1-bit Adam ([`TrainConfig::one_bit_adam`]), [`ONE_BIT_ADAM_WARMUP_SHARE`]
    /// of `steps` (rounded down, at least 1: AdamW's second moment needs a step before it can
    /// be frozen); 0 for every other compression. 1-bit Adam's warm-up exchanges the gradient
    /// in int8 (every other warm-up uncompressed), and its variance is refreshed after it
    /// ([`TrainConfig::variance_refresh_every`]), which is why its warm-up can be this short
    /// where DeepSpeed's, with the variance frozen for good, takes 15-25% of a run.
    pub fn compression_warmup_steps(&self) -> u64 {
        match self.compression_warmup {
            Some(w) => w,
            None if self.one_bit_adam() => {
                ((self.steps as f64 * ONE_BIT_ADAM_WARMUP_SHARE) as u64).max(1)
            }
            None => 0,
        }
    }

    /// 1-bit Adam's variance refresh period (0: none): `variance_refresh` when given, else
    /// `steps / `[`ONE_BIT_ADAM_REFRESHES`] (0 when that is below 2); 0 without 1-bit Adam.
    pub fn variance_refresh_every(&self) -> u64 {
        if self.one_bit_adam_from().is_none() {
            return 0;
        }
        match self.variance_refresh {
            Some(n) => n,
            None => match self.steps as u64 / ONE_BIT_ADAM_REFRESHES {
                n if n < 2 => 0,
                n => n,
            },
        }
    }

    /// The step from which training runs 1-bit Adam (`None`: it does not): with `--gradient-
    /// compression 1bit`, AdamW and more than one replica, the steps after the
    /// `--compression-warmup` exchange AdamW's momentum, not the gradient, and keep the second
    /// moment frozen ([`crate::Optimizer::with_variance_frozen_from`]).
    pub fn one_bit_adam_from(&self) -> Option<u64> {
        let warmup = self.compression_warmup_steps();
        (self.one_bit_adam() && warmup > 0).then_some(warmup)
    }

    /// The gradient exchange's settings for one stage's data-parallel group.
    pub fn exchange_config(&self) -> dualpipe_dp::ExchangeConfig {
        dualpipe_dp::ExchangeConfig {
            compression: self.gradient_compression,
            error_feedback: self.error_feedback,
            compression_warmup: self.compression_warmup_steps(),
            warmup_compression: if self.one_bit_adam_from().is_some() {
                Compression::Int8
            } else {
                Compression::None
            },
            refresh_every: self.variance_refresh_every(),
            bucket_bytes: (self.bucket_mb * (1u64 << 20) as f64).round().max(1.0) as usize,
            timeout: std::time::Duration::from_secs_f64(self.recv_timeout),
            ..dualpipe_dp::ExchangeConfig::default()
        }
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
    fn one_bit_adam_warms_up_in_int8_for_a_quarter_and_refreshes_every_seventh_of_the_run() {
        let one_bit = TrainConfig {
            data_parallel: 2,
            gradient_compression: Compression::OneBit,
            ..TrainConfig::default()
        };
        assert_eq!(one_bit.compression_warmup_steps(), 75);
        assert_eq!(one_bit.one_bit_adam_from(), Some(75));
        assert_eq!(one_bit.variance_refresh_every(), 42);
        let ex = one_bit.exchange_config();
        assert_eq!(ex.compression_warmup, 75);
        assert_eq!(ex.warmup_compression, Compression::Int8);
        assert_eq!(ex.refresh_every, 42);
        let int8_steps = (0..300)
            .filter(|&s| ex.compression_at(s) == Compression::Int8)
            .count();
        // Steps 1-75, then 84, 126, 168, 210, 252 and 294 (1-based).
        assert_eq!(int8_steps, 75 + 6, "the warm-up and six refreshes");
        assert!(!ex.feedback_at(83) && ex.feedback_at(84) && !ex.feedback_at(74));
        let frozen = TrainConfig {
            variance_refresh: Some(0),
            ..one_bit.clone()
        };
        assert_eq!(frozen.exchange_config().refresh_every, 0);
        let short = TrainConfig {
            steps: 3,
            ..one_bit.clone()
        };
        assert_eq!(short.one_bit_adam_from(), Some(1), "at least one step");
        // `--compression-warmup 0`: the gradient compressed from the first step, as before.
        let none = TrainConfig {
            compression_warmup: Some(0),
            ..one_bit.clone()
        };
        assert_eq!(none.one_bit_adam_from(), None);
        assert_eq!(none.exchange_config().compression_warmup, 0);
        let given = TrainConfig {
            compression_warmup: Some(120),
            ..one_bit.clone()
        };
        assert_eq!(given.one_bit_adam_from(), Some(120));
        // No default warm-up for int8 and bf16, SGD, or one replica.
        for other in [
            TrainConfig {
                gradient_compression: Compression::Int8,
                ..one_bit.clone()
            },
            TrainConfig {
                optimizer: OptimizerKind::sgd(),
                ..one_bit.clone()
            },
            TrainConfig {
                data_parallel: 1,
                ..one_bit.clone()
            },
        ] {
            assert_eq!(other.compression_warmup_steps(), 0);
            assert_eq!(other.one_bit_adam_from(), None);
        }
        // The resolved default is not written; a given warm-up is.
        let text = serde_json::to_string(&one_bit).unwrap();
        assert!(!text.contains("compression_warmup"), "{text}");
        let text = serde_json::to_string(&given).unwrap();
        assert!(text.contains("\"compression_warmup\":120"), "{text}");
        assert_eq!(serde_json::from_str::<TrainConfig>(&text).unwrap(), given);
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
    fn a_bad_recv_timeout_states_the_range_in_short_numbers() {
        for (timeout, shown) in [(1e300, "1e300"), (0.0, "0"), (-5.0, "-5"), (2e9, "2e9")] {
            let config = TrainConfig {
                recv_timeout: timeout,
                ..TrainConfig::default()
            };
            let err = config.check(Naming::Flags, 1).unwrap_err().to_string();
            assert!(
                err.contains(&format!("--recv-timeout {shown}: "))
                    && err.contains("less than 1e9 seconds"),
                "{err}"
            );
            assert!(err.len() < 200, "{err}");
        }
    }

    #[test]
    fn memory_is_checked_against_the_cap_and_the_machine() {
        // 68 GB of parameters: under the cap, over a machine with 16 GiB available.
        let wide = TrainConfig {
            hidden: 8192,
            layers_per_stage: 1,
            micro_batch_size: 1,
            micro_batches: 4,
            ..TrainConfig::MLP
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
            ..TrainConfig::MLP
        };
        let err = rows
            .check_memory(Naming::Flags, 1, Some(16 << 30))
            .unwrap_err()
            .to_string();
        assert!(err.contains("use a smaller --micro-batch-size"), "{err}");
        let many = TrainConfig {
            micro_batches: 1 << 40,
            micro_batch_size: 1,
            ..TrainConfig::MLP
        };
        let err = many
            .check_memory(Naming::Flags, 1, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("use fewer --micro-batches"), "{err}");
        let huge = TrainConfig {
            micro_batch_size: 100_000_000,
            ..TrainConfig::MLP
        };
        let err = huge.check_memory(Naming::Fields, 1, None).unwrap_err();
        assert!(err.to_string().contains("micro_batch_size"), "{err}");
    }

    #[test]
    fn steps_are_capped_and_the_mlp_default_is_six_hundred() {
        assert_eq!(TrainConfig::MLP.steps, 600);
        assert_eq!(TrainConfig::default().model, ModelKind::Gpt);
        let many = TrainConfig {
            steps: 1_000_000_000_000,
            ..TrainConfig::default()
        };
        let err = many.validate().unwrap_err().to_string();
        assert!(err.contains("steps 1000000000000"), "{err}");
    }
}
