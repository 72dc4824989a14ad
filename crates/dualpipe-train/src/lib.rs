//! Training as a library: the configuration, the one training step over every transport, the
//! run loop and its summary.
//!
//! - [`config`] — [`TrainConfig`] (serde; the one source of defaults, [`TrainConfig::DEFAULT`])
//!   and its one check, worded in field names or in flags ([`Naming`]);
//! - [`driver`] — the [`Driver`] trait that hides where the ranks run, and [`LocalThreads`]
//!   (every rank on a thread of this process);
//! - [`rank`](mod@rank) — [`OneRank`], one rank per process over an `Endpoint` (MPI), and
//!   [`RankTrainer`];
//! - [`workload`] — [`Workload`]: the model (the GPT by default, or the MLP), its data and
//!   its validation;
//! - [`strategy`] — [`DualPipeStrategy`]: a user's model (stages, or layers cut into stages)
//!   with an optimizer, a loss, compression, a schedule, data parallelism, checkpoints and a
//!   watch; one call per step with the user's batch (the design documents'
//!   `DualPipeStrategy(model, optimizer, loss_fn, compression, pipeline_stages)`);
//! - [`custom`](mod@custom) — [`custom::CustomWorkload`]: a user's model as the trainer's workload;
//! - [`data_parallel`] — data parallelism: below the trainer, [`ReplicaExchange`] (one
//!   replica's gradients averaged per stage over a bucketed, optionally compressed
//!   exchange); above it, [`LocalReplicas`] (`data_parallel` replicas of the pipeline on
//!   threads of this process);
//! - [`local`] — [`LocalRun`]: one pipeline or its data-parallel replicas, every rank on a
//!   thread of this process, behind one set of calls;
//! - [`collective`] — the whole-model operations across processes (gradient norm, weights);
//! - [`trainer`] — [`Trainer`], whose [`Trainer::step`] is the one step (data, pipeline,
//!   gradient sum of DualPipe's copies, optimizer; data parallelism, the experts and stage
//!   re-partitioning act at its fixed points, held in order, named nowhere in the step) and
//!   [`Trainer::run`] the run loop with its divergence check and progress callback;
//! - [`summary`] — [`RunSummary`], the predicted-vs-measured comparison (JSON and table);
//! - [`watch`] — the [`Watch`](watch::Watch) trait: what follows a run from outside the
//!   trainer (progress, metrics, log; `dualpipe_metrics::RunWatch` is one);
//! - [`reference`](mod@reference) — the sequential single-thread oracle every schedule must
//!   match;
//! - [`experts`] — the GPT's mixture of experts in training: its settings and the per-step
//!   expert load; `group` (MoE over the data-parallel group: the counts summed over
//!   replicas, expert parallelism's all-to-all dispatch and combine), `shards` (the routed
//!   experts each worker holds), `eplb` (EPLB in training: [`experts::eplb::ExpertRebalancer`]),
//!   `mpi` (feature `mpi`: the experts' all-to-alls over MPI);
//! - [`memory`] — the documented memory cap and this machine's available memory;
//! - [`checkpoint`] — checkpoints: written in the background, named by model layer, read
//!   back by any grid shape ([`Trainer::set_checkpoints`], [`Trainer::restore`]);
//! - [`job`] — [`job::JobConfig`] (the [`TrainConfig`] and the job's checkpoint, observe,
//!   outputs and transport sections) and [`job::Job::run`]: the whole job, local threads or
//!   (with `mpi`) one process under a launcher, resuming, writing checkpoints, watched, with
//!   its notes and failures in the words its caller asks for (no clap: the flags are the
//!   binary's);
//! - `process_grid` (feature `mpi`) — one worker per process under an MPI launcher: the grid's check
//!   and this process's trainer.
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

mod check;
pub mod checkpoint;
pub mod collective;
pub mod config;
pub mod custom;
pub mod data_parallel;
pub mod driver;
pub mod error;
pub mod experts;
pub mod job;
pub mod local;
pub mod loss_scale;
pub mod memory;
pub mod partition;
pub mod plan_file;
#[cfg(feature = "mpi")]
pub mod process_grid;
pub mod profile;
pub mod rank;
pub mod rebalance;
pub mod recompute;
pub mod reference;
pub mod stop;
pub mod strategy;
pub mod summary;
pub mod trainer;
pub mod watch;
pub mod workload;

pub use checkpoint::{Checkpoint, CheckpointError, CheckpointOptions, CheckpointWriter};
pub use config::{
    DType, DataSection, Field, ModelKind, ModelSection, Naming, OptimizerSection,
    ParallelismSection, ScheduleSection, Task, TrainConfig, TransportSection, MAX_STEPS,
    ONE_BIT_ADAM_STEPS_PER_WARMUP_STEP,
};
pub use data_parallel::{GroupLink, LocalReplicas, ReplicaExchange, ReplicaLinks, StepExchange};
pub use driver::{Driver, LocalThreads, Round, MAX_LOCAL_RANKS};
pub use dualpipe_dp::Compression;
pub use dualpipe_nn::{Optimizer, OptimizerKind, Recompute};
pub use error::{Divergence, TrainError};
pub use experts::{ExpertLoad, MoeSettings};
pub use local::LocalRun;
pub use memory::{MemoryEstimate, MEMORY_LIMIT_BYTES};
pub use rank::{OneRank, RankTrainer};
pub use reference::{Reference, ReferenceStep};
pub use stop::StopRequest;
pub use strategy::{DualPipeStrategy, Partition, StrategyBuilder};
pub use summary::{RunSummary, SummaryBuilder};
pub use trainer::{Restored, StepEvent, StepReport, Trainer};
pub use workload::{read_data, read_weights_file, MAX_DATA_BYTES};
pub use workload::{Evaluation, Sample, Workload};
