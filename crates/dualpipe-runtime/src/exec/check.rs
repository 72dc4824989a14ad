//! Checks, before any thread starts, that a schedule and the stages fit together.
//!
//! This is not the schedule validator (dependencies and deadlock freedom are its job); it
//! catches what would otherwise surface as a confusing failure mid-step: a wrong number of
//! ranks, a missing stage, a peer that contradicts the placement, a schedule that was never
//! lowered.

use std::collections::HashSet;

use dualpipe_schedule::ir::Neighbour;
use dualpipe_schedule::{Chunk, Op, Schedule};

use super::types::{describe, RankStages};
use crate::RuntimeError;

/// Every rule the executor relies on; the first broken one as a [`RuntimeError::Setup`].
pub(crate) fn check_setup<S>(
    schedule: &Schedule,
    ranks: &[RankStages<S>],
) -> Result<(), RuntimeError> {
    check(schedule, ranks.len(), |rank, dir, stage| {
        ranks[rank].get(dir, stage).is_some()
    })
}

/// The same rules for one rank of a multi-process run, which holds only its own stages.
pub(crate) fn check_rank_setup<S>(
    schedule: &Schedule,
    rank: usize,
    stages: &RankStages<S>,
) -> Result<(), RuntimeError> {
    if rank >= schedule.ranks {
        return Err(RuntimeError::Setup(format!(
            "this process is rank {rank}, but the schedule has {} ranks",
            schedule.ranks
        )));
    }
    check(schedule, schedule.ranks, |r, dir, stage| {
        r != rank || stages.get(dir, stage).is_some()
    })
}

/// The checks, with `given` ranks of stages and `has_stage(rank, dir, stage)` saying whether
/// a rank was given a stage.
fn check(
    schedule: &Schedule,
    given: usize,
    has_stage: impl Fn(usize, usize, usize) -> bool,
) -> Result<(), RuntimeError> {
    check_shape(schedule, given).map_err(RuntimeError::Setup)?;
    for (rank, program) in schedule.programs.iter().enumerate() {
        // Producer chunks whose output this program sends: (is_forward, chunk).
        let mut sends: HashSet<(bool, Chunk)> = HashSet::new();
        for op in program {
            match *op {
                Op::SendF { chunk, .. } => {
                    sends.insert((true, chunk));
                }
                Op::SendB { chunk, .. } => {
                    sends.insert((false, chunk));
                }
                _ => {}
            }
        }
        for op in program {
            check_chunks(schedule, rank, op, &has_stage)
                .and_then(|()| check_peer(schedule, op))
                .and_then(|()| check_sent(schedule, rank, op, &sends))
                .map_err(|msg| {
                    RuntimeError::Setup(format!("rank {rank}: {}: {msg}", describe(op)))
                })?;
        }
    }
    Ok(())
}

/// The schedule's own shape: ranks, programs and placement agree, and `given` ranks of
/// stages were given.
fn check_shape(schedule: &Schedule, given: usize) -> Result<(), String> {
    let placement = &schedule.placement;
    if schedule.ranks == 0 {
        return Err("the schedule has no ranks".into());
    }
    if schedule.programs.len() != schedule.ranks || placement.ranks != schedule.ranks {
        return Err(format!(
            "the schedule is inconsistent: {} ranks, {} programs, a placement over {} ranks",
            schedule.ranks,
            schedule.programs.len(),
            placement.ranks
        ));
    }
    if given != schedule.ranks {
        return Err(format!(
            "the schedule has {} ranks but stages were given for {given}; build them with \
             build_ranks(&schedule.placement, ..)",
            schedule.ranks,
        ));
    }
    let stages = placement.stages();
    if placement.dirs() == 0
        || stages == 0
        || placement.rank_of.iter().any(|row| row.len() != stages)
    {
        return Err("the placement has no stages or rows of different lengths".into());
    }
    if let Some(&bad) = placement
        .rank_of
        .iter()
        .flatten()
        .find(|&&r| r >= schedule.ranks)
    {
        return Err(format!(
            "the placement names rank {bad}, but the schedule has {} ranks",
            schedule.ranks
        ));
    }
    Ok(())
}

/// Every chunk of `op` on `rank` is in range, placed on `rank`, and has its stage there.
fn check_chunks(
    schedule: &Schedule,
    rank: usize,
    op: &Op,
    has_stage: impl Fn(usize, usize, usize) -> bool,
) -> Result<(), String> {
    let placement = &schedule.placement;
    let (dirs, stages) = (placement.dirs(), placement.stages());
    let per_dir = schedule.micro_batches_per_dir();
    let chunks: Vec<Chunk> = match *op {
        Op::FB { f, b } => vec![f, b],
        Op::Wait => vec![],
        _ => op.chunk().into_iter().collect(),
    };
    for c in chunks {
        if !(c.dir < dirs && c.stage < stages && c.mb < per_dir) {
            return Err(format!(
                "chunk out of range ({dirs} directions, {stages} stages, \
                 {per_dir} micro-batches per direction)"
            ));
        }
        if placement.rank(c.dir, c.stage) != rank {
            return Err(format!(
                "the placement puts (dir {}, stage {}) on rank {}, not here",
                c.dir,
                c.stage,
                placement.rank(c.dir, c.stage)
            ));
        }
        if !has_stage(rank, c.dir, c.stage) {
            return Err(format!(
                "no stage was given for (dir {}, stage {}) on this rank; build \
                 the stages with build_ranks(&schedule.placement, ..)",
                c.dir, c.stage
            ));
        }
    }
    Ok(())
}

/// A communication op's peer is the rank of the neighbouring stage it talks to.
fn check_peer(schedule: &Schedule, op: &Op) -> Result<(), String> {
    let Some(peer) = op.peer() else {
        return Ok(());
    };
    let placement = &schedule.placement;
    let neighbour = op
        .peer_side()
        .zip(op.chunk())
        .and_then(|(side, chunk)| placement.neighbour(chunk, side));
    let Some(n) = neighbour else {
        return Err("there is no neighbouring stage to talk to".into());
    };
    let expected = placement.rank(n.dir, n.stage);
    if peer != expected {
        return Err(format!(
            "the neighbouring stage (dir {}, stage {}) is on rank {expected}",
            n.dir, n.stage
        ));
    }
    Ok(())
}

/// The outputs of a compute op on `rank` that feed another rank are sent by its program
/// (`sends`: the (is_forward, chunk) outputs it sends).
fn check_sent(
    schedule: &Schedule,
    rank: usize,
    op: &Op,
    sends: &HashSet<(bool, Chunk)>,
) -> Result<(), String> {
    let mut outputs: Vec<(bool, Chunk)> = Vec::new();
    match *op {
        Op::F(c) => outputs.push((true, c)),
        Op::B(c) | Op::I(c) => outputs.push((false, c)),
        Op::FB { f, b } => outputs.extend([(true, f), (false, b)]),
        _ => {}
    }
    for (forward, c) in outputs {
        let side = if forward {
            Neighbour::Next
        } else {
            Neighbour::Prev
        };
        let Some(dst) = schedule.placement.neighbour_rank(c, side) else {
            continue;
        };
        if dst != rank && !sends.contains(&(forward, c)) {
            return Err(format!(
                "its output feeds rank {dst}, but the program has no {} {c} for \
                 it; lower the schedule first (dualpipe_schedule::build or lower)",
                if forward { "SEND_F" } else { "SEND_B" }
            ));
        }
    }
    Ok(())
}
