//! [`ExchangeHook`]: the executor's hook that starts a replica's stage exchanges during the
//! pipeline, as soon as a stage's gradients are final.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dualpipe_nn::ModelStage;
use dualpipe_runtime::{StageError, StepHook};

use super::exchange::Slot;
use super::grads::lock_error;
use crate::error::TrainError;

/// The executor's [`StepHook`] for one replica's step ([`ReplicaExchange::hook`]): on the
/// rank's own thread, right after a stage copy's last weight-gradient op, it takes a copy of
/// its gradients; once every held copy of the stage has reported, it sums them (lowest
/// direction first) and starts the stage's buckets (they send at once and never wait). After
/// every op it makes progress on the exchanges that rank started (takes arrivals, reduces
/// complete shards, sends results). The same calls serve local threads and one rank per
/// process (under MPI all of them come from the thread that initialised it).
pub struct ExchangeHook {
    pub(super) slots: Arc<[Slot]>,
    pub(super) started: Arc<AtomicUsize>,
    pub(super) active: bool,
    pub(super) step: u64,
}

impl std::fmt::Debug for ExchangeHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExchangeHook")
            .field("step", &self.step)
            .field("active", &self.active)
            .finish()
    }
}

impl StepHook<ModelStage> for ExchangeHook {
    fn stage_done(
        &self,
        rank: usize,
        _dir: usize,
        _stage: usize,
        copy: &ModelStage,
    ) -> Result<(), StageError> {
        if !self.active {
            return Ok(());
        }
        let stage = copy.model_stage();
        let Some(slot) = self.slots.iter().find(|s| s.stage == stage) else {
            return Err(StageError(format!(
                "model stage {stage} has no data-parallel group"
            )));
        };
        let fail = |e: TrainError| StageError(e.to_string());
        let mut state = slot.state.lock().map_err(|_| fail(lock_error(stage)))?;
        let snapshot = state.grads.snapshot(copy).map_err(fail)?;
        state.done.push((copy.dir(), snapshot));
        if state.done.len() < state.copies {
            return Ok(());
        }
        // Every held copy is final: their sum, lowest direction first, starts the buckets.
        let mut done = std::mem::take(&mut state.done);
        done.sort_by_key(|(dir, _)| *dir);
        let copies = done.into_iter().map(|(_, c)| c).collect();
        state.grads.start(self.step, copies).map_err(fail)?;
        state.started_by = Some(rank);
        self.started.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn between_ops(&self, rank: usize) -> Result<(), StageError> {
        if !self.active {
            return Ok(());
        }
        for slot in self.slots.iter() {
            // Only the rank that started an exchange makes progress on it during the
            // pipeline; a slot another rank holds at the moment is skipped, not waited for.
            let Ok(mut state) = slot.state.try_lock() else {
                continue;
            };
            if state.started_by == Some(rank) {
                state
                    .grads
                    .progress()
                    .map_err(|e| StageError(e.to_string()))?;
            }
        }
        Ok(())
    }
}
