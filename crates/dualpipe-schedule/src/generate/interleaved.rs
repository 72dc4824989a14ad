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
//! exactly Megatron's. For any other `micro_batches >= 1` we walk Megatron's programs for the
//! next multiple of `ranks` and drop every op of the micro-batches that do not exist, taking
//! them from the front of the first group: the first group is the short one, and micro-batch
//! `m` of the walk becomes `m - missing`. Dropping whole micro-batches removes waits but adds
//! none, so the result runs wherever Megatron's does, and no rank holds more activations than
//! Megatron's schedule for the next multiple. A short group stalls a rank where it turns to
//! its next virtual stage before the group's first micro-batch is back from the last rank;
//! short-first costs less than short-last, where those stalls fall into the steady phase
//! (measured with `dualpipe simulate`, see docs/schedules.md). `virtual_stages = 1` is plain
//! 1F1B.

use std::iter::Peekable;

use super::one_f_one_b::one_f_one_b_program;
use super::{check_common, single_direction};
use crate::{Chunk, Op, Schedule, ScheduleError, ScheduleKind};

/// Generates the compute-only interleaved 1F1B schedule with `virtual_stages` stages per rank.
///
/// For a multiple of `ranks` micro-batches this is Megatron's schedule; for other counts it is
/// Megatron's schedule for the next multiple without the micro-batches that do not exist (see
/// the module documentation). Runs in time linear in the ops it emits.
pub fn generate(
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Result<Schedule, ScheduleError> {
    check_common("interleaved", ranks, micro_batches, virtual_stages)?;
    let programs = if virtual_stages == 1 {
        (0..ranks)
            .map(|r| one_f_one_b_program(r, ranks, micro_batches, |mb| Chunk::new(0, r, mb), false))
            .collect()
    } else {
        let walk = Walk::new(ranks, micro_batches, virtual_stages);
        (0..ranks).map(|r| walk.program(r)).collect()
    };
    let schedule = single_direction(
        ScheduleKind::Interleaved,
        ranks,
        micro_batches,
        virtual_stages,
        programs,
    );
    Ok(schedule)
}

/// Megatron's interleaved order for `padded` micro-batches (the next multiple of `ranks`), of
/// which the first `missing` do not exist.
///
/// A rank's forwards and backwards are each numbered by a *slot* `0 .. padded x v`: slot `k`
/// is virtual stage `(k mod ranks v) / ranks` (reversed for backwards) of micro-batch
/// `ranks (k / ranks v) + k mod ranks` of the walk.
struct Walk {
    ranks: usize,
    v: usize,
    padded: usize,
    missing: usize,
}

impl Walk {
    fn new(ranks: usize, micro_batches: usize, v: usize) -> Self {
        let padded = micro_batches.div_ceil(ranks) * ranks;
        Walk {
            ranks,
            v,
            padded,
            missing: padded - micro_batches,
        }
    }

    /// Slots in the walk, `padded x v`.
    fn slots(&self) -> usize {
        self.padded * self.v
    }

    /// The slots of micro-batches that exist, in increasing order: the missing ones are the
    /// first `missing` positions of every virtual stage of the first group.
    fn real_slots(&self) -> impl Iterator<Item = usize> + '_ {
        let (ranks, missing) = (self.ranks, self.missing);
        (0..self.v)
            .flat_map(move |c| c * ranks + missing..(c + 1) * ranks)
            .chain(ranks * self.v..self.slots())
    }

    /// The (virtual stage, micro-batch) of slot `k`; `reverse` for backwards.
    fn at(&self, k: usize, reverse: bool) -> (usize, usize) {
        let per_group = self.ranks * self.v;
        let (group, j) = (k / per_group, k % per_group);
        let chunk = j / self.ranks;
        let chunk = if reverse { self.v - 1 - chunk } else { chunk };
        let mb = group * self.ranks + j % self.ranks;
        debug_assert!(
            mb >= self.missing,
            "slot {k} belongs to a dropped micro-batch"
        );
        (chunk, mb - self.missing)
    }

    /// Rank `rank`'s program: Megatron's program for the walk, ops of missing micro-batches
    /// left out.
    fn program(&self, rank: usize) -> Vec<Op> {
        let total = self.slots();
        let warmup = (2 * (self.ranks - rank - 1) + (self.v - 1) * self.ranks).min(total);
        // Position in Megatron's program of the forward / backward of slot `k`: `warmup`
        // forwards, then (forward k, backward k - warmup) pairs, then the remaining backwards.
        // Both are increasing in `k`, so the program is a merge of the two slot lists.
        let f_pos = |k: usize| if k < warmup { k } else { 2 * k - warmup };
        let b_pos = |k: usize| {
            if k + warmup < total {
                2 * k + warmup + 1
            } else {
                k + total
            }
        };
        let chunk = |k: usize, reverse: bool| {
            let (vs, mb) = self.at(k, reverse);
            Chunk::new(0, vs * self.ranks + rank, mb)
        };
        let mut fwd: Peekable<_> = self.real_slots().peekable();
        let mut bwd: Peekable<_> = self.real_slots().peekable();
        let mut ops = Vec::with_capacity(2 * (self.padded - self.missing) * self.v);
        loop {
            let op = match (fwd.peek(), bwd.peek()) {
                (Some(&f), Some(&b)) if f_pos(f) < b_pos(b) => {
                    fwd.next();
                    Op::F(chunk(f, false))
                }
                (Some(&f), None) => {
                    fwd.next();
                    Op::F(chunk(f, false))
                }
                (_, Some(&b)) => {
                    bwd.next();
                    Op::B(chunk(b, true))
                }
                (None, None) => break,
            };
            ops.push(op);
        }
        ops
    }
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
