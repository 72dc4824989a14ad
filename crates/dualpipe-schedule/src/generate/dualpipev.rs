//! The `dualpipev` generator: DeepSeek's V-shaped DualPipeV, op for op.
//!
//! One pipeline of `2 x ranks` stages is folded into a V over the ranks: rank `r` runs stage `r`
//! on the way down and stage `2 x ranks - 1 - r` on the way back, so the last rank runs the two
//! middle stages and rank 0 the first and the last. Each rank walks the same eight phases as
//! DualPipe (see [`super::dualpipe`]) with its down stage as the near stage and its up stage as
//! the far one.
//!
//! # Beyond the reference
//!
//! The reference needs at least `2 x ranks` micro-batches. With fewer, we walk the schedule for
//! `2 x ranks` and drop the ops of the micro-batches that do not exist, which keeps it complete
//! and deadlock-free. Odd micro-batch counts need nothing special: the reference handles them.

use super::dualpipe::{check_size, eight_phase_program};
use crate::{ConfigError, Knob, Schedule, ScheduleError, ScheduleKind, StagePlacement};

/// Generates the compute-only `dualpipev` schedule.
///
/// Any `ranks >= 1` and `micro_batches >= 1`. With at least `2 x ranks` micro-batches the
/// programs are exactly those of DeepSeek's reference `DualPipeV.step()`.
pub fn generate(ranks: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    if ranks == 0 {
        return Err(ScheduleError::InvalidConfig(
            ConfigError::new("dualpipev needs at least 1 rank, got 0: use ")
                .setting(Knob::Ranks, 1),
        ));
    }
    if micro_batches == 0 {
        return Err(ScheduleError::InvalidConfig(
            ConfigError::new("dualpipev needs at least 1 micro-batch, got 0: use ")
                .setting(Knob::MicroBatches, 1)
                .text(format!(
                    " (or {} to fill the pipeline)",
                    ranks.saturating_mul(2)
                )),
        ));
    }
    check_size("dualpipev", ranks, micro_batches)?;
    let stages = 2 * ranks;
    let programs = (0..ranks)
        .map(|rank| {
            eight_phase_program(
                ranks,
                rank,
                micro_batches,
                [(0, rank), (0, stages - 1 - rank)],
            )
        })
        .collect();
    Ok(Schedule {
        kind: ScheduleKind::DualPipeV,
        ranks,
        micro_batches,
        virtual_stages: 2,
        placement: StagePlacement::for_kind(ScheduleKind::DualPipeV, ranks, 2),
        programs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Chunk, Op};

    fn message(r: Result<Schedule, ScheduleError>) -> String {
        match r {
            Err(ScheduleError::InvalidConfig(m)) => m.to_string(),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn rejects_empty_configurations() {
        assert!(message(generate(0, 4)).contains("at least 1 rank"));
        let m = message(generate(3, 0));
        assert!(
            m.contains("at least 1 micro-batch") && m.contains("6 to fill"),
            "{m}"
        );
        assert!(message(generate(usize::MAX, 1)).contains("use fewer ranks"));
        assert!(message(generate(usize::MAX, 0)).contains("at least 1 micro-batch"));
    }

    #[test]
    fn metadata_and_placement() {
        let s = generate(3, 7).unwrap();
        assert_eq!(s.kind, ScheduleKind::DualPipeV);
        assert_eq!((s.ranks, s.micro_batches, s.virtual_stages), (3, 7, 2));
        assert_eq!(s.placement.rank_of, vec![vec![0, 1, 2, 2, 1, 0]]);
        assert_eq!(s.placement.parameter_copies(), vec![2, 2, 2]);
        assert!(s.programs.iter().flatten().all(Op::is_compute));
    }

    /// One rank holds the whole V: a forward of stage 0 then stage 1 per micro-batch, derived
    /// by hand from the eight phases with n = 1, k = 0.
    #[test]
    fn single_rank_by_hand() {
        let s = generate(1, 3).unwrap();
        let c = |stage, mb| Chunk::new(0, stage, mb);
        assert_eq!(
            s.programs[0],
            vec![
                Op::F(c(0, 0)),
                Op::F(c(1, 0)),
                Op::F(c(0, 1)),
                Op::B(c(1, 0)),
                Op::FB {
                    f: c(1, 1),
                    b: c(0, 0)
                },
                Op::FB {
                    f: c(0, 2),
                    b: c(1, 1)
                },
                Op::FB {
                    f: c(1, 2),
                    b: c(0, 1)
                },
                Op::B(c(1, 2)),
                Op::I(c(0, 2)),
                Op::W(c(0, 2)),
            ]
        );
    }

    #[test]
    fn one_micro_batch_runs_down_and_up() {
        let s = generate(2, 1).unwrap();
        let c = |stage| Chunk::new(0, stage, 0);
        // Rank 0 (k = 0) splits its first far backward (phase 3) and runs the W at once.
        assert_eq!(
            s.programs[0],
            vec![
                Op::F(c(0)),
                Op::F(c(3)),
                Op::I(c(3)),
                Op::W(c(3)),
                Op::B(c(0))
            ]
        );
        assert_eq!(
            s.programs[1],
            vec![Op::F(c(1)), Op::F(c(2)), Op::B(c(2)), Op::B(c(1))]
        );
    }
}
