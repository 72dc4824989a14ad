//! The `zb1p` generator: zero-bubble ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism").
//!
//! The backward is split into `I` (input gradient, on the critical path) and `W` (weight
//! gradient, needed by nobody before the optimizer step). Rank `r` runs stage `r`:
//!
//! * 1F1B's warm-up: `min(ranks - 1 - r, micro_batches)` forwards;
//! * steady state: one forward, one `I`, and the `W` of the micro-batch `r` places back (rank
//!   `r` defers `r` weight gradients);
//! * cool-down: the remaining `I`s, each followed by the oldest deferred `W`;
//! * the deferred `W`s, which fill the tail where 1F1B's later ranks sit idle while the
//!   gradients travel back to rank 0.
//!
//! Every rank keeps at most `ranks` micro-batches live (from `F` to `W`): 1F1B's peak, reached
//! there by rank 0 only. With `F`, `B` and `W` durations and free communication the bubble per
//! rank is `(ranks - 1)(F + B - 2W)` (1F1B: `(ranks - 1)(F + B)`): the `I`s travel faster than
//! full backwards, and the deferred `W`s fill the tail. Any `ranks >= 1` and
//! `micro_batches >= 1`.

use std::collections::VecDeque;

use super::{check_common, single_direction};
use crate::{Chunk, Op, Schedule, ScheduleError, ScheduleKind};

/// Generates the compute-only `zb1p` schedule.
pub fn generate(ranks: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    check_common("zb1p", ranks, micro_batches, 1)?;
    let programs = (0..ranks)
        .map(|r| program(r, ranks, micro_batches))
        .collect();
    Ok(single_direction(
        ScheduleKind::Zb1p,
        ranks,
        micro_batches,
        1,
        programs,
    ))
}

/// Rank `r`'s ZB-H1 program: 1F1B's warm-up, then (F, I) pairs each followed by the `W` of the
/// micro-batch `r` places back, then the cool-down `I`s (each followed by a `W`), then the
/// deferred `W`s.
fn program(rank: usize, ranks: usize, micro_batches: usize) -> Vec<Op> {
    let chunk = |mb| Chunk::new(0, rank, mb);
    let warmup = (ranks - 1 - rank).min(micro_batches);
    let lag = rank;
    let mut ops = Vec::with_capacity(3 * micro_batches);
    let mut pending = VecDeque::with_capacity(lag + 1);
    let mut backward = |ops: &mut Vec<Op>, mb: usize| {
        ops.push(Op::I(chunk(mb)));
        pending.push_back(mb);
        if pending.len() > lag {
            if let Some(w) = pending.pop_front() {
                ops.push(Op::W(chunk(w)));
            }
        }
    };
    for mb in 0..warmup {
        ops.push(Op::F(chunk(mb)));
    }
    for mb in warmup..micro_batches {
        ops.push(Op::F(chunk(mb)));
        backward(&mut ops, mb - warmup);
    }
    for mb in micro_batches - warmup..micro_batches {
        backward(&mut ops, mb);
    }
    ops.extend(pending.into_iter().map(|mb| Op::W(chunk(mb))));
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Peak live micro-batches (F done, W or B not yet) of each rank.
    fn peaks(s: &Schedule) -> Vec<usize> {
        s.programs
            .iter()
            .map(|p| {
                let (mut live, mut peak) = (0usize, 0usize);
                for op in p {
                    match op {
                        Op::F(_) => live += 1,
                        Op::W(_) | Op::B(_) => live -= 1,
                        _ => {}
                    }
                    peak = peak.max(live);
                }
                peak
            })
            .collect()
    }

    /// The largest idle time of any rank when ops take `f`, `b - w` (I), `w` (W) and `b` (B)
    /// and messages are free: a list simulation of the compute-only programs.
    fn max_bubble(s: &Schedule, f: f64, b: f64, w: f64) -> f64 {
        use std::collections::HashMap;
        let ranks = s.ranks;
        let mut done: HashMap<(bool, usize, usize), f64> = HashMap::new();
        let (mut pc, mut clock, mut busy) = (vec![0; ranks], vec![0.0; ranks], vec![0.0; ranks]);
        let mut progress = true;
        while progress {
            progress = false;
            for r in 0..ranks {
                while let Some(op) = s.programs[r].get(pc[r]) {
                    let c = op.chunk().unwrap();
                    let (dep, dur, key) = match op {
                        Op::F(_) => (c.stage.checked_sub(1).map(|p| (false, p)), f, Some(false)),
                        Op::B(_) | Op::I(_) => (
                            (c.stage + 1 < ranks).then_some((true, c.stage + 1)),
                            if matches!(op, Op::B(_)) { b } else { b - w },
                            Some(true),
                        ),
                        _ => (None, w, None),
                    };
                    let ready = match dep {
                        None => 0.0,
                        Some((g, st)) => match done.get(&(g, st, c.mb)) {
                            Some(&t) => t,
                            None => break,
                        },
                    };
                    clock[r] = f64::max(clock[r], ready) + dur;
                    busy[r] += dur;
                    if let Some(g) = key {
                        done.insert((g, c.stage, c.mb), clock[r]);
                    }
                    pc[r] += 1;
                    progress = true;
                }
            }
        }
        let makespan = clock.iter().copied().fold(0.0, f64::max);
        busy.iter().map(|b| makespan - b).fold(0.0, f64::max)
    }

    #[test]
    fn bubble_is_zb_h1s() {
        for (ranks, mbs) in [(4, 8), (4, 16), (8, 32), (6, 13)] {
            for (f, b, w) in [(1.0, 2.0, 1.0), (1.0, 2.0, 0.5), (2.0, 3.0, 1.0)] {
                let zb = max_bubble(&generate(ranks, mbs).unwrap(), f, b, w);
                let one = max_bubble(
                    &super::super::one_f_one_b::generate(ranks, mbs).unwrap(),
                    f,
                    b,
                    w,
                );
                let p = (ranks - 1) as f64;
                assert!(
                    (one - p * (f + b)).abs() < 1e-9,
                    "1f1b {ranks}x{mbs}: {one}"
                );
                assert!(
                    (zb - p * (f + b - 2.0 * w)).abs() < 1e-9,
                    "zb1p {ranks}x{mbs} {f} {b} {w}: {zb}"
                );
            }
        }
    }

    #[test]
    fn same_peak_memory_as_1f1b_and_valid() {
        for ranks in 1..=8 {
            for mbs in 1..=3 * ranks {
                let s = generate(ranks, mbs).unwrap();
                crate::validate(&crate::lower(&s))
                    .unwrap_or_else(|e| panic!("{ranks} ranks, {mbs} mbs: {e}"));
                let one = super::super::one_f_one_b::generate(ranks, mbs).unwrap();
                let peak = peaks(&one).into_iter().max();
                assert_eq!(
                    peaks(&s).into_iter().max(),
                    peak,
                    "{ranks} ranks, {mbs} mbs"
                );
            }
        }
    }

    #[test]
    fn last_rank_defers_its_weight_gradients() {
        let s = generate(3, 4).unwrap();
        let c = |mb| Chunk::new(0, 2, mb);
        assert_eq!(
            s.programs[2],
            vec![
                Op::F(c(0)),
                Op::I(c(0)),
                Op::F(c(1)),
                Op::I(c(1)),
                Op::F(c(2)),
                Op::I(c(2)),
                Op::W(c(0)),
                Op::F(c(3)),
                Op::I(c(3)),
                Op::W(c(1)),
                Op::W(c(2)),
                Op::W(c(3))
            ]
        );
        // Rank 0 defers nothing.
        let c0 = |mb| Chunk::new(0, 0, mb);
        assert_eq!(
            &s.programs[0][..4],
            &[Op::F(c0(0)), Op::F(c0(1)), Op::F(c0(2)), Op::I(c0(0))]
        );
        assert_eq!(s.programs[0][4], Op::W(c0(0)));
    }
}
