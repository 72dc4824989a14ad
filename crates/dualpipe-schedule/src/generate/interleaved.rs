//! The `interleaved` generator: Megatron's interleaved 1F1B over `virtual_stages` stages per
//! rank.
//!
//! The model is cut into `ranks x V` stages; stage `s` runs on rank `s % ranks`, so rank `r`
//! holds stages `r, r + ranks, r + 2 ranks, ...` (its `V` *virtual stages*). Micro-batches
//! move in groups of `ranks`: a rank runs the forwards of one group through its first virtual
//! stage, then the same group through its second, and so on; backwards run in the same order
//! with the virtual stages reversed. Rank `r` warms up with `2 (ranks - r - 1) + (V - 1) ranks`
//! forwards, then alternates one forward and one backward, then drains.
//!
//! Micro-batch counts: Megatron asks for a multiple of `ranks`, and for those the programs are
//! exactly Megatron's. We take any `micro_batches >= 1`: the last group is then smaller (or the
//! only group, with fewer micro-batches than ranks), and Megatron's warm-up can leave a rank
//! waiting for a gradient while the others wait for its next forward. Such ranks get one more
//! warm-up forward at a time, found with the validator's execution check, until the schedule
//! runs; it always ends, since a warm-up of every forward runs. `virtual_stages = 1` is plain
//! 1F1B.

use super::one_f_one_b::one_f_one_b_program;
use super::{check_common, single_direction};
use crate::validate::stuck_ranks;
use crate::{Chunk, Op, Schedule, ScheduleError, ScheduleKind};

/// Generates the compute-only interleaved 1F1B schedule with `virtual_stages` stages per rank.
pub fn generate(
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Result<Schedule, ScheduleError> {
    check_common("interleaved", ranks, micro_batches, virtual_stages)?;
    if virtual_stages == 1 {
        let programs = (0..ranks)
            .map(|r| one_f_one_b_program(r, ranks, micro_batches, |mb| Chunk::new(0, r, mb), false))
            .collect();
        return Ok(single_direction(
            ScheduleKind::Interleaved,
            ranks,
            micro_batches,
            1,
            programs,
        ));
    }
    let total = micro_batches * virtual_stages;
    let mut warmup: Vec<usize> = (0..ranks)
        .map(|r| (2 * (ranks - r - 1) + (virtual_stages - 1) * ranks).min(total))
        .collect();
    loop {
        let programs = (0..ranks)
            .map(|r| program(r, ranks, micro_batches, virtual_stages, warmup[r]))
            .collect();
        let schedule = single_direction(
            ScheduleKind::Interleaved,
            ranks,
            micro_batches,
            virtual_stages,
            programs,
        );
        // Megatron's warm-up runs as is when every group is full. With a smaller last group (or
        // fewer micro-batches than ranks) a rank may wait for a gradient while others wait for
        // its next forward: give each such rank one more warm-up forward and try again. With
        // every forward in the warm-up the schedule runs (all ranks follow one order of
        // (virtual stage, micro-batch)), so this ends.
        let stuck = stuck_ranks(&schedule);
        let mut grew = false;
        for (r, pc) in stuck {
            if matches!(schedule.programs[r][pc], Op::B(_)) && warmup[r] < total {
                warmup[r] += 1;
                grew = true;
            }
        }
        if !grew {
            return Ok(schedule);
        }
    }
}

/// The (virtual stage, micro-batch) of a rank's `k`-th forward (or, with `reverse`, backward).
fn order(k: usize, ranks: usize, micro_batches: usize, v: usize, reverse: bool) -> (usize, usize) {
    let group = k / (ranks * v);
    let first = group * ranks;
    let size = ranks.min(micro_batches - first);
    let j = k - group * ranks * v;
    let chunk = j / size;
    let chunk = if reverse { v - 1 - chunk } else { chunk };
    (chunk, first + j % size)
}

fn program(rank: usize, ranks: usize, micro_batches: usize, v: usize, warmup: usize) -> Vec<Op> {
    let total = micro_batches * v;
    let chunk = |k: usize, reverse: bool| {
        let (vs, mb) = order(k, ranks, micro_batches, v, reverse);
        Chunk::new(0, vs * ranks + rank, mb)
    };
    let mut ops = Vec::with_capacity(2 * total);
    for k in 0..warmup {
        ops.push(Op::F(chunk(k, false)));
    }
    for k in warmup..total {
        ops.push(Op::F(chunk(k, false)));
        ops.push(Op::B(chunk(k - warmup, true)));
    }
    for k in total - warmup..total {
        ops.push(Op::B(chunk(k, true)));
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_order() {
        let s = generate(2, 4, 2).unwrap();
        let f = |st, mb| Op::F(Chunk::new(0, st, mb));
        let b = |st, mb| Op::B(Chunk::new(0, st, mb));
        // Rank 0 holds stages 0 and 2; warm-up 2 + 2 = 4 forwards.
        assert_eq!(
            s.programs[0],
            vec![
                f(0, 0),
                f(0, 1),
                f(2, 0),
                f(2, 1),
                f(0, 2),
                b(2, 0),
                f(0, 3),
                b(2, 1),
                f(2, 2),
                b(0, 0),
                f(2, 3),
                b(0, 1),
                b(2, 2),
                b(2, 3),
                b(0, 2),
                b(0, 3)
            ]
        );
        assert_eq!(s.placement.rank_of, vec![vec![0, 1, 0, 1]]);
    }

    #[test]
    fn multiples_of_ranks_keep_megatrons_warm_up() {
        for ranks in 1..=6 {
            for v in 2..=3 {
                for groups in 1..=3 {
                    let mbs = groups * ranks;
                    let s = generate(ranks, mbs, v).unwrap();
                    for (r, p) in s.programs.iter().enumerate() {
                        let warmup = p.iter().position(|op| matches!(op, Op::B(_))).unwrap();
                        let megatron = (2 * (ranks - r - 1) + (v - 1) * ranks).min(mbs * v);
                        // The first backward follows the warm-up and one more forward.
                        assert_eq!(
                            warmup,
                            (megatron + 1).min(mbs * v),
                            "{ranks} {mbs} {v} rank {r}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn any_count_from_ranks_up_validates() {
        for ranks in 1..=6 {
            for v in 1..=4 {
                for mbs in 1..=3 * ranks + 1 {
                    let s = generate(ranks, mbs, v).unwrap();
                    crate::validate(&crate::lower(&s))
                        .unwrap_or_else(|e| panic!("{ranks} ranks, {mbs} mbs, v {v}: {e}"));
                }
            }
        }
    }
}
