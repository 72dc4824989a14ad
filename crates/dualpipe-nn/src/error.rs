//! The one error type of this crate.

use dualpipe_runtime::StageError;
use dualpipe_schedule::ScheduleError;

/// Anything that can go wrong while building or training a model.
#[derive(Debug, thiserror::Error)]
pub enum NnError {
    /// The training configuration is not usable; the message names the field and a valid value.
    #[error("invalid training configuration: {0}")]
    Config(String),
    /// The schedule could not be built for this configuration.
    #[error("cannot build the schedule: {0}")]
    Schedule(#[from] ScheduleError),
    /// A tensor operation failed (a shape or dtype mismatch: a bug, or a stage fed wrong data).
    #[error("tensor operation failed in {context}: {source}")]
    Tensor {
        /// Where it happened (layer, stage, optimizer, ...).
        context: String,
        /// candle's error.
        #[source]
        source: candle_core::Error,
    },
    /// A stage was driven in an order that breaks its contract (e.g. a backward before its forward).
    #[error("{0}")]
    Stage(String),
    /// The step's results are not usable (a stage left state behind, a loss is missing, an
    /// earlier step failed).
    #[error("pipeline step failed: {0}")]
    Execution(String),
    /// The runtime's executor failed (a rank's stage failed, a message never arrived).
    // Not `#[from]`: the message already holds the runtime's, so it is not repeated as a
    // source in `{:#}` chains.
    #[error("pipeline execution failed: {0}")]
    Runtime(dualpipe_runtime::RuntimeError),
}

impl NnError {
    /// Wraps a candle error with the place it happened.
    pub fn tensor(context: impl Into<String>, source: candle_core::Error) -> Self {
        NnError::Tensor {
            context: context.into(),
            source,
        }
    }
}

impl From<StageError> for NnError {
    fn from(e: StageError) -> Self {
        NnError::Stage(e.0)
    }
}

impl From<NnError> for StageError {
    fn from(e: NnError) -> Self {
        StageError(e.to_string())
    }
}

/// Adds context to candle results.
pub(crate) trait TensorContext<T> {
    /// Maps a candle error into [`NnError::Tensor`] with `context`.
    fn ctx(self, context: &str) -> Result<T, NnError>;
}

impl<T> TensorContext<T> for candle_core::Result<T> {
    fn ctx(self, context: &str) -> Result<T, NnError> {
        self.map_err(|e| NnError::tensor(context, e))
    }
}

impl From<dualpipe_runtime::RuntimeError> for NnError {
    fn from(err: dualpipe_runtime::RuntimeError) -> Self {
        NnError::Runtime(err)
    }
}
