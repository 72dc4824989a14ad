//! The sections of a [`TrainConfig`](super::TrainConfig): the model, the pipeline schedule,
//! the parallelisms beside the pipeline, the optimizer, the data and the transport between
//! ranks. Each field's JSON name is the flat one of [`super::json`] (the section is not part
//! of it), so a configuration reads and writes as it always has.

use std::path::PathBuf;

use dualpipe_dp::Compression;
use dualpipe_nn::{LrDecay, OptimizerKind};
use dualpipe_schedule::ScheduleKind;

use super::choice::{DType, ModelKind, Task};
use crate::config::moe::MoeSettings;
use crate::config::rebalance::{RebalanceSettings, SlowRank};

/// The model: which one, its shape, its element type and where its weights start.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSection {
    /// The model (JSON `model`).
    pub kind: ModelKind,
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
    /// Element type of parameters and activations.
    pub dtype: DType,
    /// Start the GPT from these safetensors weights (their metadata fixes the architecture)
    /// instead of a seeded initialisation.
    pub init_from: Option<PathBuf>,
    /// The GPT's mixture-of-experts feed-forward (`None`: dense).
    pub moe: Option<MoeSettings>,
    /// Blocks of each model stage, input to output (`[3, 2, 2, 1]`; `None`: every stage
    /// holds `layers_per_stage`). The GPT only; see [`crate::parallel::stages::partition`].
    pub partition: Option<Vec<usize>>,
    /// What each model stage's forwards keep for the backward (JSON `recompute`, e.g.
    /// `"full"` or `"none,selective,full,none"`): `None`, none everywhere; one value, every
    /// stage; otherwise one per model stage. The GPT only; see [`crate::config::recompute`].
    pub recompute: Option<Vec<dualpipe_nn::Recompute>>,
    /// Under mixed precision, run the GPT's attention projections in the half format too, as
    /// PyTorch's autocast does (JSON `half_projections`; default false: they stay f32, which
    /// keeps the default task's validation loss within 0.1% of f32's, against +1.5% in bf16;
    /// docs/precision.md). See `dualpipe_nn::gpt::GptStage::set_half_projections`.
    pub half_projections: bool,
}

/// The pipeline: its schedule, its ranks and the micro-batches of a step.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleSection {
    /// The pipeline schedule (JSON `schedule`, its name, e.g. `"dualpipe"`).
    pub kind: ScheduleKind,
    /// Pipeline ranks (one thread each locally, one process each with a
    /// [`RankTrainer`](crate::RankTrainer)).
    pub ranks: usize,
    /// Micro-batches per step, over all directions.
    pub micro_batches: usize,
    /// Rows per micro-batch.
    pub micro_batch_size: usize,
    /// Stages per rank for `interleaved` (ignored by the other schedules).
    pub virtual_stages: usize,
}

impl ScheduleSection {
    /// A pipeline of `ranks` ranks running `kind` over `micro_batches` micro-batches of
    /// `micro_batch_size` rows, with the schedule's own number of virtual stages
    /// ([`ScheduleKind::default_virtual_stages`]).
    pub fn new(
        kind: ScheduleKind,
        ranks: usize,
        micro_batches: usize,
        micro_batch_size: usize,
    ) -> ScheduleSection {
        ScheduleSection {
            kind,
            ranks,
            micro_batches,
            micro_batch_size,
            virtual_stages: kind.default_virtual_stages(),
        }
    }
}

/// The parallelisms beside the pipeline: data-parallel replicas and their gradient exchange,
/// and stage re-partitioning.
#[derive(Clone, Debug, PartialEq)]
pub struct ParallelismSection {
    /// Data-parallel replicas of the whole pipeline: a run has `ranks × data_parallel`
    /// workers; replica `d` trains on global micro-batches
    /// `d·micro_batches .. (d+1)·micro_batches` of every step (see `docs/distributed.md`).
    pub data_parallel: usize,
    /// Gradient bucket budget in MiB of uncompressed gradients.
    pub bucket_mb: f64,
    /// Start each stage's exchange during the pipeline, as soon as its gradients are final
    /// (`false`: after the pipeline, one stage's plain all-reduce after another).
    pub overlap: bool,
    /// The wire format of the gradient exchange after the warm-up.
    pub gradient_compression: Compression,
    /// Steps exchanged uncompressed before the compression starts (`None`:
    /// [`TrainConfig::compression_warmup_steps`](super::TrainConfig::compression_warmup_steps)'s
    /// default, a share of the steps for 1-bit Adam, none otherwise).
    pub compression_warmup: Option<u64>,
    /// Under 1-bit Adam, exchange the momentum divided by Adam's frozen denominator (`true`,
    /// see [`Optimizer::with_preconditioned_momentum`](dualpipe_nn::Optimizer::with_preconditioned_momentum))
    /// instead of the raw momentum, as Tang et al. publish it (`false`, the default).
    pub one_bit_preconditioned: bool,
    /// Under 1-bit Adam, refresh AdamW's frozen variance on every step whose number is a
    /// multiple of this (0: never, the variance frozen after the warm-up as Tang et al.'s
    /// 1-bit Adam; `None`:
    /// [`TrainConfig::variance_refresh_every`](super::TrainConfig::variance_refresh_every)'s
    /// default). See [`Optimizer::with_variance_refresh`](dualpipe_nn::Optimizer::with_variance_refresh).
    pub variance_refresh: Option<u64>,
    /// Keep what a lossy compression dropped and add it to the next step's gradient.
    pub error_feedback: bool,
    /// Re-partition the stages while training when they drift apart (`None`: the partition
    /// stays).
    pub rebalance: Option<RebalanceSettings>,
    /// For tests and demonstrations: one rank's compute made slower.
    pub slow_rank: Option<SlowRank>,
}

/// The optimizer and its learning-rate schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerSection {
    /// The optimizer and its hyper-parameters (JSON `optimizer`).
    pub kind: OptimizerKind,
    /// Learning rate: the peak of the schedule
    /// ([`TrainConfig::lr_schedule`](super::TrainConfig::lr_schedule)).
    pub lr: f64,
    /// Steps of linear learning-rate warm-up (0: none; `None`: a tenth of the steps, see
    /// [`TrainConfig::warmup_steps`](super::TrainConfig::warmup_steps)). A run shorter than
    /// its warm-up never reaches the peak.
    pub lr_warmup: Option<u64>,
    /// The learning rate after the warm-up: constant, or a cosine down to `lr_min` at the
    /// last step.
    pub lr_decay: LrDecay,
    /// The cosine's floor (`None`: a tenth of `lr`).
    pub lr_min: Option<f64>,
    /// Scale the step's gradient down to this global L2 norm when it is larger (`None`: no
    /// clipping).
    pub clip_grad: Option<f64>,
}

/// The training data: where it comes from, what is held out, in which order it is read.
#[derive(Clone, Debug, PartialEq)]
pub struct DataSection {
    /// The GPT's training text (JSON `data`; any file: bytes are tokens); `None`: the
    /// synthetic `task`, generated in process.
    pub path: Option<PathBuf>,
    /// The synthetic text when `path` is `None`.
    pub task: Task,
    /// The share of the text, at its end, held out for validation (in `[0, 1)`).
    pub validation_fraction: f64,
    /// Evaluate on the validation text every this many steps (0: only after the last step).
    pub eval_every: usize,
    /// Draw training windows in a seeded random order (`false`: row `r` of micro-batch `m` of
    /// step `t` is window `((t-1)·micro_batches + m)·micro_batch_size + r`, modulo the windows).
    pub shuffle: bool,
}

/// How ranks and replicas talk to each other.
#[derive(Clone, Debug, PartialEq)]
pub struct TransportSection {
    /// Seconds a rank waits for a message from another rank (a neighbour's activation or
    /// gradient, locally or across processes) before the step fails naming both.
    pub recv_timeout: f64,
    /// Under MPI, exchange uncompressed gradients with MPI's own all-reduce (`false`: our
    /// point-to-point exchange, for comparison). Compressed gradients always take ours; a
    /// local run is always ours.
    pub mpi_allreduce: bool,
}
