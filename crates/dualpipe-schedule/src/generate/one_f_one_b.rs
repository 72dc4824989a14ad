//! The `1f1b` generator: one forward, one backward, after a warm-up.

use super::{check_common, single_direction};
use crate::{Chunk, Op, Schedule, ScheduleError, ScheduleKind};

/// Generates the compute-only `1f1b` schedule (PipeDream-Flush / Megatron's non-interleaved
/// schedule).
///
/// Rank `r` runs stage `r`: `min(ranks - 1 - r, micro_batches)` warm-up forwards, then
/// alternates one forward and one full backward, then drains the remaining backwards. At most
/// `ranks - r` micro-batches are live on rank `r`. Any `ranks >= 1` and `micro_batches >= 1`.
pub fn generate(ranks: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    check_common("1f1b", ranks, micro_batches, 1)?;
    let programs = (0..ranks)
        .map(|r| one_f_one_b_program(r, ranks, micro_batches, |mb| Chunk::new(0, r, mb), false))
        .collect();
    Ok(single_direction(
        ScheduleKind::OneFOneB,
        ranks,
        micro_batches,
        1,
        programs,
    ))
}

/// One rank's 1F1B program: warm-up forwards, steady (F, backward) pairs, cool-down backwards.
/// `chunk(mb)` names the rank's chunk of a micro-batch; `split` emits `I` + `W` instead of `B`.
pub(super) fn one_f_one_b_program(
    rank: usize,
    ranks: usize,
    micro_batches: usize,
    chunk: impl Fn(usize) -> Chunk,
    split: bool,
) -> Vec<Op> {
    let warmup = (ranks - 1 - rank).min(micro_batches);
    let mut ops = Vec::with_capacity(micro_batches * (2 + usize::from(split)));
    let bwd = |ops: &mut Vec<Op>, mb: usize| {
        if split {
            ops.push(Op::I(chunk(mb)));
            ops.push(Op::W(chunk(mb)));
        } else {
            ops.push(Op::B(chunk(mb)));
        }
    };
    for mb in 0..warmup {
        ops.push(Op::F(chunk(mb)));
    }
    for mb in warmup..micro_batches {
        ops.push(Op::F(chunk(mb)));
        bwd(&mut ops, mb - warmup);
    }
    for mb in micro_batches - warmup..micro_batches {
        bwd(&mut ops, mb);
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_up_then_alternate() {
        let s = generate(3, 4).unwrap();
        let c = |mb| Chunk::new(0, 0, mb);
        assert_eq!(
            s.programs[0],
            vec![
                Op::F(c(0)),
                Op::F(c(1)),
                Op::F(c(2)),
                Op::B(c(0)),
                Op::F(c(3)),
                Op::B(c(1)),
                Op::B(c(2)),
                Op::B(c(3))
            ]
        );
        crate::validate(&s).unwrap();
        crate::validate(&crate::lower(&s)).unwrap();
    }

    #[test]
    fn fewer_micro_batches_than_ranks() {
        let s = generate(5, 2).unwrap();
        crate::validate(&crate::lower(&s)).unwrap();
    }
}
