//! [`CustomWorkload`]: a user's model as the trainer's [`Workload::Custom`](crate::Workload):
//! how to build each stage copy, and the batches the caller gives step by step.

use std::fmt;
use std::sync::{Arc, Mutex};

use dualpipe_nn::{ModelStage, NnError, StagePosition, StepBatch};

use crate::error::TrainError;

/// Builds the copy of one model stage (called for every copy the run holds: DualPipe's two
/// per stage, each data-parallel replica's); every call for one model stage must give the
/// same initial weights.
pub type StageFactory = dyn Fn(StagePosition) -> Result<ModelStage, NnError> + Send + Sync;

/// The step's batches, one per data-parallel replica, with the step they belong to.
type Slot = Option<(usize, Vec<StepBatch>)>;

/// A user's model: its stage factory and the current step's batches (shared by every
/// replica's trainer; cloning shares them).
#[derive(Clone)]
pub struct CustomWorkload {
    stages: Arc<StageFactory>,
    batches: Arc<Mutex<Slot>>,
}

impl fmt::Debug for CustomWorkload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomWorkload").finish_non_exhaustive()
    }
}

impl CustomWorkload {
    /// A model whose stage copies `stages` builds.
    pub fn new(
        stages: impl Fn(StagePosition) -> Result<ModelStage, NnError> + Send + Sync + 'static,
    ) -> Self {
        CustomWorkload {
            stages: Arc::new(stages),
            batches: Arc::new(Mutex::new(None)),
        }
    }

    /// Gives step `step` its batches, `per_replica[d]` replica `d`'s.
    pub fn set_batches(&self, step: usize, per_replica: Vec<StepBatch>) {
        *self.batches.lock().unwrap_or_else(|e| e.into_inner()) = Some((step, per_replica));
    }

    /// The copy at `position`.
    pub fn stage(&self, position: StagePosition) -> Result<ModelStage, TrainError> {
        Ok((self.stages)(position)?)
    }

    /// Replica `replica`'s batch of step `step`, if it was given.
    pub fn batch(&self, step: usize, replica: usize) -> Result<StepBatch, TrainError> {
        let slot = self.batches.lock().unwrap_or_else(|e| e.into_inner());
        match &*slot {
            Some((s, batches)) if *s == step => batches.get(replica).cloned().ok_or_else(|| {
                TrainError::Execution(format!("step {step} has no batch for replica {replica}"))
            }),
            _ => Err(TrainError::Execution(format!(
                "no batch was given for step {step}: a user's model takes its batch with each step"
            ))),
        }
    }
}
