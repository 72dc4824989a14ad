//! The plumbing every [`PipelineStage`](crate::PipelineStage) of this crate shares around its
//! layers (the MLP's, the GPT's and a stage of a user's layers): the chunk check, the step's
//! micro-batch of a chunk, where a forward starts (the micro-batch or the previous stage's
//! activation) and where an input backward starts (the loss or the next stage's gradient),
//! and the runtime's gradient sums. The errors name the chunk and the stage's contract.

use candle_core::Tensor;
use dualpipe_runtime::ForwardInput;
use dualpipe_schedule::Chunk;

use crate::error::NnError;
use crate::layers::Param;
use crate::model_stage::StagePosition;

/// Fails unless `chunk` is one of the copy at `position` (its model stage and direction);
/// `what` names the call (`forward`, `backward_input`, `backward_weight`).
pub(crate) fn check_chunk(
    position: StagePosition,
    chunk: Chunk,
    what: &str,
) -> Result<(), NnError> {
    if chunk.stage != position.model_stage || chunk.dir != position.dir {
        return Err(NnError::Stage(format!(
            "{what} of {chunk} sent to the copy of stage {} for direction {}",
            position.model_stage, position.dir
        )));
    }
    Ok(())
}

/// The step's micro-batch of `chunk` (`dir · micro_batches_per_dir + mb`) in `batch`, the
/// step's micro-batches (`None`: no batch was given).
pub(crate) fn micro_batch<T>(
    position: StagePosition,
    batch: Option<&[T]>,
    chunk: Chunk,
) -> Result<&T, NnError> {
    let global_mb = chunk.dir * position.micro_batches_per_dir + chunk.mb;
    let all =
        batch.ok_or_else(|| NnError::Stage("no batch: call set_batch before the step".into()))?;
    all.get(global_mb).ok_or_else(|| {
        NnError::Stage(format!(
            "micro-batch {global_mb} of {chunk} is not in the batch of {}",
            all.len()
        ))
    })
}

/// Where a chunk's forward starts.
pub(crate) enum ForwardStart<T> {
    /// The first stage: from the chunk's micro-batch, which the stage loads.
    MicroBatch,
    /// Any other stage: from the previous stage's activation.
    Activation(T),
}

/// Where the forward of `chunk` starts on the copy at `position` (`first`: the first stage of
/// its direction) given the runtime's `input`; the first stage (only) loads its micro-batch,
/// and the micro-batch it is asked for must be the chunk's.
pub(crate) fn forward_start<T>(
    position: StagePosition,
    first: bool,
    chunk: Chunk,
    input: ForwardInput<T>,
) -> Result<ForwardStart<T>, NnError> {
    match (input, first) {
        (ForwardInput::MicroBatch { global_mb }, true) => {
            let expected = chunk.dir * position.micro_batches_per_dir + chunk.mb;
            if global_mb != expected {
                return Err(NnError::Stage(format!(
                    "forward of {chunk} asked for micro-batch {global_mb}, expected {expected}"
                )));
            }
            Ok(ForwardStart::MicroBatch)
        }
        (ForwardInput::Activation(x), false) => Ok(ForwardStart::Activation(x)),
        (ForwardInput::MicroBatch { .. }, false) => Err(NnError::Stage(format!(
            "forward of {chunk}: only the first stage loads a micro-batch"
        ))),
        (ForwardInput::Activation(_), true) => Err(NnError::Stage(format!(
            "forward of {chunk}: the first stage loads its micro-batch, it takes no activation"
        ))),
    }
}

/// The output gradient the input backward of `chunk` starts from: `None` on the last stage
/// (`last`), which starts from its loss and takes no gradient; the next stage's gradient on
/// any other, which needs one.
pub(crate) fn backward_start<T>(
    last: bool,
    chunk: Chunk,
    grad_output: Option<T>,
) -> Result<Option<T>, NnError> {
    match (grad_output, last) {
        (None, true) => Ok(None),
        (Some(g), false) => Ok(Some(g)),
        (Some(_), true) => Err(NnError::Stage(format!(
            "backward_input of {chunk}: the last stage starts from the loss and takes no gradient"
        ))),
        (None, false) => Err(NnError::Stage(format!(
            "backward_input of {chunk}: only the last stage starts from the loss; this one needs the output gradient"
        ))),
    }
}

/// Fails unless `grads` match `params` one for one, in shape and dtype.
pub(crate) fn check_grads(params: &[&Param], grads: &[Tensor]) -> Result<(), NnError> {
    if params.len() != grads.len() {
        return Err(NnError::Stage(format!(
            "got {} gradients for a stage with {} parameters",
            grads.len(),
            params.len()
        )));
    }
    for (i, (p, g)) in params.iter().zip(grads).enumerate() {
        if p.value.dims() != g.dims() || p.value.dtype() != g.dtype() {
            return Err(NnError::Stage(format!(
                "gradient {i} is {:?} {:?}, the parameter is {:?} {:?}",
                g.dtype(),
                g.dims(),
                p.value.dtype(),
                p.value.dims()
            )));
        }
    }
    Ok(())
}

/// The accumulated gradients of `params`, in their order (the runtime's `Stage::gradients`).
pub(crate) fn gradients(params: Vec<&Param>) -> Vec<Tensor> {
    params.into_iter().map(|p| p.grad.clone()).collect()
}

/// Adds another copy's gradients `other` to those of `params`, one for one (the runtime's
/// `Stage::add_gradients`, which sums DualPipe's two copies of a stage).
pub(crate) fn add_gradients(mut params: Vec<&mut Param>, other: &[Tensor]) -> Result<(), NnError> {
    check_grads(&params.iter().map(|p| &**p).collect::<Vec<_>>(), other)?;
    for (p, g) in params.iter_mut().zip(other) {
        p.grad = crate::layers::kernels::add(&p.grad, g, "adding a copy's gradients")?;
    }
    Ok(())
}

/// Implements the runtime's [`Stage`](dualpipe_runtime::Stage) for a stage type of this crate
/// that has `forward_impl`, `backward_input_impl`, `backward_weight_impl` (the F, I and W of
/// its layers) and `params` / `params_mut`: one implementation for the MLP and the GPT stages.
macro_rules! impl_param_stage {
    ($stage:ty) => {
        impl dualpipe_runtime::Stage for $stage {
            type Tensor = candle_core::Tensor;

            fn forward(
                &mut self,
                chunk: dualpipe_schedule::Chunk,
                input: dualpipe_runtime::ForwardInput<candle_core::Tensor>,
            ) -> Result<
                dualpipe_runtime::ForwardOutput<candle_core::Tensor>,
                dualpipe_runtime::StageError,
            > {
                Ok(self.forward_impl(chunk, input)?)
            }

            fn backward_input(
                &mut self,
                chunk: dualpipe_schedule::Chunk,
                grad_output: Option<candle_core::Tensor>,
            ) -> Result<Option<candle_core::Tensor>, dualpipe_runtime::StageError> {
                Ok(self.backward_input_impl(chunk, grad_output)?)
            }

            fn backward_weight(
                &mut self,
                chunk: dualpipe_schedule::Chunk,
            ) -> Result<(), dualpipe_runtime::StageError> {
                Ok(self.backward_weight_impl(chunk)?)
            }

            fn gradients(&self) -> Vec<candle_core::Tensor> {
                $crate::plumbing::gradients(self.params())
            }

            fn add_gradients(
                &mut self,
                other: &[candle_core::Tensor],
            ) -> Result<(), dualpipe_runtime::StageError> {
                Ok($crate::plumbing::add_gradients(self.params_mut(), other)?)
            }
        }
    };
}
pub(crate) use impl_param_stage;

/// Implements [`PipelineStage`](crate::model_stage::PipelineStage) for a stage type of this
/// crate by delegation, one implementation for the MLP and the GPT stages: its `position`
/// field, its batch of the [`StepBatch`](crate::model_stage::StepBatch) variant `$batch`
/// (`$what` names the stage in the error for another one), the F, I and W of
/// [`impl_param_stage!`], and its own `params`, `params_mut`, `param_names`, `pending` and
/// `zero_grad`; the methods in the braces are the trait's others the type overrides.
macro_rules! impl_pipeline_stage {
    ($stage:ty, $batch:ident, $what:literal, { $($extra:tt)* }) => {
        impl $crate::model_stage::PipelineStage for $stage {
            fn position(&self) -> $crate::model_stage::StagePosition {
                self.position
            }

            fn set_batch(
                &mut self,
                batch: &$crate::model_stage::StepBatch,
            ) -> Result<(), $crate::error::NnError> {
                match batch {
                    $crate::model_stage::StepBatch::$batch(b) => {
                        <$stage>::set_batch(self, b.clone());
                        Ok(())
                    }
                    other => Err($crate::error::NnError::Stage(format!(
                        concat!($what, " stage was given the {} batch"),
                        other.kind()
                    ))),
                }
            }

            fn forward(
                &mut self,
                chunk: dualpipe_schedule::Chunk,
                input: dualpipe_runtime::ForwardInput<candle_core::Tensor>,
            ) -> Result<dualpipe_runtime::ForwardOutput<candle_core::Tensor>, $crate::error::NnError>
            {
                self.forward_impl(chunk, input)
            }

            fn backward_input(
                &mut self,
                chunk: dualpipe_schedule::Chunk,
                grad_output: Option<candle_core::Tensor>,
            ) -> Result<Option<candle_core::Tensor>, $crate::error::NnError> {
                self.backward_input_impl(chunk, grad_output)
            }

            fn backward_weight(
                &mut self,
                chunk: dualpipe_schedule::Chunk,
            ) -> Result<(), $crate::error::NnError> {
                self.backward_weight_impl(chunk)
            }

            fn params(&self) -> Vec<&$crate::layers::Param> {
                <$stage>::params(self)
            }

            fn params_mut(&mut self) -> Vec<&mut $crate::layers::Param> {
                <$stage>::params_mut(self)
            }

            fn param_names(&self) -> Vec<String> {
                <$stage>::param_names(self)
            }

            fn pending(&self) -> usize {
                <$stage>::pending(self)
            }

            fn zero_grad(&mut self) -> Result<(), $crate::error::NnError> {
                <$stage>::zero_grad(self)
            }

            $($extra)*
        }
    };
}
pub(crate) use impl_pipeline_stage;

#[cfg(test)]
mod tests {
    use super::*;

    const POSITION: StagePosition = StagePosition {
        dir: 1,
        model_stage: 2,
        micro_batches: 8,
        micro_batches_per_dir: 4,
    };

    fn message<T>(r: Result<T, NnError>) -> String {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_chunk_of_another_copy_is_refused() {
        check_chunk(POSITION, Chunk::new(1, 2, 3), "forward").unwrap();
        let text = message(check_chunk(POSITION, Chunk::new(0, 2, 3), "forward"));
        assert!(text.contains("stage 2 for direction 1"), "{text}");
    }

    #[test]
    fn the_micro_batch_of_a_chunk_is_its_global_index() {
        let batch: Vec<usize> = (0..8).collect();
        assert_eq!(
            *micro_batch(POSITION, Some(&batch), Chunk::new(1, 2, 3)).unwrap(),
            7
        );
        let text = message(micro_batch(
            POSITION,
            Some(&batch[..5]),
            Chunk::new(1, 2, 3),
        ));
        assert!(
            text.contains("micro-batch 7") && text.contains("of 5"),
            "{text}"
        );
        let text = message(micro_batch::<usize>(POSITION, None, Chunk::new(1, 2, 0)));
        assert!(text.contains("set_batch"), "{text}");
    }

    #[test]
    fn only_the_first_stage_loads_and_only_its_own_micro_batch() {
        let c = Chunk::new(1, 2, 3);
        let load = || ForwardInput::<u8>::MicroBatch { global_mb: 7 };
        assert!(matches!(
            forward_start(POSITION, true, c, load()),
            Ok(ForwardStart::MicroBatch)
        ));
        assert!(matches!(
            forward_start(POSITION, false, c, ForwardInput::Activation(5u8)),
            Ok(ForwardStart::Activation(5))
        ));
        let wrong = ForwardInput::<u8>::MicroBatch { global_mb: 3 };
        let text = message(forward_start(POSITION, true, c, wrong));
        assert!(
            text.contains("asked for micro-batch 3, expected 7"),
            "{text}"
        );
        assert!(forward_start(POSITION, false, c, load()).is_err());
        assert!(forward_start(POSITION, true, c, ForwardInput::Activation(5u8)).is_err());
    }

    #[test]
    fn only_the_last_stage_starts_its_backward_from_the_loss() {
        let c = Chunk::new(1, 2, 3);
        assert_eq!(backward_start::<u8>(true, c, None).unwrap(), None);
        assert_eq!(backward_start(false, c, Some(4u8)).unwrap(), Some(4));
        assert!(backward_start(true, c, Some(4u8)).is_err());
        assert!(backward_start::<u8>(false, c, None).is_err());
    }
}
