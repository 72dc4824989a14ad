//! The open stage API.
//!
//! - [`PipelineStage`]: one pipeline stage of any model (forward, input-gradient backward,
//!   deferred weight-gradient backward, parameters by name, state for checkpoints). The MLP
//!   ([`MlpStage`](crate::MlpStage)), the GPT ([`GptStage`](crate::gpt::GptStage), with MoE) and a user's own stages
//!   ([`crate::custom`]) implement it;
//! - [`ExpertStage`]: the optional extension of a stage with MoE blocks (router counts, the
//!   expert layers for expert parallelism and re-placement), reached through
//!   [`PipelineStage::experts`];
//! - [`ModelStage`]: the trainer's box around one stage copy: it implements the runtime's
//!   [`dualpipe_runtime::Stage`], so the trainer, data parallelism, compression, checkpoints,
//!   metrics and every schedule are written once, for any model;
//! - [`StepBatch`]: one step's data, in the form its model reads;
//! - [`StagePosition`]: where a stage copy sits.
//!
//! It knows no model: each model implements [`PipelineStage`] in its own module (the plumbing
//! they share is in `plumbing.rs`), and the FB pair's threads are in [`crate::parallel`].

use std::any::Any;
use std::fmt;

use candle_core::Tensor;
use dualpipe_runtime::{ForwardInput, ForwardOutput, Stage, StageError};
use dualpipe_schedule::Chunk;

use crate::error::NnError;
use crate::layers::{MoeLayer, Param};
use crate::parallel::overlap::run_pair;
use crate::plumbing;
/// One step's data (defined beside the models' batch types; re-exported here, its old path).
pub use crate::step_batch::StepBatch;

/// Where a stage copy sits and how the step's loss is split over micro-batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagePosition {
    /// The direction whose pipeline this copy serves (0 for single-direction schedules).
    pub dir: usize,
    /// Model stage index (= `chunk.stage` of every chunk this copy computes).
    pub model_stage: usize,
    /// Micro-batches in the whole step, over all directions; each micro-batch's loss is
    /// scaled by `1 / micro_batches` so the step's loss is their mean.
    pub micro_batches: usize,
    /// Micro-batches per direction (`global_mb = dir * micro_batches_per_dir + mb`).
    pub micro_batches_per_dir: usize,
}

/// One copy of one pipeline stage of a model: what the trainer, the data-parallel exchange,
/// gradient compression, checkpoints, metrics and every schedule need of it.
///
/// A stage computes the chunks (`dir`, `stage`, `mb`) of its [`StagePosition`]. The first
/// stage of a direction is given [`ForwardInput::MicroBatch`] and reads its input from the
/// step's [`StepBatch`]; the others get the previous stage's activation. The last stage
/// computes the micro-batch's loss, scaled by `1 / micro_batches` so the step's loss is the
/// mean, and returns [`ForwardOutput::Loss`]; its backward starts from that loss
/// (`grad_output` is `None`). The first stage's `backward_input` returns `None`.
///
/// The backward is split as zero-bubble schedules want it: `backward_input` (I) computes
/// only the gradient of the stage's input, which the previous stage waits for;
/// `backward_weight` (W) computes the weight gradients later, in the schedule's bubbles. A
/// stage that computes everything in `backward_input` (as [`crate::custom::AutogradLayer`]
/// does) keeps the default `backward_weight`, which does nothing: every schedule still
/// trains it correctly, but a zero-bubble schedule (ZB1P, DualPipe, DualPipeV) can no longer
/// fill its bubbles with W work.
///
/// Weight gradients accumulate over the step's micro-batches into each [`Param::grad`]; the
/// trainer zeroes them ([`PipelineStage::zero_grad`]) before each step, sums DualPipe's two
/// copies of a stage, exchanges them among data-parallel replicas (compressed if asked) and
/// applies the optimizer to [`PipelineStage::params_mut`].
pub trait PipelineStage: fmt::Debug + Send + Any {
    /// Where this copy sits (direction, model stage, micro-batches of the step).
    fn position(&self) -> StagePosition;

    /// Gives the stage the step's data, before the step (every stage gets it; the first and
    /// last read it).
    fn set_batch(&mut self, batch: &StepBatch) -> Result<(), NnError>;

    /// F: the forward of `chunk`, keeping what its backward needs.
    fn forward(
        &mut self,
        chunk: Chunk,
        input: ForwardInput<Tensor>,
    ) -> Result<ForwardOutput<Tensor>, NnError>;

    /// I: the gradient of `chunk`'s input from its output's (`None` on the last stage: the
    /// loss); `None` on the first stage.
    fn backward_input(
        &mut self,
        chunk: Chunk,
        grad_output: Option<Tensor>,
    ) -> Result<Option<Tensor>, NnError>;

    /// W: the deferred weight gradients of `chunk`, accumulated into the parameters'
    /// gradients. The default does nothing: for a stage whose `backward_input` computed them.
    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), NnError> {
        let _ = chunk;
        Ok(())
    }

    /// The parameters in a fixed order.
    fn params(&self) -> Vec<&Param>;

    /// The parameters mutably, in the order of [`PipelineStage::params`].
    fn params_mut(&mut self) -> Vec<&mut Param>;

    /// The parameters' names by model layer (never by rank), in the order of
    /// [`PipelineStage::params`]: checkpoints and saved weights are keyed by them, so any
    /// grid shape can load them.
    fn param_names(&self) -> Vec<String>;

    /// Tensors saved by chunks whose backward has not run yet; 0 after a complete step (the
    /// trainer checks it).
    fn pending(&self) -> usize;

    /// Resets every accumulated gradient to zero (before each step).
    fn zero_grad(&mut self) -> Result<(), NnError> {
        self.params_mut().into_iter().try_for_each(Param::zero_grad)
    }

    /// Per parameter (in the order of [`PipelineStage::params`]): whether only some
    /// data-parallel workers store it (a routed expert of an expert-parallel MoE block); the
    /// data-parallel exchange carries the others. The default: none.
    fn sharded_params(&self) -> Vec<bool> {
        vec![false; self.params().len()]
    }

    /// Model state beside the parameters that checkpoints keep, by name (e.g. the MoE
    /// selection biases). The default: none.
    fn buffers(&self) -> Vec<(String, Vec<f64>)> {
        Vec::new()
    }

    /// Sets the buffer `name` (one of [`PipelineStage::buffers`]) to a checkpoint's values.
    fn set_buffer(&mut self, name: &str, values: &[f64]) -> Result<(), NnError> {
        let _ = values;
        Err(NnError::Stage(format!("this stage has no buffer `{name}`")))
    }

    /// Multiplies the loss gradient the last stage's backward starts from by `scale` (the
    /// dynamic loss scaling of f16 mixed precision) from the next forward on. The default
    /// accepts only 1 (no scaling).
    fn set_loss_scale(&mut self, scale: f64) -> Result<(), NnError> {
        if scale == 1.0 {
            Ok(())
        } else {
            Err(NnError::Config(
                "this model does not scale its loss; train it in f32, f64 or bf16".into(),
            ))
        }
    }

    /// The stage's MoE side, if it has MoE blocks (router counts, expert parallelism,
    /// re-placement). The default: none.
    fn experts(&self) -> Option<&dyn ExpertStage> {
        None
    }

    /// [`PipelineStage::experts`], mutably.
    fn experts_mut(&mut self) -> Option<&mut dyn ExpertStage> {
        None
    }
}

/// The MoE side of a [`PipelineStage`]: what expert parallelism, EPLB's re-placement and the
/// auxiliary-loss-free bias need of a stage's [`MoeLayer`]s.
pub trait ExpertStage {
    /// The MoE blocks of the stage (model-wide index, layer).
    fn moe_layers(&self) -> Vec<(usize, &MoeLayer)>;

    /// The MoE blocks mutably (model-wide index, layer).
    fn moe_layers_mut(&mut self) -> Vec<(usize, &mut MoeLayer)>;

    /// Per MoE block: its model-wide index and the tokens its forwards routed to each expert
    /// since the last zero_grad.
    fn router_counts(&self) -> Vec<(usize, Vec<u64>)> {
        self.moe_layers()
            .into_iter()
            .map(|(l, m)| (l, m.token_counts().to_vec()))
            .collect()
    }

    /// The auxiliary-loss-free bias step of MoE block `layer` from `loads`, the step's
    /// counts over every copy of the block.
    fn update_selection_bias(
        &mut self,
        layer: usize,
        loads: &[u64],
        rate: f64,
    ) -> Result<(), NnError>;

    /// Whether an FB pair with this stage in it overlaps its two chunks (some block is
    /// expert-parallel with the overlap on).
    fn overlaps_expert_traffic(&self) -> bool {
        self.moe_layers()
            .iter()
            .any(|(_, m)| m.expert_parallel().is_some_and(|p| p.overlap()))
    }
}

/// One copy of one model stage, of any model: a boxed [`PipelineStage`] implementing the
/// runtime's [`dualpipe_runtime::Stage`], so the trainer, the drivers and the runtime are
/// written once for every model.
#[derive(Debug)]
pub struct ModelStage(Box<dyn PipelineStage>);

impl ModelStage {
    /// Boxes `stage`.
    pub fn new(stage: impl PipelineStage) -> Self {
        ModelStage(Box::new(stage))
    }

    /// Wraps a boxed stage.
    pub fn from_box(stage: Box<dyn PipelineStage>) -> Self {
        ModelStage(stage)
    }

    /// The stage.
    pub fn stage(&self) -> &dyn PipelineStage {
        &*self.0
    }

    /// The stage, mutably.
    pub fn stage_mut(&mut self) -> &mut dyn PipelineStage {
        &mut *self.0
    }

    /// The stage as its own type `T`, if it is one.
    pub fn downcast_ref<T: PipelineStage>(&self) -> Option<&T> {
        let any: &dyn Any = &*self.0;
        any.downcast_ref::<T>()
    }

    /// The stage as its own type `T`, mutably, if it is one.
    pub fn downcast_mut<T: PipelineStage>(&mut self) -> Option<&mut T> {
        let any: &mut dyn Any = &mut *self.0;
        any.downcast_mut::<T>()
    }

    /// Where this copy sits.
    pub fn position(&self) -> StagePosition {
        self.0.position()
    }

    /// The model stage index.
    pub fn model_stage(&self) -> usize {
        self.position().model_stage
    }

    /// The direction this copy serves.
    pub fn dir(&self) -> usize {
        self.position().dir
    }

    /// Gives the stage the step's data; a batch of another model is an error.
    pub fn set_batch(&mut self, batch: StepBatch) -> Result<(), NnError> {
        self.0.set_batch(&batch)
    }

    /// Resets every accumulated gradient to zero.
    pub fn zero_grad(&mut self) -> Result<(), NnError> {
        self.0.zero_grad()
    }

    /// Parameters in the model's fixed order.
    pub fn params(&self) -> Vec<&Param> {
        self.0.params()
    }

    /// The parameters' names by model layer (never by rank), in the order of
    /// [`ModelStage::params`]: the GPT's documented tensor names, the MLP's
    /// `blocks.{l}.{up,down}.{weight,bias}`.
    pub fn param_names(&self) -> Vec<String> {
        self.0.param_names()
    }

    /// Per parameter (in the order of [`ModelStage::params`]): whether it is a routed expert
    /// of an expert-parallel MoE block (see [`GptStage::sharded_params`](crate::gpt::GptStage::sharded_params)); the data-parallel
    /// exchange carries the others.
    pub fn sharded_params(&self) -> Vec<bool> {
        self.0.sharded_params()
    }

    /// Parameters mutably, in the order of [`ModelStage::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        self.0.params_mut()
    }

    /// Parameter values, in the order of [`ModelStage::params`].
    pub fn parameter_values(&self) -> Vec<Tensor> {
        self.params().into_iter().map(|p| p.value.clone()).collect()
    }

    /// Saved tensors of chunks whose backward has not run yet; 0 after a complete step.
    pub fn pending(&self) -> usize {
        self.0.pending()
    }

    /// The stage's checkpointed state beside its parameters ([`PipelineStage::buffers`]).
    pub fn buffers(&self) -> Vec<(String, Vec<f64>)> {
        self.0.buffers()
    }

    /// Sets a buffer from a checkpoint ([`PipelineStage::set_buffer`]).
    pub fn set_buffer(&mut self, name: &str, values: &[f64]) -> Result<(), NnError> {
        self.0.set_buffer(name, values)
    }

    /// Sets the loss scale ([`PipelineStage::set_loss_scale`]).
    pub fn set_loss_scale(&mut self, scale: f64) -> Result<(), NnError> {
        self.0.set_loss_scale(scale)
    }

    /// The stage's MoE side, if any ([`PipelineStage::experts`]).
    pub fn experts(&self) -> Option<&dyn ExpertStage> {
        self.0.experts()
    }

    /// The stage's MoE side mutably, if any.
    pub fn experts_mut(&mut self) -> Option<&mut dyn ExpertStage> {
        self.0.experts_mut()
    }

    /// Whether an FB pair with this stage in it overlaps its two chunks (a stage with an
    /// expert-parallel MoE block, the overlap on).
    pub fn overlaps_expert_traffic(&self) -> bool {
        self.experts()
            .is_some_and(ExpertStage::overlaps_expert_traffic)
    }
}

impl Stage for ModelStage {
    type Tensor = Tensor;

    fn forward(
        &mut self,
        chunk: Chunk,
        input: ForwardInput<Tensor>,
    ) -> Result<ForwardOutput<Tensor>, StageError> {
        Ok(self.0.forward(chunk, input)?)
    }

    fn backward_input(
        &mut self,
        chunk: Chunk,
        grad_output: Option<Tensor>,
    ) -> Result<Option<Tensor>, StageError> {
        Ok(self.0.backward_input(chunk, grad_output)?)
    }

    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), StageError> {
        Ok(self.0.backward_weight(chunk)?)
    }

    /// With expert parallelism (and the overlap on), the forward of `f` and the backward of
    /// `b` run as two threads sharing one compute token: while one waits on an expert
    /// all-to-all, the other computes, as DualPipe hides the dispatch and combine. Each
    /// chunk's ops keep their order, so the results are those of the sequential pair.
    fn forward_backward_pair(
        &mut self,
        f: Chunk,
        input: ForwardInput<Tensor>,
        other: &mut Self,
        b: Chunk,
        grad_output: Option<Tensor>,
    ) -> Result<(ForwardOutput<Tensor>, Option<Tensor>), StageError> {
        let backward = |stage: &mut ModelStage| -> Result<Option<Tensor>, StageError> {
            let grad = Stage::backward_input(stage, b, grad_output)?;
            Stage::backward_weight(stage, b)?;
            Ok(grad)
        };
        if !(self.overlaps_expert_traffic() || other.overlaps_expert_traffic()) {
            let out = Stage::forward(self, f, input)?;
            return Ok((out, backward(other)?));
        }
        let panicked = || {
            StageError(format!(
                "the forward of {f} in an overlapped FB pair panicked"
            ))
        };
        run_pair(
            || Stage::forward(self, f, input),
            || backward(other),
            panicked,
        )
    }

    fn gradients(&self) -> Vec<Tensor> {
        plumbing::gradients(self.params())
    }

    fn add_gradients(&mut self, other: &[Tensor]) -> Result<(), StageError> {
        Ok(plumbing::add_gradients(self.params_mut(), other)?)
    }
}
