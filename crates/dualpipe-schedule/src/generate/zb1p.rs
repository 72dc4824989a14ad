//! The `zb1p` generator: zero-bubble ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism").
//!
//! The backward is split into `I` (input gradient, on the critical path) and `W` (weight
//! gradient, free to move). Rank `r` runs stage `r` and keeps at most `ranks - r` micro-batches
//! live (from their `F` to their `W`), exactly 1F1B's peak, so the memory is the same; the `W`s
//! fill what would be bubbles in 1F1B (above all the cool-down, where a rank waits for
//! gradients).
//!
//! The order comes from a list scheduler on unit-time ops (F = I = W = 1): at every step each
//! rank runs, in priority, an `I` whose gradient has arrived, else an `F` whose input has
//! arrived while fewer than `ranks - r` micro-batches are live, else its oldest pending `W`.
//! The programs are those orders. Because they come from a timed run that respects every
//! dependency, they run to completion under any op durations (the validator checks it). Any
//! `ranks >= 1` and `micro_batches >= 1`.

use std::collections::VecDeque;

use super::{check_common, single_direction};
use crate::{Chunk, Op, Schedule, ScheduleError, ScheduleKind};

/// Generates the compute-only `zb1p` schedule.
pub fn generate(ranks: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    check_common("zb1p", ranks, micro_batches, 1)?;
    const NEVER: usize = usize::MAX;
    let m = micro_batches;
    // Tick at which each (rank, mb)'s F and I finished (NEVER: not yet).
    let mut f_done = vec![NEVER; ranks * m];
    let mut i_done = vec![NEVER; ranks * m];
    let mut next_f = vec![0usize; ranks];
    let mut next_i = vec![0usize; ranks];
    let mut pending_w: Vec<VecDeque<usize>> = vec![VecDeque::new(); ranks];
    let mut live = vec![0usize; ranks];
    let mut programs: Vec<Vec<Op>> = (0..ranks).map(|_| Vec::with_capacity(3 * m)).collect();
    let mut remaining = 3 * ranks * m;
    let mut tick = 0usize;
    while remaining > 0 {
        let mut progressed = false;
        for r in 0..ranks {
            let chunk = |mb| Chunk::new(0, r, mb);
            let arrived = |t: usize| t != NEVER && t < tick;
            let i_ready = next_i[r] < m && {
                let mb = next_i[r];
                arrived(f_done[r * m + mb]) && (r + 1 == ranks || arrived(i_done[(r + 1) * m + mb]))
            };
            let f_ready = next_f[r] < m
                && live[r] < ranks - r
                && (r == 0 || arrived(f_done[(r - 1) * m + next_f[r]]));
            if i_ready {
                let mb = next_i[r];
                programs[r].push(Op::I(chunk(mb)));
                i_done[r * m + mb] = tick;
                pending_w[r].push_back(mb);
                next_i[r] += 1;
            } else if f_ready {
                let mb = next_f[r];
                programs[r].push(Op::F(chunk(mb)));
                f_done[r * m + mb] = tick;
                live[r] += 1;
                next_f[r] += 1;
            } else if let Some(mb) = pending_w[r].pop_front() {
                programs[r].push(Op::W(chunk(mb)));
                live[r] -= 1;
            } else {
                continue;
            }
            remaining -= 1;
            progressed = true;
        }
        if !progressed && remaining > 0 && tick > 0 {
            // Every rank idle although every in-flight op has finished: cannot happen for
            // this schedule; refuse rather than loop.
            return Err(ScheduleError::InvalidConfig(format!(
                "zb1p could not be scheduled for {ranks} ranks and {micro_batches} micro-batches"
            )));
        }
        tick += 1;
    }
    Ok(single_direction(
        ScheduleKind::Zb1p,
        ranks,
        micro_batches,
        1,
        programs,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Peak live micro-batches (F done, W not yet) of each rank.
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

    #[test]
    fn same_peak_memory_as_1f1b_and_valid() {
        for ranks in 1..=8 {
            for mbs in 1..=3 * ranks {
                let s = generate(ranks, mbs).unwrap();
                crate::validate(&crate::lower(&s))
                    .unwrap_or_else(|e| panic!("{ranks} ranks, {mbs} mbs: {e}"));
                let one = super::super::one_f_one_b::generate(ranks, mbs).unwrap();
                assert_eq!(peaks(&s), peaks(&one), "{ranks} ranks, {mbs} mbs");
            }
        }
    }

    #[test]
    fn last_rank_runs_f_i_w() {
        let s = generate(3, 3).unwrap();
        let c = |mb| Chunk::new(0, 2, mb);
        assert_eq!(
            s.programs[2],
            vec![
                Op::F(c(0)),
                Op::I(c(0)),
                Op::W(c(0)),
                Op::F(c(1)),
                Op::I(c(1)),
                Op::W(c(1)),
                Op::F(c(2)),
                Op::I(c(2)),
                Op::W(c(2))
            ]
        );
    }
}
