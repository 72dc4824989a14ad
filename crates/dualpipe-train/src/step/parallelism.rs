//! [`Parallelism`]: what a feature of the training step does at the step's fixed points, so
//! that [`Trainer::step`](crate::Trainer::step) and [`Trainer::run`](crate::Trainer::run) name no
//! feature.
//!
//! A trainer holds its parallelisms in order (the crate's own: data parallelism, then the MoE
//! experts, then stage re-partitioning; then a user's, added with
//! [`TrainerBuilder::parallelism`](crate::TrainerBuilder::parallelism)), and calls each of
//! them, in that order, at every point of a step:
//!
//! 1. [`Parallelism::check_ready`] before the step;
//! 2. [`Parallelism::pipeline_hook`]: a hook the executor calls on the ranks' threads during
//!    the pipeline (the data-parallel exchange starts its buckets there);
//! 3. after the pipeline's backward, DualPipe's stage copies are summed unless a parallelism
//!    [sums them itself](Parallelism::sums_copies); then [`Parallelism::after_backward`]
//!    (the gradients exchanged);
//! 4. before the optimizer, [`Parallelism::sharded_squares`] for the gradient norm of a
//!    clipping run;
//! 5. [`Parallelism::after_optimizer`] (the experts' balance and re-placement);
//! 6. in the run loop, after a finished step that is not the last,
//!    [`Parallelism::after_step`] (stage re-partitioning), and after the last step
//!    [`Parallelism::end_run`] (the run's figures into the summary);
//! 7. when the weights are gathered, [`Parallelism::gather_shards`]; on checkpoint
//!    [`Parallelism::checkpoint_tensors`], and on restore [`Parallelism::restore_placement`]
//!    (before the parameters) and [`Parallelism::restore_state`] (after them).
//!
//! Each call gets a view of the step ([`StepView`], or [`StageRead`] where it only reads),
//! never the trainer: the stages this process holds (their parameters and gradients), their
//! optimizers, the step's counters and the driver (the transport between the ranks).

use dualpipe_nn::gpt::GptWeights;
use dualpipe_nn::{ModelStage, Optimizer};
use dualpipe_runtime::{ExecOptions, RankStages, StageError, StepHook};
use dualpipe_schedule::Schedule;

use super::StepReport;
use crate::checkpoint::{Checkpoint, HostTensor, Restored};
use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::model::Workload;
use crate::step::driver::Driver;
use crate::summary::experts::ExpertLoad;
use crate::summary::{RunSummary, StepExchange};

/// What a step has produced so far, handed from one point of the step to the next.
#[derive(Debug)]
pub struct StepState {
    /// The step's index.
    pub step: usize,
    /// The micro-batch losses (this replica's, or every replica's once gathered).
    pub losses: Vec<f64>,
    /// Whether DualPipe's stage copies were summed after the pipeline (no parallelism sums
    /// them itself).
    pub copies_summed: bool,
    /// What the data-parallel exchange cost this replica.
    pub exchange: Option<StepExchange>,
    /// The MoE router's load of the step.
    pub expert_load: Option<ExpertLoad>,
}

/// What a parallelism reads of the step: the configuration, the schedule, the model, which
/// ranks and replica this process holds, the steps done and the stage copies.
#[derive(Clone, Copy, Debug)]
pub struct StageRead<'a> {
    /// The run's configuration.
    pub config: &'a TrainConfig,
    /// The lowered schedule every step runs.
    pub schedule: &'a Schedule,
    /// What the run trains.
    pub workload: &'a Workload,
    /// The ranks this process holds, in the order of `stages`.
    pub held: &'a [usize],
    /// This trainer's data-parallel replica (0 for a single replica).
    pub replica: usize,
    /// Steps done so far (the step running now, during a step).
    pub steps_done: usize,
    /// The stage copies of every held rank.
    pub stages: &'a [RankStages<ModelStage>],
}

/// A view of the step for a parallelism: what [`StageRead`] reads, with the stage copies
/// (their parameters and gradients) and their optimizers to change, and the driver with its
/// options, the transport a collective call of the parallelism uses.
#[derive(Debug)]
pub struct StepView<'a, D: Driver> {
    /// The run's configuration.
    pub config: &'a TrainConfig,
    /// The lowered schedule every step runs.
    pub schedule: &'a Schedule,
    /// What the run trains.
    pub workload: &'a Workload,
    /// The ranks this process holds, in the order of `stages`.
    pub held: &'a [usize],
    /// This trainer's data-parallel replica (0 for a single replica).
    pub replica: usize,
    /// Steps done so far (the step running now, during a step).
    pub steps_done: usize,
    /// The stage copies of every held rank: `stages[i]` keyed by (dir, stage).
    pub stages: &'a mut Vec<RankStages<ModelStage>>,
    /// `optimizers[i][j]` updates the `j`-th copy of `stages[i]` in (dir, stage) order.
    pub optimizers: &'a mut Vec<Vec<Optimizer>>,
    /// Where the ranks run, and the transport between them.
    pub driver: &'a mut D,
    /// The executor's options (the receive timeout of a collective call).
    pub exec_options: &'a ExecOptions,
    /// Set by a parallelism that rebuilt the stages on another configuration (a new
    /// partition): the trainer takes it once this point's calls are done.
    pub reconfigured: Option<TrainConfig>,
}

impl<D: Driver> StepView<'_, D> {
    /// What the view reads.
    pub fn read(&self) -> StageRead<'_> {
        StageRead {
            config: self.config,
            schedule: self.schedule,
            workload: self.workload,
            held: self.held,
            replica: self.replica,
            steps_done: self.steps_done,
            stages: self.stages,
        }
    }

    /// Passes `result` on; a failure of this process's own work is first told to the other
    /// ranks (naming this process's first rank and the step).
    pub fn own<T>(&mut self, step: usize, result: Result<T, TrainError>) -> Result<T, TrainError> {
        result.inspect_err(|err| {
            let held = self.held.first().copied().unwrap_or(0);
            self.driver
                .fail(&format!("rank {held}: step {}: {err}", step + 1));
        })
    }

    /// Every held stage copy with its optimizer.
    pub fn copies_mut(&mut self) -> impl Iterator<Item = (&mut ModelStage, &mut Optimizer)> + '_ {
        self.stages
            .iter_mut()
            .zip(self.optimizers.iter_mut())
            .flat_map(|(rank, opts)| rank.iter_mut().map(|(_, s)| s).zip(opts.iter_mut()))
    }
}

/// A feature of the step (data parallelism, the MoE experts with their group and EPLB
/// re-placement, stage re-partitioning, or a user's) at the step's fixed points; see the
/// [module](self) documentation for the order of the calls. Every point does nothing by
/// default.
pub trait Parallelism<D: Driver>: std::any::Any + std::fmt::Debug + Send {
    /// Refuses a step the parallelism is not ready for (nothing has run yet).
    fn check_ready(&self, _read: &StageRead<'_>) -> Result<(), TrainError> {
        Ok(())
    }

    /// The executor hook of step `step`, called on the ranks' threads during the pipeline.
    fn pipeline_hook(&self, _step: usize) -> Option<Box<dyn StepHook<ModelStage>>> {
        None
    }

    /// Whether this parallelism sums DualPipe's stage copies itself (the step then does not).
    fn sums_copies(&self) -> bool {
        false
    }

    /// After the pipeline (and the sum of the stage copies): e.g. the gradient exchange.
    fn after_backward(
        &mut self,
        _view: &mut StepView<'_, D>,
        _state: &mut StepState,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// Before the optimizer of a run that clips: this process's sum of squares of the
    /// gradients its stages hold only a share of (`None`: it holds no such share). A
    /// collective call when it is one.
    fn sharded_squares(
        &mut self,
        _view: &mut StepView<'_, D>,
        _step: usize,
    ) -> Result<Option<f64>, TrainError> {
        Ok(None)
    }

    /// After the optimizer's step.
    fn after_optimizer(
        &mut self,
        _view: &mut StepView<'_, D>,
        _state: &mut StepState,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// [`Trainer::run`](crate::Trainer::run) starts.
    fn begin_run(&mut self) {}

    /// In [`Trainer::run`](crate::Trainer::run), after a finished step that is not the run's
    /// last (its evaluation and checkpoint done).
    fn after_step(
        &mut self,
        _view: &mut StepView<'_, D>,
        _report: &StepReport,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// After the run's last step (a collective call when it is one): the run's figures into
    /// `summary`; `seconds` is the run's wall-clock time.
    fn end_run(
        &mut self,
        _view: &mut StepView<'_, D>,
        _seconds: f64,
        _summary: &mut RunSummary,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// Whether the held stages keep only a share of the model's weights (routed experts
    /// sharded over a group): the gathered weights and checkpoints then take the shares of
    /// every holder.
    fn shards_weights(&self, _config: &TrainConfig) -> bool {
        false
    }

    /// Before the GPT's weights are gathered over the pipeline's ranks (a collective call
    /// when it is one): the shares this parallelism spreads, written into `template`.
    fn gather_shards(
        &mut self,
        _view: &mut StepView<'_, D>,
        _template: &mut GptWeights,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// This parallelism's state in this trainer's part of a checkpoint (the tensors are
    /// written sorted by name, so the order does not matter).
    fn checkpoint_tensors(
        &self,
        _read: &StageRead<'_>,
        _tensors: &mut Vec<HostTensor>,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// On restore, before the parameters are read: what decides which parameters the stages
    /// hold (e.g. the experts' placement).
    fn restore_placement(
        &mut self,
        _view: &mut StepView<'_, D>,
        _checkpoint: &Checkpoint,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// On restore, after the parameters: the rest of this parallelism's state.
    fn restore_state(
        &mut self,
        _view: &mut StepView<'_, D>,
        _checkpoint: &Checkpoint,
        _restored: &mut Restored,
    ) -> Result<(), TrainError> {
        Ok(())
    }
}

/// Every parallelism's pipeline hook, called in order.
pub(crate) struct Hooks(pub Vec<Box<dyn StepHook<ModelStage>>>);

impl StepHook<ModelStage> for Hooks {
    fn stage_done(
        &self,
        rank: usize,
        dir: usize,
        stage: usize,
        copy: &ModelStage,
    ) -> Result<(), StageError> {
        self.0
            .iter()
            .try_for_each(|h| h.stage_done(rank, dir, stage, copy))
    }

    fn between_ops(&self, rank: usize) -> Result<(), StageError> {
        self.0.iter().try_for_each(|h| h.between_ops(rank))
    }
}

impl<D: Driver> super::Trainer<D> {
    /// What the parallelisms read of this trainer.
    pub(crate) fn stage_read(&self) -> StageRead<'_> {
        StageRead {
            config: &self.config,
            schedule: &self.schedule,
            workload: &self.workload,
            held: &self.held,
            replica: self.replica,
            steps_done: self.steps_done,
            stages: &self.stages,
        }
    }

    /// Calls `f` on every parallelism in order, each with a view of the step; stops at the
    /// first error. A new configuration a parallelism set on the view (its stages rebuilt)
    /// becomes the trainer's (and the gathered weights are dropped).
    pub(crate) fn each_parallelism(
        &mut self,
        mut f: impl FnMut(&mut dyn Parallelism<D>, &mut StepView<'_, D>) -> Result<(), TrainError>,
    ) -> Result<(), TrainError> {
        let mut parallelisms = std::mem::take(&mut self.parallelisms);
        let done = self.with_view(|view| {
            parallelisms
                .iter_mut()
                .try_for_each(|p| f(p.as_mut(), view))
        });
        self.parallelisms = parallelisms;
        done
    }

    /// Calls `f` with a view of the step; a new configuration it set on the view becomes the
    /// trainer's (and the gathered weights are dropped), even when `f` fails after setting it.
    pub(crate) fn with_view<R>(&mut self, f: impl FnOnce(&mut StepView<'_, D>) -> R) -> R {
        let mut view = StepView {
            config: &self.config,
            schedule: &self.schedule,
            workload: &self.workload,
            held: &self.held,
            replica: self.replica,
            steps_done: self.steps_done,
            stages: &mut self.stages,
            optimizers: &mut self.optimizers,
            driver: &mut self.driver,
            exec_options: &self.exec_options,
            reconfigured: None,
        };
        let out = f(&mut view);
        if let Some(config) = view.reconfigured.take() {
            self.config = config;
            self.gathered = None;
        }
        out
    }

    /// The parallelism of type `P`, if the trainer holds one: the crate's own features
    /// answer the trainer's questions about them (the exchange, the expert group, the
    /// re-partitionings) this way; no hook looks another parallelism up.
    pub(crate) fn parallelism<P: Parallelism<D>>(&self) -> Option<&P> {
        self.parallelisms
            .iter()
            .find_map(|p| (p.as_ref() as &dyn std::any::Any).downcast_ref::<P>())
    }

    /// The parallelism of type `P`, mutably.
    pub(crate) fn parallelism_mut<P: Parallelism<D>>(&mut self) -> Option<&mut P> {
        self.parallelisms
            .iter_mut()
            .find_map(|p| (p.as_mut() as &mut dyn std::any::Any).downcast_mut::<P>())
    }
}
