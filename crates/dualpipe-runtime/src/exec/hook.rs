//! What a step tells its caller while it runs: [`StepHook`], called on each rank's thread
//! right after the last op that computes a stage's weight gradients (so a data-parallel
//! exchange can start that stage's buckets while the rest of the pipeline computes), and
//! between ops (so in-flight exchanges make progress on the same thread).

use std::collections::HashMap;

use dualpipe_schedule::Op;

use crate::StageError;

/// Hears a step's per-stage completion on each rank's own thread (the same mechanism for
/// [`run_step`](crate::run_step)'s threads and for one rank per process,
/// [`run_rank_step`](crate::run_rank_step)).
pub trait StepHook<S>: Sync {
    /// Stage (`dir`, `stage`) of `rank` has run the step's last op that computes its weight
    /// gradients (its last `W`, `B` or the backward half of an `FB`): `copy`'s gradients are
    /// final for the step. Called once per stage per step, right after that op. An error
    /// fails the step as a stage error would.
    fn stage_done(&self, rank: usize, dir: usize, stage: usize, copy: &S)
        -> Result<(), StageError>;

    /// Called on `rank`'s thread after every op of its program (e.g. to make progress on
    /// exchanges started by [`StepHook::stage_done`]). Never waits.
    fn between_ops(&self, _rank: usize) -> Result<(), StageError> {
        Ok(())
    }
}

/// The hook that does nothing: a step without a listener.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHook;

impl<S> StepHook<S> for NoHook {
    fn stage_done(&self, _: usize, _: usize, _: usize, _: &S) -> Result<(), StageError> {
        Ok(())
    }
}

/// For every stage (`dir`, `stage`) that `program` computes weight gradients of, the index of
/// the last op that does: `W(c)`, `B(c)` or an `FB` whose backward half is `c`.
pub fn last_weight_ops(program: &[Op]) -> HashMap<(usize, usize), usize> {
    let mut last = HashMap::new();
    for (i, op) in program.iter().enumerate() {
        let chunk = match *op {
            Op::W(c) | Op::B(c) => c,
            Op::FB { b, .. } => b,
            _ => continue,
        };
        last.insert((chunk.dir, chunk.stage), i);
    }
    last
}
