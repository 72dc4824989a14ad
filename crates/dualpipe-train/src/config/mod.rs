//! [`TrainConfig`]: everything a run depends on, in sections (the model, the schedule, the
//! parallelisms, the optimizer, the data, the transport), the one place its defaults live, and
//! the one check of its sizes ([`TrainConfig::check`]).
//!
//! - [`sections`](self#structs) — [`ModelSection`], [`ScheduleSection`],
//!   [`ParallelismSection`], [`OptimizerSection`], [`DataSection`], [`TransportSection`];
//! - `json` — the flat JSON form, unchanged since the configuration had no sections;
//! - `choice` — [`DType`], [`ModelKind`], [`Task`];
//! - `field` — [`Field`] and [`Naming`]: how the one check names a field.

use dualpipe_dp::Compression;
use dualpipe_nn::gpt::GptConfig;
use dualpipe_nn::{LrDecay, LrSchedule, ModelConfig, Optimizer, OptimizerKind};
use dualpipe_schedule::ScheduleKind;
use serde::{Deserialize, Serialize};

pub(crate) mod check;
mod choice;
mod field;
mod json;
pub mod memory;
pub mod moe;
pub mod rebalance;
pub mod recompute;
mod sections;
mod serde_repr;

pub use choice::{DType, ModelKind, Task};
pub use field::{Field, Naming};
pub use sections::{
    DataSection, ModelSection, OptimizerSection, ParallelismSection, ScheduleSection,
    TransportSection,
};

/// The most steps one run may ask for: the run keeps every step's loss for its summary (8 bytes
/// a step, so 8 GB at the cap), and nothing near it finishes in a lifetime anyway.
pub const MAX_STEPS: usize = 1_000_000_000;

/// 1-bit Adam's default warm-up (when [`ParallelismSection::compression_warmup`] is `None`)
/// is one step in this many, rounded up: 2% of the steps (6 of 300),
/// exchanged in int8, and followed by variance refreshes at twice the warm-up and then
/// doubling ([`TrainConfig::variance_refresh_doubling`]: steps 12, 24, 48, 96 and 192 of 300),
/// so 11 of 300 steps are int8 and the run sends 96% fewer bytes than uncompressed. Far below
/// DeepSpeed's 15-25% (a variance frozen for good after the warm-up); the refreshes that
/// double are 0/1 Adam's idea. See docs/distributed.md for the runs behind it.
pub const ONE_BIT_ADAM_STEPS_PER_WARMUP_STEP: u64 = 50;

/// Everything a training run depends on, in sections. The model and the data depend only on
/// the model section, `seed`, [`TrainConfig::model_stages`], `micro_batches`,
/// `micro_batch_size` and the data section — never on the schedule or the rank count — so
/// e.g. DualPipe on 4 ranks, 1F1B on 4 ranks and DualPipeV on 2 ranks (4 stages each) train
/// the same model on the same batches.
///
/// [`TrainConfig::DEFAULT`] (the GPT) and [`TrainConfig::MLP`] are the one source of
/// defaults ([`TrainConfig::defaults_for`]): the CLI's flags take theirs from them. As JSON it
/// is one flat object (`{"model": "gpt", "ranks": 4, ...}`, the sections not named); missing
/// members take [`TrainConfig::DEFAULT`]'s. [`TrainConfig::check`] is its one check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "json::Flat", into = "json::Flat")]
pub struct TrainConfig {
    /// The model: kind, shape, element type, initial weights, experts, partition.
    pub model: ModelSection,
    /// The pipeline: schedule kind, ranks, micro-batches.
    pub schedule: ScheduleSection,
    /// Data-parallel replicas and their gradient exchange; stage re-partitioning.
    pub parallelism: ParallelismSection,
    /// The optimizer and its learning-rate schedule.
    pub optimizer: OptimizerSection,
    /// The training and validation data.
    pub data: DataSection,
    /// How ranks talk: receive timeout, MPI's all-reduce.
    pub transport: TransportSection,
    /// Training steps of a run ([`Trainer::run`](crate::Trainer::run) runs them;
    /// [`Trainer::step`](crate::Trainer::step) runs one). At most [`MAX_STEPS`]; the
    /// learning-rate schedule and 1-bit Adam's warm-up are shares of it.
    pub steps: usize,
    /// Seed of the model, the teacher and the data.
    pub seed: u64,
}

impl TrainConfig {
    /// The default run: the GPT (d_model 64, 4 heads, 2 blocks per stage, sequences of 32
    /// bytes) learning the seeded Markov text, DualPipe on 4 ranks, 16 micro-batches of 8
    /// sequences, AdamW at lr 3e-3 after a linear warm-up over the first tenth of the steps,
    /// f32, seed 0, 300 steps (so a warm-up of 30), validation every 50, a 60 s receive timeout.
    pub const DEFAULT: TrainConfig = TrainConfig {
        model: ModelSection {
            kind: ModelKind::Gpt,
            hidden: 128,
            layers_per_stage: 2,
            d_model: 64,
            heads: 4,
            seq_len: 32,
            dtype: DType::F32,
            init_from: None,
            moe: None,
            partition: None,
            recompute: None,
            half_projections: false,
        },
        schedule: ScheduleSection {
            kind: ScheduleKind::DualPipe,
            ranks: 4,
            micro_batches: 16,
            micro_batch_size: 8,
            virtual_stages: 1,
        },
        parallelism: ParallelismSection {
            data_parallel: 1,
            bucket_mb: 25.0,
            overlap: true,
            gradient_compression: Compression::None,
            compression_warmup: None,
            one_bit_preconditioned: false,
            variance_refresh: None,
            error_feedback: true,
            rebalance: None,
            slow_rank: None,
        },
        optimizer: OptimizerSection {
            kind: OptimizerKind::adamw(),
            lr: 3e-3,
            lr_warmup: None,
            lr_decay: LrDecay::Constant,
            lr_min: None,
            clip_grad: None,
        },
        data: DataSection {
            path: None,
            task: Task::Markov,
            validation_fraction: 0.1,
            eval_every: 50,
            shuffle: true,
        },
        transport: TransportSection {
            recv_timeout: 60.0,
            mpi_allreduce: true,
        },
        steps: 300,
        seed: 0,
    };

    /// The MLP's run (`model.kind` [`ModelKind::Mlp`], compared with DeepSeek's reference):
    /// DualPipe on 4 ranks, 4 stages of 2 blocks of width 128, 16 micro-batches of 64 rows,
    /// AdamW at a constant lr 1e-3, f32, seed 0, 600 steps (about 45 s on 2 cores in release).
    pub const MLP: TrainConfig = TrainConfig {
        model: ModelSection {
            kind: ModelKind::Mlp,
            ..TrainConfig::DEFAULT.model
        },
        schedule: ScheduleSection {
            micro_batch_size: 64,
            ..TrainConfig::DEFAULT.schedule
        },
        optimizer: OptimizerSection {
            lr: 1e-3,
            lr_warmup: Some(0),
            ..TrainConfig::DEFAULT.optimizer
        },
        steps: 600,
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
        match self.schedule.kind {
            ScheduleKind::DualPipeV => self.schedule.ranks.saturating_mul(2),
            ScheduleKind::Interleaved => self
                .schedule
                .ranks
                .saturating_mul(self.schedule.virtual_stages),
            _ => self.schedule.ranks,
        }
    }

    /// The MLP's shape and seed.
    pub fn mlp(&self) -> ModelConfig {
        ModelConfig {
            seed: self.seed,
            hidden: self.model.hidden,
            layers_per_stage: self.model.layers_per_stage,
            stages: self.model_stages(),
            dtype: self.model.dtype.candle(),
        }
    }

    /// The schedule this configuration generates (`dualpipe_schedule::build` of its kind,
    /// ranks, micro-batches and virtual stages): lowered and validated.
    pub fn build_schedule(&self) -> Result<dualpipe_schedule::Schedule, crate::TrainError> {
        Ok(dualpipe_schedule::build(
            self.schedule.kind,
            self.schedule.ranks,
            self.schedule.micro_batches,
            self.schedule.virtual_stages,
        )?)
    }

    /// The GPT's architecture: [`TrainConfig::blocks`] blocks.
    pub fn gpt(&self) -> GptConfig {
        GptConfig {
            d_model: self.model.d_model,
            heads: self.model.heads,
            layers: self.blocks(),
            seq_len: self.model.seq_len,
            dtype: self.model.dtype.candle(),
            moe: self.model.moe.map(|m| m.architecture(self.model.d_model)),
        }
    }

    /// Tokens (GPT) or rows (MLP) one step trains on (over every data-parallel replica).
    pub fn samples_per_step(&self) -> f64 {
        let rows = self.schedule.micro_batches as f64
            * self.schedule.micro_batch_size as f64
            * self.parallelism.data_parallel.max(1) as f64;
        match self.model.kind {
            ModelKind::Gpt => rows * self.model.seq_len as f64,
            ModelKind::Mlp => rows,
        }
    }

    /// The warm-up's length: `lr_warmup` when given, else a tenth of `steps` (rounded down;
    /// as Hugging Face's `warmup_ratio` 0.1); 0 when that is a single step, which is no
    /// warm-up at all.
    pub fn warmup_steps(&self) -> u64 {
        let n = self.optimizer.lr_warmup.unwrap_or(self.steps as u64 / 10);
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
            peak: self.optimizer.lr,
            warmup: self.warmup_steps(),
            decay: self.optimizer.lr_decay,
            min: self.optimizer.lr_min.unwrap_or(self.optimizer.lr / 10.0),
            total: self.steps as u64,
        }
    }

    /// A fresh optimizer for one stage copy: the configured kind on
    /// [`TrainConfig::lr_schedule`], with 1-bit Adam's frozen variance when it applies.
    pub fn new_optimizer(&self) -> Optimizer {
        let opt = Optimizer::scheduled(self.optimizer.kind, self.lr_schedule());
        match self.one_bit_adam_from() {
            Some(w) => opt
                .with_variance_frozen_from(w)
                .with_variance_refresh(self.variance_refresh_every())
                .with_variance_refresh_doubling(self.variance_refresh_doubling())
                .with_preconditioned_momentum(self.parallelism.one_bit_preconditioned),
            None => opt,
        }
    }

    /// Whether the compression is 1-bit Adam's when it starts: `--gradient-compression
    /// 1bit` under AdamW with more than one replica (whatever the warm-up).
    pub fn one_bit_adam(&self) -> bool {
        matches!(self.optimizer.kind, OptimizerKind::AdamW { .. })
            && self.parallelism.data_parallel > 1
            && self.parallelism.gradient_compression == Compression::OneBit
    }

    /// The warm-up steps before the compression starts: `compression_warmup` when given;
    /// otherwise, for 1-bit Adam ([`TrainConfig::one_bit_adam`]), one step in
    /// [`ONE_BIT_ADAM_STEPS_PER_WARMUP_STEP`] (rounded up, at least 1: AdamW's second moment
    /// needs a step before it can be frozen); 0 for every other compression. 1-bit Adam's
    /// warm-up exchanges the gradient in int8 (every other warm-up uncompressed), and its
    /// variance is refreshed after it at steps that double
    /// ([`TrainConfig::variance_refresh_doubling`]), which is why its warm-up can be this
    /// short where DeepSpeed's, with the variance frozen for good, takes 15-25% of a run.
    pub fn compression_warmup_steps(&self) -> u64 {
        match self.parallelism.compression_warmup {
            Some(w) => w,
            None if self.one_bit_adam() => (self.steps as u64)
                .div_ceil(ONE_BIT_ADAM_STEPS_PER_WARMUP_STEP)
                .max(1),
            None => 0,
        }
    }

    /// 1-bit Adam's variance refresh period (0: none): `variance_refresh` when given (every
    /// multiple of it refreshes), else twice the warm-up, the first of the refresh steps that
    /// double ([`TrainConfig::variance_refresh_doubling`]); 0 without 1-bit Adam.
    pub fn variance_refresh_every(&self) -> u64 {
        match self.one_bit_adam_from() {
            None => 0,
            Some(w) => self.parallelism.variance_refresh.unwrap_or(2 * w),
        }
    }

    /// Whether 1-bit Adam's refresh steps double (`k`, `2k`, `4k`, ... for
    /// `k = `[`TrainConfig::variance_refresh_every`]): the default, when `variance_refresh`
    /// is not given.
    pub fn variance_refresh_doubling(&self) -> bool {
        self.one_bit_adam_from().is_some() && self.parallelism.variance_refresh.is_none()
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
        // Under mixed precision an uncompressed exchange carries the gradients in bf16 (f32's
        // range: no loss scale needed on the wire, also for f16 runs).
        let half_wire = |c: Compression| match (c, self.model.dtype.half()) {
            (Compression::None, Some(_)) => Compression::Bf16,
            (c, _) => c,
        };
        let compression = half_wire(self.parallelism.gradient_compression);
        dualpipe_dp::ExchangeConfig {
            compression,
            // The bf16 wire of mixed precision has no error feedback (as a bf16 all-reduce):
            // an f16 step skipped on overflow leaves nothing behind.
            error_feedback: self.parallelism.error_feedback
                && compression == self.parallelism.gradient_compression,
            compression_warmup: self.compression_warmup_steps(),
            warmup_compression: if self.one_bit_adam_from().is_some() {
                Compression::Int8
            } else {
                half_wire(Compression::None)
            },
            refresh_every: self.variance_refresh_every(),
            refresh_doubling: self.variance_refresh_doubling(),
            bucket_bytes: (self.parallelism.bucket_mb * (1u64 << 20) as f64)
                .round()
                .max(1.0) as usize,
            timeout: std::time::Duration::from_secs_f64(self.transport.recv_timeout),
            ..dualpipe_dp::ExchangeConfig::default()
        }
    }
}

#[cfg(test)]
mod tests;
