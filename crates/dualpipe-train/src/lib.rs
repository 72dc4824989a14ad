//! Training as a library: the configuration, the one training step over every transport, its
//! parallelisms, checkpoints, the run loop and its summary.
//!
//! The crate has a few rooms, in floors: a module uses only the floors below it, with one room
//! that spans them, [`checkpoint`] (its files and their format sit below the step, and the
//! trainer's save and restore above the parallelisms), and [`error`], whose [`TrainError`]
//! wraps a checkpoint's errors too.
//!
//! 1. [`error`] — [`TrainError`];
//! 2. [`config`] — [`TrainConfig`] (serde; the one source of defaults, [`TrainConfig::DEFAULT`];
//!    sections: model, schedule, parallelism, optimizer, data, transport, with the experts' and
//!    re-balancing settings) and its one check, the memory estimate and the recompute setting;
//! 3. [`model`] — [`Workload`]: the model (the GPT by default, or the MLP), its data and its
//!    validation, or a user's model ([`model::custom`]);
//! 4. [`summary`] — what a step and a run report: [`StepReport`], [`RunSummary`] (the
//!    predicted-vs-measured comparison, JSON and table) and the parallelisms' figures in them;
//! 5. [`step`] — [`Trainer`], whose [`Trainer::step`] is the one step (data, pipeline, gradient
//!    sum of DualPipe's copies, optimizer) and [`Trainer::run`] the run loop; the public
//!    [`Parallelism`] trait through which every feature acts at the step's fixed points, on a
//!    [`StepView`] of the step; the [`Driver`] that hides where the ranks run
//!    ([`LocalThreads`], or [`OneRank`] over an `Endpoint`); the collectives, the loss scale,
//!    the stop request and the sequential [`Reference`] every schedule must match;
//! 6. [`parallel`] — the features, one folder each: [`parallel::data`] (data parallelism:
//!    [`ReplicaExchange`] and [`LocalReplicas`]), [`parallel::experts`] (the GPT's mixture of
//!    experts: its group, shards and EPLB re-placement), [`parallel::stages`] (the stage
//!    partition, its profile, re-partitioning); and [`TrainerBuilder`], the one way a trainer
//!    is built with the parallelisms its configuration asks for;
//! 7. [`checkpoint`] — checkpoints: written in the background, named by model layer, read back
//!    by any grid shape ([`Trainer::set_checkpoints`], [`Trainer::restore`]), and a job's resume;
//! 8. [`job`] — [`job::JobConfig`] and [`job::Job::run`]: the whole job, local threads
//!    ([`LocalRun`]) or (with `mpi`) one process under a launcher, resuming, writing
//!    checkpoints, watched ([`job::watch::Watch`]), its plan file; no clap (the flags are the
//!    binary's);
//! 9. [`strategy`] — [`DualPipeStrategy`]: a user's model (stages, or layers cut into stages)
//!    with an optimizer, a loss, compression, a schedule, data parallelism, checkpoints and a
//!    watch; one call per step with the user's batch (the design documents'
//!    `DualPipeStrategy(model, optimizer, loss_fn, compression, pipeline_stages)`).
//!
//! A feature of one's own is a [`Parallelism`] added with [`TrainerBuilder::parallelism`]
//! (`examples/gradient_noise.rs`).
//!
//! ```
//! use dualpipe_train::{DType, ModelKind, ModelSection, ScheduleSection, TrainConfig, Trainer};
//! # fn main() -> Result<(), dualpipe_train::TrainError> {
//! let config = TrainConfig {
//!     model: ModelSection {
//!         kind: ModelKind::Mlp,
//!         hidden: 8,
//!         layers_per_stage: 1,
//!         dtype: DType::F64,
//!         ..TrainConfig::MLP.model
//!     },
//!     schedule: ScheduleSection {
//!         ranks: 2,
//!         micro_batches: 4,
//!         micro_batch_size: 4,
//!         ..TrainConfig::MLP.schedule
//!     },
//!     steps: 3,
//!     ..TrainConfig::default()
//! };
//! let summary = Trainer::new(config)?.run(|_event| Ok(()))?;
//! assert_eq!(summary.losses.len(), 3);
//! print!("{}", summary.table(true));
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod job;
pub mod model;
pub mod parallel;
pub mod step;
pub mod strategy;
pub mod summary;

pub use checkpoint::Restored;
pub use checkpoint::{Checkpoint, CheckpointError, CheckpointOptions, CheckpointWriter};
pub use config::memory::{MemoryEstimate, MEMORY_LIMIT_BYTES};
pub use config::{
    DType, DataSection, Field, ModelKind, ModelSection, Naming, OptimizerSection,
    ParallelismSection, ScheduleSection, Task, TrainConfig, TransportSection, MAX_STEPS,
    ONE_BIT_ADAM_STEPS_PER_WARMUP_STEP,
};
pub use dualpipe_dp::Compression;
pub use dualpipe_nn::{Optimizer, OptimizerKind, Recompute};
pub use error::{Divergence, TrainError};
pub use job::local_run::LocalRun;
pub use model::{read_data, read_weights_file, MAX_DATA_BYTES};
pub use model::{Evaluation, Sample, Workload};
pub use parallel::builder::TrainerBuilder;
pub use parallel::data::{GroupLink, LocalReplicas, ReplicaExchange, ReplicaLinks, StepExchange};
pub use parallel::experts::{ExpertLoad, MoeSettings};
pub use step::driver::{Driver, LocalThreads, Round, MAX_LOCAL_RANKS};
pub use step::rank::{OneRank, RankTrainer};
pub use step::reference::{Reference, ReferenceStep};
pub use step::stop::StopRequest;
pub use step::{Parallelism, StageRead, StepEvent, StepReport, StepState, StepView, Trainer};
pub use strategy::{DualPipeStrategy, Partition, StrategyBuilder};
pub use summary::{RunSummary, SummaryBuilder};
