//! [`Parallelism`]: what a feature of the training step does at the step's fixed points, so
//! that [`Trainer::step`] and [`Trainer::run`] name no feature.
//!
//! A trainer holds its parallelisms in a `Vec`, in the order they act (data parallelism,
//! then the MoE experts, then stage re-partitioning), and calls each of them, in that order,
//! at every point of a step:
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
//! 7. on checkpoint: [`Parallelism::checkpoint_tensors`], and on restore
//!    [`Parallelism::restore_placement`] (before the parameters) and
//!    [`Parallelism::restore_state`] (after them).
//!
//! Each call gets the trainer without the parallelism being called (the others stay in
//! place), so a parallelism reads and changes the stages, optimizers and driver as the step
//! did when it named the feature.

use std::any::Any;

use dualpipe_nn::ModelStage;
use dualpipe_runtime::{StageError, StepHook};

use super::{Restored, StepReport, Trainer};
use crate::checkpoint::{Checkpoint, HostTensor};
use crate::data_parallel::StepExchange;
use crate::driver::Driver;
use crate::error::TrainError;
use crate::experts::ExpertLoad;
use crate::summary::RunSummary;

/// What a step has produced so far, handed from one point of the step to the next.
#[derive(Debug)]
pub(crate) struct StepState {
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

/// A feature of the step (data parallelism, the MoE experts with their group and EPLB
/// re-placement, stage re-partitioning) at the step's fixed points; see the
/// [module](self) documentation for the order of the calls. Every point does nothing by
/// default.
pub(crate) trait Parallelism<D: Driver>: std::fmt::Debug + Send {
    /// The parallelism as [`Any`], for [`Trainer::parallelism`] to find it by type.
    fn as_any(&self) -> &dyn Any;

    /// The parallelism as [`Any`], mutably.
    fn as_any_mut(&mut self) -> &mut dyn Any;

    /// Refuses a step the parallelism is not ready for (nothing has run yet).
    fn check_ready(&self, _trainer: &Trainer<D>) -> Result<(), TrainError> {
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
        _trainer: &mut Trainer<D>,
        _state: &mut StepState,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// Before the optimizer of a run that clips: this process's sum of squares of the
    /// gradients its stages hold only a share of (`None`: it holds no such share). A
    /// collective call when it is one.
    fn sharded_squares(
        &mut self,
        _trainer: &mut Trainer<D>,
        _step: usize,
    ) -> Result<Option<f64>, TrainError> {
        Ok(None)
    }

    /// After the optimizer's step.
    fn after_optimizer(
        &mut self,
        _trainer: &mut Trainer<D>,
        _state: &mut StepState,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// [`Trainer::run`] starts.
    fn begin_run(&mut self) {}

    /// In [`Trainer::run`], after a finished step that is not the run's last (its
    /// evaluation and checkpoint done).
    fn after_step(
        &mut self,
        _trainer: &mut Trainer<D>,
        _report: &StepReport,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// After the run's last step (a collective call when it is one): the run's figures into
    /// `summary`; `seconds` is the run's wall-clock time.
    fn end_run(
        &mut self,
        _trainer: &mut Trainer<D>,
        _seconds: f64,
        _summary: &mut RunSummary,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// This parallelism's state in this trainer's part of a checkpoint (the tensors are
    /// written sorted by name, so the order does not matter).
    fn checkpoint_tensors(
        &self,
        _trainer: &Trainer<D>,
        _tensors: &mut Vec<HostTensor>,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// On restore, before the parameters are read: what decides which parameters the stages
    /// hold (e.g. the experts' placement).
    fn restore_placement(
        &mut self,
        _trainer: &mut Trainer<D>,
        _checkpoint: &Checkpoint,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// On restore, after the parameters: the rest of this parallelism's state.
    fn restore_state(
        &mut self,
        _trainer: &mut Trainer<D>,
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

impl<D: Driver> Trainer<D> {
    /// Calls `f` on every parallelism in order, each with the trainer (the one called is out
    /// of the list during its call); stops at the first error.
    pub(super) fn each_parallelism(
        &mut self,
        mut f: impl FnMut(&mut dyn Parallelism<D>, &mut Self) -> Result<(), TrainError>,
    ) -> Result<(), TrainError> {
        for i in 0..self.parallelisms.len() {
            let mut p = self.parallelisms.remove(i);
            let done = f(p.as_mut(), self);
            self.parallelisms.insert(i, p);
            done?;
        }
        Ok(())
    }

    /// The parallelism of type `P`, if the trainer holds one.
    pub(crate) fn parallelism<P: Parallelism<D> + 'static>(&self) -> Option<&P> {
        self.parallelisms
            .iter()
            .find_map(|p| p.as_any().downcast_ref::<P>())
    }
}

/// The parallelism of type `P` among `list` (a borrow of the list alone, so the trainer's
/// other fields stay free).
pub(crate) fn find_mut<D: Driver, P: Parallelism<D> + 'static>(
    list: &mut [Box<dyn Parallelism<D>>],
) -> Option<&mut P> {
    list.iter_mut()
        .find_map(|p| p.as_any_mut().downcast_mut::<P>())
}
