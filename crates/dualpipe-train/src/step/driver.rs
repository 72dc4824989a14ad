//! How a step reaches the ranks: the [`Driver`] trait and its local backend, [`LocalThreads`]
//! (every rank on its own thread in this process). [`OneRank`](crate::OneRank) is the other
//! backend: this process is one rank of a world of processes.
//!
//! The step itself ([`Trainer::step`](crate::Trainer::step)) is written once, over this trait,
//! as candle's tensor code is written once over its storage backends: a feature added to the
//! step (data parallelism, MoE) works on every transport.

use dualpipe_nn::ModelStage;
use dualpipe_runtime::transport::wire::WireData;
use dualpipe_runtime::{
    run_step_with, sum_stage_copies, ExecOptions, RankStages, StepHook, StepOutcome,
};
use dualpipe_schedule::Schedule;

use crate::config::{Field, Naming, TrainConfig};
use crate::error::TrainError;

/// The most ranks [`LocalThreads`] runs in one process (one thread each); more ranks run one
/// process per rank ([`RankTrainer`](crate::RankTrainer), `dualpipe train --transport mpi`).
pub const MAX_LOCAL_RANKS: usize = 256;

/// Which of a step's collective gathers ([`Driver::all_gather`]) a message belongs to: every
/// process calls the same rounds of a step in the same order, and the round tells their
/// messages apart. The one list of them, so no two gathers share a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Round {
    /// The global gradient norm, for clipping ([`crate::step::collective::gradient_norm`]).
    GradNorm,
    /// The GPT's weights ([`crate::step::collective::gather_weights`]).
    Weights,
    /// The data-parallel exchange's figures after the last step.
    ExchangeTotals,
    /// The step's MoE router counts, summed over the pipeline's processes.
    RouterCounts,
    /// The step's rows served per MoE block (expert parallelism).
    ServedRows,
    /// EPLB's figures (rebalances, moves, bytes) after the last step.
    Rebalances,
    /// The step's whole-model expert load: the counts per block.
    ExpertLoads,
    /// The step's whole-model expert load: the rows per worker.
    WorkerRows,
    /// Whether any process was asked to stop before the step ([`Driver::agree_stop`]).
    Stop,
}

impl Round {
    /// The round's number on the wire (stable: 0 for [`Round::GradNorm`] up to 8).
    pub fn index(self) -> usize {
        match self {
            Round::GradNorm => 0,
            Round::Weights => 1,
            Round::ExchangeTotals => 2,
            Round::RouterCounts => 3,
            Round::ServedRows => 4,
            Round::Rebalances => 5,
            Round::ExpertLoads => 6,
            Round::WorkerRows => 7,
            Round::Stop => 8,
        }
    }
}

/// Where a step's pipeline runs and how its messages travel.
///
/// A driver holds the stages of [`Driver::held_ranks`] (all of them locally, one over a
/// world of processes); the trainer builds those, and calls the driver for the two parts of a
/// step that cross ranks: the pipeline itself and the sum of DualPipe's stage copies.
pub trait Driver: 'static {
    /// Checks that this driver can run `config` (e.g. the thread cap, the world's size),
    /// naming fields as `naming` says; called before anything is built.
    fn check(&self, config: &TrainConfig, naming: Naming) -> Result<(), TrainError>;

    /// The ranks whose stages this process builds and runs, in order.
    fn held_ranks(&self, schedule: &Schedule) -> Vec<usize>;

    /// Runs step `step` of `schedule` on the held ranks' `stages` (`stages[i]` belongs to
    /// `held_ranks[i]`), telling `hook` on each rank's thread when a stage's gradients are
    /// final (the data-parallel exchange starts there). Returns every micro-batch's loss (of
    /// the whole pipeline, on every process) and the measured timeline.
    fn run_pipeline(
        &mut self,
        schedule: &Schedule,
        stages: &mut [RankStages<ModelStage>],
        step: usize,
        options: &ExecOptions,
        hook: &dyn StepHook<ModelStage>,
    ) -> Result<StepOutcome, TrainError>;

    /// Sums the gradients of each stage's copies (DualPipe keeps two), so every copy holds
    /// the total and the copies take identical optimizer steps.
    fn sum_stage_copies(
        &mut self,
        schedule: &Schedule,
        stages: &mut [RankStages<ModelStage>],
        step: usize,
        options: &ExecOptions,
    ) -> Result<(), TrainError>;

    /// Every process's `data`, in process order (a single entry when one process holds every
    /// rank). `round` tells apart several gathers of one step; every process calls it with
    /// the same `step` and `round`.
    fn all_gather(
        &mut self,
        step: usize,
        round: Round,
        data: Vec<WireData>,
        options: &ExecOptions,
    ) -> Result<Vec<Vec<WireData>>, TrainError>;

    /// Whether every process of the run stops before step `step` (0-based): `asked` is this
    /// process's own stop request (the signal that asked), the answer the same on every
    /// process (the first process's signal among those asked), so all stop at one boundary
    /// and write one checkpoint. Every process calls it before every step once any does
    /// (the job sets a stop request on each). One process holds every rank here: `asked`.
    fn agree_stop(
        &mut self,
        _step: usize,
        asked: Option<i32>,
        _options: &ExecOptions,
    ) -> Result<Option<i32>, TrainError> {
        Ok(asked)
    }

    /// Whether this process reports the run (evaluates, prints the summary, writes files):
    /// a local run, or rank 0 of a world of processes.
    fn reports(&self) -> bool {
        true
    }

    /// Tells the other ranks, if they live elsewhere, that this one failed with `message`.
    fn fail(&mut self, _message: &str) {}

    /// Lines up with the other ranks after `steps_done` steps, so no process leaves while
    /// another may still need it.
    fn finish(&mut self, _steps_done: usize, _options: &ExecOptions) -> Result<(), TrainError> {
        Ok(())
    }
}

/// Every rank on its own thread of this process, messages over in-process channels (the
/// runtime's [`run_step_with`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalThreads;

impl Driver for LocalThreads {
    fn check(&self, config: &TrainConfig, naming: Naming) -> Result<(), TrainError> {
        if config.schedule.ranks > MAX_LOCAL_RANKS {
            return Err(TrainError::Config(format!(
                "{} {}: one process runs at most {MAX_LOCAL_RANKS} ranks (a thread each); run \
                 one process per rank instead ({} mpi, under mpirun)",
                Field::Ranks.name(naming),
                config.schedule.ranks,
                Field::Transport.name(naming)
            )));
        }
        let workers = config
            .schedule
            .ranks
            .saturating_mul(config.parallelism.data_parallel);
        if workers > MAX_LOCAL_RANKS {
            return Err(TrainError::Config(format!(
                "{} {} x {} {} is {workers} workers: one process runs at most \
                 {MAX_LOCAL_RANKS} (a thread each); use fewer replicas or ranks",
                Field::Ranks.name(naming),
                config.schedule.ranks,
                Field::DataParallel.name(naming),
                config.parallelism.data_parallel
            )));
        }
        Ok(())
    }

    fn held_ranks(&self, schedule: &Schedule) -> Vec<usize> {
        (0..schedule.ranks).collect()
    }

    fn run_pipeline(
        &mut self,
        schedule: &Schedule,
        stages: &mut [RankStages<ModelStage>],
        _step: usize,
        options: &ExecOptions,
        hook: &dyn StepHook<ModelStage>,
    ) -> Result<StepOutcome, TrainError> {
        Ok(run_step_with(schedule, stages, options, hook)?)
    }

    fn sum_stage_copies(
        &mut self,
        schedule: &Schedule,
        stages: &mut [RankStages<ModelStage>],
        _step: usize,
        _options: &ExecOptions,
    ) -> Result<(), TrainError> {
        Ok(sum_stage_copies(&schedule.placement, stages)?)
    }

    fn all_gather(
        &mut self,
        _step: usize,
        _round: Round,
        data: Vec<WireData>,
        _options: &ExecOptions,
    ) -> Result<Vec<Vec<WireData>>, TrainError> {
        Ok(vec![data])
    }
}
