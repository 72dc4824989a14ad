//! [`ModelStage`]: a stage of whichever model a run trains (the MLP or the GPT), so the
//! trainer, the drivers and the runtime are written once for every model.

use std::sync::Arc;
use std::time::Instant;

use candle_core::Tensor;
use dualpipe_runtime::{ForwardInput, ForwardOutput, Stage, StageError};
use dualpipe_schedule::Chunk;

use crate::data::Batch;
use crate::error::NnError;
use crate::gpt::moe::overlap::{compute_with, ComputeToken};
use crate::gpt::moe::waits::{self, PairChunk};
use crate::gpt::{GptStage, TokenBatch};
use crate::layers::Param;
use crate::stage::{MlpStage, StagePosition};

/// One step's data for every micro-batch, in the form its model reads.
#[derive(Clone, Debug)]
pub enum StepBatch {
    /// Teacher-student regression rows ([`MlpStage`]).
    Mlp(Batch),
    /// Token sequences ([`GptStage`]).
    Gpt(TokenBatch),
}

/// One copy of one model stage of either model; implements the runtime's
/// [`dualpipe_runtime::Stage`] by handing every call to the model's own stage.
#[derive(Debug)]
pub enum ModelStage {
    /// A slice of the residual MLP.
    Mlp(MlpStage),
    /// A slice of the GPT.
    Gpt(Box<GptStage>),
}

/// Calls the same method on whichever stage `self` holds.
macro_rules! each {
    ($self:expr, $s:ident => $body:expr) => {
        match $self {
            ModelStage::Mlp($s) => $body,
            ModelStage::Gpt($s) => $body,
        }
    };
}

impl ModelStage {
    /// Where this copy sits.
    pub fn position(&self) -> StagePosition {
        each!(self, s => s.position())
    }

    /// The model stage index.
    pub fn model_stage(&self) -> usize {
        self.position().model_stage
    }

    /// The direction this copy serves.
    pub fn dir(&self) -> usize {
        self.position().dir
    }

    /// Gives the stage the step's data; a batch of the other model is an error.
    pub fn set_batch(&mut self, batch: StepBatch) -> Result<(), NnError> {
        match (self, batch) {
            (ModelStage::Mlp(s), StepBatch::Mlp(b)) => s.set_batch(b),
            (ModelStage::Gpt(s), StepBatch::Gpt(b)) => s.set_batch(b),
            _ => {
                return Err(NnError::Stage(
                    "a batch of one model was given to a stage of the other".into(),
                ))
            }
        }
        Ok(())
    }

    /// Resets every accumulated gradient to zero.
    pub fn zero_grad(&mut self) -> Result<(), NnError> {
        each!(self, s => s.zero_grad())
    }

    /// Parameters in the model's fixed order.
    pub fn params(&self) -> Vec<&Param> {
        each!(self, s => s.params())
    }

    /// The parameters' names by model layer (never by rank), in the order of
    /// [`ModelStage::params`]: the GPT's documented tensor names, the MLP's
    /// `blocks.{l}.{up,down}.{weight,bias}`.
    pub fn param_names(&self) -> Vec<String> {
        each!(self, s => s.param_names())
    }

    /// Per parameter (in the order of [`ModelStage::params`]): whether it is a routed expert
    /// of an expert-parallel MoE block (see [`GptStage::sharded_params`]); the data-parallel
    /// exchange carries the others.
    pub fn sharded_params(&self) -> Vec<bool> {
        match self {
            ModelStage::Gpt(s) => s.sharded_params(),
            ModelStage::Mlp(s) => vec![false; s.params().len()],
        }
    }

    /// Parameters mutably, in the order of [`ModelStage::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        each!(self, s => s.params_mut())
    }

    /// Parameter values, in the order of [`ModelStage::params`].
    pub fn parameter_values(&self) -> Vec<Tensor> {
        self.params().into_iter().map(|p| p.value.clone()).collect()
    }

    /// Saved tensors of chunks whose backward has not run yet; 0 after a complete step.
    pub fn pending(&self) -> usize {
        each!(self, s => s.pending())
    }

    /// Whether an FB pair with this stage in it overlaps its two chunks (a GPT stage with an
    /// expert-parallel MoE block, the overlap on).
    pub fn overlaps_expert_traffic(&self) -> bool {
        self.as_gpt().is_some_and(GptStage::overlaps_expert_traffic)
    }

    /// The GPT stage, if this is one.
    pub fn as_gpt(&self) -> Option<&GptStage> {
        match self {
            ModelStage::Gpt(s) => Some(s),
            ModelStage::Mlp(_) => None,
        }
    }
}

impl Stage for ModelStage {
    type Tensor = Tensor;

    fn forward(
        &mut self,
        chunk: Chunk,
        input: ForwardInput<Tensor>,
    ) -> Result<ForwardOutput<Tensor>, StageError> {
        each!(self, s => s.forward(chunk, input))
    }

    fn backward_input(
        &mut self,
        chunk: Chunk,
        grad_output: Option<Tensor>,
    ) -> Result<Option<Tensor>, StageError> {
        each!(self, s => s.backward_input(chunk, grad_output))
    }

    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), StageError> {
        each!(self, s => s.backward_weight(chunk))
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
            let grad = stage.backward_input(b, grad_output)?;
            stage.backward_weight(b)?;
            Ok(grad)
        };
        if !(self.overlaps_expert_traffic() || other.overlaps_expert_traffic()) {
            let out = self.forward(f, input)?;
            return Ok((out, backward(other)?));
        }
        let token = Arc::new(ComputeToken::default());
        let begun = Instant::now();
        std::thread::scope(|scope| {
            let forward = scope.spawn(|| {
                waits::add_thread_start(begun.elapsed());
                let out = compute_with(&token, PairChunk::Forward, || self.forward(f, input));
                (out, begun.elapsed())
            });
            let grad = compute_with(&token, PairChunk::Backward, || backward(other));
            let backward_end = begun.elapsed();
            let (out, forward_end) = forward.join().map_err(|_| {
                StageError(format!(
                    "the forward of {f} in an overlapped FB pair panicked"
                ))
            })?;
            waits::add_pair_span(forward_end.max(backward_end));
            Ok((out?, grad?))
        })
    }

    fn gradients(&self) -> Vec<Tensor> {
        each!(self, s => s.gradients())
    }

    fn add_gradients(&mut self, other: &[Tensor]) -> Result<(), StageError> {
        each!(self, s => s.add_gradients(other))
    }
}
