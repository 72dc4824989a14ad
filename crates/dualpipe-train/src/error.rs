//! The one error type of this crate.

use dualpipe_nn::NnError;
use dualpipe_runtime::RuntimeError;
use dualpipe_schedule::ScheduleError;

/// Anything that can go wrong while setting up or running training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The configuration is not usable; the message names the field (or flag) and a valid value.
    #[error("invalid training configuration: {0}")]
    Config(String),
    /// The schedule could not be built for this configuration, or a given schedule does not fit.
    #[error("cannot build the schedule: {0}")]
    Schedule(#[from] ScheduleError),
    /// The model failed (a tensor operation, a stage driven out of order).
    #[error(transparent)]
    Model(#[from] NnError),
    /// The runtime's executor failed (a rank's stage failed, a message never arrived, a peer
    /// process failed).
    // Not `#[from]`: the message already holds the runtime's, so it is not repeated as a
    // source in `{:#}` chains.
    #[error("pipeline execution failed: {0}")]
    Runtime(RuntimeError),
    /// The step's results are not usable (a stage left state behind, a loss is missing, an
    /// earlier step failed).
    #[error("pipeline step failed: {0}")]
    Execution(String),
    /// The loss stopped being a finite number.
    #[error("{0}")]
    Diverged(Divergence),
    /// The final weights hold a value that is not a finite number (a diverged run): they are
    /// not saved.
    #[error("the run diverged: the final weights hold a value that is not a finite number (inf or NaN) in the tensor {tensor}")]
    NonFiniteWeights {
        /// The first such tensor.
        tensor: String,
    },
    /// A signal (Ctrl-C, SIGTERM) stopped the run at a step boundary.
    #[error("interrupted by signal {signal} after step {step}")]
    Interrupted {
        /// Steps done.
        step: usize,
        /// The signal's number.
        signal: i32,
    },
    /// The run's step callback asked it to stop, with this reason (the other ranks are told).
    #[error("{0}")]
    Stopped(String),
    /// The data-parallel gradient exchange failed (a replica that stopped, a timeout, a
    /// message of the wrong step).
    #[error("gradient exchange failed: {0}")]
    Exchange(#[from] dualpipe_dp::DpError),
    /// A checkpoint could not be written, found or read, or does not fit the run.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
}

/// A loss that is no longer a finite number, and what it says about the cause.
#[derive(Clone, Debug, PartialEq)]
pub struct Divergence {
    /// The step (0 for the first).
    pub step: usize,
    /// The loss (infinite or NaN).
    pub loss: f64,
    /// The learning rate of the run.
    pub lr: f64,
}

impl Divergence {
    /// Whether the loss was computed before any optimizer update: the first step's loss
    /// comes from the initial weights and the data alone, so the learning rate is not to blame.
    pub fn before_any_update(&self) -> bool {
        self.step == 0
    }
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.before_any_update() {
            write!(
                f,
                "the loss of step 1 is {}, before any update: the inputs or the initial weights \
                 overflow the element type (try f64 or a smaller width)",
                self.loss
            )
        } else {
            write!(
                f,
                "training diverged at step {}: the loss is {}; lower the learning rate (now {:e})",
                self.step + 1,
                self.loss,
                self.lr
            )
        }
    }
}

impl From<RuntimeError> for TrainError {
    fn from(err: RuntimeError) -> Self {
        TrainError::Runtime(err)
    }
}
