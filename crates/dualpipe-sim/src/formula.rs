//! The closed forms of the DualPipe README's table "Pipeline Bubbles and Memory Usage
//! Comparison", for checking simulations against.
//!
//! `PP` is the number of stages along one pipeline: the ranks for 1F1B, ZB1P and DualPipe,
//! twice the ranks for DualPipeV (its V folds `PP` stages over `PP / 2` devices). The bubble
//! is read per rank: it is the idle time of the *most idle* rank (the middle ranks for
//! DualPipe), i.e. [`Metrics::bubble_max`](crate::Metrics::bubble_max), with free
//! communication. Activations are per device in units of one micro-batch at one stage.

use dualpipe_schedule::ScheduleKind;
use serde::{Deserialize, Serialize};

use crate::cost::StageCost;

/// What the README's table states for one schedule kind and size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReadmeFormula {
    /// Stages along one pipeline (`PP`).
    pub pp: usize,
    /// The bubble formula's value for the given durations.
    pub bubble: f64,
    /// Whether the README's bubble is exact (1F1B) or an upper bound the schedule may beat.
    pub bubble_exact: bool,
    /// Peak activations per device (units of one micro-batch at one stage).
    pub activations: usize,
    /// Parameter copies (stages held) per device.
    pub parameter_copies: usize,
    /// Devices (ranks) the schedule runs on.
    pub devices: usize,
}

/// The README's row for `kind` on `ranks` ranks with durations `cost`, or `None` for kinds
/// the table does not cover (GPipe, interleaved 1F1B).
pub fn readme_formula(kind: ScheduleKind, ranks: usize, cost: &StageCost) -> Option<ReadmeFormula> {
    let StageCost { f, b, w, fb } = *cost;
    match kind {
        ScheduleKind::OneFOneB | ScheduleKind::Zb1p => {
            let pp = ranks;
            let steps = pp.saturating_sub(1) as f64;
            let (bubble, exact) = if kind == ScheduleKind::OneFOneB {
                (steps * (f + b), true)
            } else {
                (steps * (f + b - 2.0 * w), false)
            };
            Some(ReadmeFormula {
                pp,
                bubble,
                bubble_exact: exact,
                activations: pp,
                parameter_copies: 1,
                devices: pp,
            })
        }
        ScheduleKind::DualPipe | ScheduleKind::DualPipeV => {
            let pp = if kind == ScheduleKind::DualPipe {
                ranks
            } else {
                2 * ranks
            };
            let steps = (pp / 2).saturating_sub(1) as f64;
            Some(ReadmeFormula {
                pp,
                bubble: steps * (fb + b - 3.0 * w),
                bubble_exact: false,
                activations: pp + 1,
                parameter_copies: 2,
                devices: if kind == ScheduleKind::DualPipe {
                    pp
                } else {
                    pp / 2
                },
            })
        }
        ScheduleKind::GPipe | ScheduleKind::Interleaved => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_match_the_readme_table() {
        let cost = StageCost::new(1.0, 2.0, 1.0, 2.5);
        let one = readme_formula(ScheduleKind::OneFOneB, 8, &cost).unwrap();
        assert_eq!(
            (one.bubble, one.activations, one.parameter_copies),
            (21.0, 8, 1)
        );
        let zb = readme_formula(ScheduleKind::Zb1p, 8, &cost).unwrap();
        assert_eq!(zb.bubble, 7.0);
        let dp = readme_formula(ScheduleKind::DualPipe, 8, &cost).unwrap();
        assert_eq!(
            (dp.pp, dp.bubble, dp.activations, dp.devices),
            (8, 4.5, 9, 8)
        );
        let dpv = readme_formula(ScheduleKind::DualPipeV, 4, &cost).unwrap();
        assert_eq!(
            (dpv.pp, dpv.bubble, dpv.activations, dpv.devices),
            (8, 4.5, 9, 4)
        );
        assert!(readme_formula(ScheduleKind::GPipe, 8, &cost).is_none());
    }
}
