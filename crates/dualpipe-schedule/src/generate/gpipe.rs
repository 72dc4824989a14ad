//! The `gpipe` generator: every forward, then every backward.

use super::{check_common, single_direction};
use crate::{Chunk, Op, Schedule, ScheduleError, ScheduleKind};

/// Generates the compute-only `gpipe` schedule.
///
/// Rank `r` runs stage `r`: the forwards of micro-batches `0 .. micro_batches` in order, then
/// their full backwards in the same order. Any `ranks >= 1` and `micro_batches >= 1`; every
/// rank holds all `micro_batches` activations at its peak.
pub fn generate(ranks: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    check_common("gpipe", ranks, micro_batches, 1)?;
    let programs = (0..ranks)
        .map(|r| {
            let fwd = (0..micro_batches).map(|mb| Op::F(Chunk::new(0, r, mb)));
            let bwd = (0..micro_batches).map(|mb| Op::B(Chunk::new(0, r, mb)));
            fwd.chain(bwd).collect()
        })
        .collect();
    Ok(single_direction(
        ScheduleKind::GPipe,
        ranks,
        micro_batches,
        1,
        programs,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_forwards_then_all_backwards() {
        let s = generate(2, 3).unwrap();
        let c = |st, mb| Chunk::new(0, st, mb);
        assert_eq!(
            s.programs[1],
            vec![
                Op::F(c(1, 0)),
                Op::F(c(1, 1)),
                Op::F(c(1, 2)),
                Op::B(c(1, 0)),
                Op::B(c(1, 1)),
                Op::B(c(1, 2))
            ]
        );
        crate::validate(&s).unwrap();
        crate::validate(&crate::lower(&s)).unwrap();
    }
}
