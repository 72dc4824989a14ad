//! [`StepBatch`]: one step's data for every micro-batch, in the form its model reads (the
//! MLP's rows, the GPT's token sequences, or a user's micro-batches of any type).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::data::Batch;
use crate::error::NnError;
use crate::gpt::TokenBatch;

/// One step's data for every micro-batch, in the form its model reads.
#[derive(Clone)]
pub enum StepBatch {
    /// Teacher-student regression rows ([`MlpStage`](crate::MlpStage)).
    Mlp(Batch),
    /// Token sequences ([`GptStage`](crate::gpt::GptStage)).
    Gpt(TokenBatch),
    /// A user's micro-batches: a `Vec<T>` of any type `T` the user's stages read (indexed by
    /// the replica's micro-batch, `dir · micro_batches_per_dir + mb`); read it with
    /// [`StepBatch::micro_batches`].
    Custom(Arc<dyn Any + Send + Sync>),
}

impl StepBatch {
    /// A user's micro-batches as a [`StepBatch::Custom`].
    pub fn custom<T: Send + Sync + 'static>(micro_batches: Vec<T>) -> Self {
        StepBatch::Custom(Arc::new(micro_batches))
    }

    /// The micro-batches of a [`StepBatch::Custom`] holding a `Vec<T>`; an error names what
    /// was expected otherwise.
    pub fn micro_batches<T: 'static>(&self) -> Result<&[T], NnError> {
        match self {
            StepBatch::Custom(any) => {
                any.downcast_ref::<Vec<T>>()
                    .map(Vec::as_slice)
                    .ok_or_else(|| {
                        NnError::Stage(format!(
                            "the step's batch does not hold micro-batches of type {}",
                            std::any::type_name::<T>()
                        ))
                    })
            }
            other => Err(NnError::Stage(format!(
                "a stage that reads micro-batches of type {} was given the {} batch",
                std::any::type_name::<T>(),
                other.kind()
            ))),
        }
    }

    /// The batch's kind in words: `MLP`, `GPT` or `custom`.
    pub fn kind(&self) -> &'static str {
        match self {
            StepBatch::Mlp(_) => "MLP",
            StepBatch::Gpt(_) => "GPT",
            StepBatch::Custom(_) => "custom",
        }
    }
}

impl fmt::Debug for StepBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepBatch::Mlp(b) => f.debug_tuple("Mlp").field(b).finish(),
            StepBatch::Gpt(b) => f.debug_tuple("Gpt").field(b).finish(),
            StepBatch::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}
