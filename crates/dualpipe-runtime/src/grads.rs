//! Summing the gradients of stages that exist on several ranks (DualPipe's two copies).

use std::panic::{catch_unwind, AssertUnwindSafe};

use dualpipe_schedule::StagePlacement;

use crate::error::panic_message;
use crate::{RankStages, RuntimeError, Stage};

/// Sums the gradients of every stage's copies so that all copies hold the same total.
///
/// DualPipe runs stage `s` of direction 0 on rank `s` and stage `s` of direction 1 on rank
/// `ranks - 1 - s`: two copies of one set of weights, each with the gradients of its own half
/// of the micro-batches. Call this after [`run_step`](crate::run_step) and before the
/// optimizer step: it snapshots every copy's [`Stage::gradients`] first, then adds the other
/// copies' snapshots into each with [`Stage::add_gradients`], so the copies stay identical
/// after identical optimizer updates. Stages with a single copy are left alone; for a
/// single-direction schedule this does nothing.
pub fn sum_stage_copies<S: Stage>(
    placement: &StagePlacement,
    ranks: &mut [RankStages<S>],
) -> Result<(), RuntimeError> {
    for stage in 0..placement.stages() {
        let copies: Vec<(usize, usize)> = (0..placement.dirs())
            .map(|dir| (placement.rank(dir, stage), dir))
            .collect();
        if copies.len() < 2 {
            continue;
        }
        let mut snapshots = Vec::with_capacity(copies.len());
        for &(rank, dir) in &copies {
            let copy = ranks
                .get(rank)
                .and_then(|r| r.get(dir, stage))
                .ok_or_else(|| missing(rank, dir, stage))?;
            snapshots.push(copy.gradients());
        }
        for (i, &(rank, dir)) in copies.iter().enumerate() {
            let copy = ranks[rank]
                .get_mut(dir, stage)
                .ok_or_else(|| missing(rank, dir, stage))?;
            for (j, snapshot) in snapshots.iter().enumerate() {
                if i == j {
                    continue;
                }
                let op = format!("add_gradients (dir {dir}, stage {stage})");
                match catch_unwind(AssertUnwindSafe(|| copy.add_gradients(snapshot))) {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => {
                        return Err(RuntimeError::StageFailed {
                            rank,
                            op,
                            cause: err.0,
                        })
                    }
                    Err(payload) => {
                        return Err(RuntimeError::StagePanicked {
                            rank,
                            op,
                            message: panic_message(payload.as_ref()),
                        })
                    }
                }
            }
        }
    }
    Ok(())
}

fn missing(rank: usize, dir: usize, stage: usize) -> RuntimeError {
    RuntimeError::Setup(format!(
        "rank {rank} has no stage for (dir {dir}, stage {stage}); build the stages with \
         build_ranks(&schedule.placement, ..)"
    ))
}
