//! The [`Stage`] trait: what one pipeline stage computes, with the backward split in two; and
//! [`WireStage`], a stage whose tensors can cross process boundaries.

use dualpipe_schedule::Chunk;

use crate::transport::wire::{WireData, WireError};

/// An error raised by a stage's computation; the executor adds the rank and the op.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StageError(pub String);

/// What a forward consumes.
#[derive(Debug)]
pub enum ForwardInput<T> {
    /// The first stage of a direction loads its own input: micro-batch `global_mb` of the step
    /// (`dir * micro_batches_per_dir + mb`, the same index under every schedule).
    MicroBatch {
        /// The micro-batch's index in the whole step.
        global_mb: usize,
    },
    /// Any other stage gets the previous stage's activations.
    Activation(T),
}

/// What a forward produces.
#[derive(Debug)]
pub enum ForwardOutput<T> {
    /// Activations for the next stage.
    Activation(T),
    /// The last stage of a direction computes the loss of its micro-batch.
    Loss(f64),
}

/// One pipeline stage: a slice of the model that one rank runs for one (dir, stage).
///
/// The stage keeps whatever it needs between a chunk's forward and its backward (activations,
/// saved inputs) keyed by the chunk. A full backward `B` is `backward_input` followed at once by
/// `backward_weight`; zero-bubble schedules run `I` (`backward_input`) and later `W`
/// (`backward_weight`) for the same chunk, weight gradients first-in first-out.
pub trait Stage: Send {
    /// What travels between stages (activations and gradients).
    type Tensor: Send + 'static;

    /// Forward of `chunk`. A stage that is last in its direction returns
    /// [`ForwardOutput::Loss`].
    fn forward(
        &mut self,
        chunk: Chunk,
        input: ForwardInput<Self::Tensor>,
    ) -> Result<ForwardOutput<Self::Tensor>, StageError>;

    /// Backward for the input gradient of `chunk`. `grad_output` is `None` at the last stage
    /// (the gradient starts from the loss). Returns the gradient for the previous stage, or
    /// `None` at the first stage. Weight gradients are deferred to [`Stage::backward_weight`].
    fn backward_input(
        &mut self,
        chunk: Chunk,
        grad_output: Option<Self::Tensor>,
    ) -> Result<Option<Self::Tensor>, StageError>;

    /// The deferred weight gradient of `chunk`, whose `backward_input` ran earlier. Gradients
    /// accumulate over the micro-batches of a step.
    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), StageError>;

    /// Forward of `f` overlapped with the full backward of `b` (DualPipe's FB). The default
    /// runs them one after the other; a stage may interleave them to hide communication.
    #[allow(clippy::type_complexity)]
    fn forward_backward(
        &mut self,
        f: Chunk,
        input: ForwardInput<Self::Tensor>,
        b: Chunk,
        grad_output: Option<Self::Tensor>,
    ) -> Result<(ForwardOutput<Self::Tensor>, Option<Self::Tensor>), StageError> {
        let out = self.forward(f, input)?;
        let grad = self.backward_input(b, grad_output)?;
        self.backward_weight(b)?;
        Ok((out, grad))
    }

    /// An `FB` whose halves belong to two different stages of the rank: the forward of `f` on
    /// this stage and the full backward of `b` on `other` (DualPipe overlaps a forward of one
    /// direction with a backward of the other, which live in two stage objects). The default
    /// runs them one after the other; a stage may overlap them.
    #[allow(clippy::type_complexity)]
    fn forward_backward_pair(
        &mut self,
        f: Chunk,
        input: ForwardInput<Self::Tensor>,
        other: &mut Self,
        b: Chunk,
        grad_output: Option<Self::Tensor>,
    ) -> Result<(ForwardOutput<Self::Tensor>, Option<Self::Tensor>), StageError>
    where
        Self: Sized,
    {
        let out = self.forward(f, input)?;
        let grad = other.backward_input(b, grad_output)?;
        other.backward_weight(b)?;
        Ok((out, grad))
    }

    /// This stage's parameter gradients, accumulated over the step, in a fixed order. Used to
    /// sum the two copies of a DualPipe stage (rank s and rank ranks-1-s) after the step. A
    /// stage without parameters returns an empty list.
    fn gradients(&self) -> Vec<Self::Tensor> {
        Vec::new()
    }

    /// Adds another copy's gradients (same order as [`Stage::gradients`]) into this stage's.
    fn add_gradients(&mut self, other: &[Self::Tensor]) -> Result<(), StageError> {
        if other.is_empty() {
            Ok(())
        } else {
            Err(StageError("this stage has no gradients to add to".into()))
        }
    }
}

/// A [`Stage`] whose tensors can cross process boundaries as (dtype, shape, bytes).
///
/// The codec lives on the stage type (not on the tensor type) so that a crate can implement
/// it for a tensor type it does not own: `dualpipe-nn` implements it for its candle stage.
pub trait WireStage: Stage {
    /// The tensor as element type, shape and little-endian bytes.
    fn tensor_to_wire(tensor: Self::Tensor) -> Result<WireData, WireError>;

    /// The tensor back from the wire (its byte count already matches its shape).
    fn tensor_from_wire(data: WireData) -> Result<Self::Tensor, WireError>;
}
