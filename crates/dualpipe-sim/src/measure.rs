//! Measured op durations: what each kind of compute op really took, for the simulator
//! (a real run's timelines in, a [`StageCost`] to simulate the same schedule with out).

use dualpipe_schedule::Op;

use crate::{StageCost, Timeline};

/// Mean measured duration of each kind of compute op, in seconds (`None` for a kind that
/// never ran; serialized as `{"f", "b", "i", "w", "fb"}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OpTimes {
    /// Forward `F`.
    pub f: Option<f64>,
    /// Full backward `B`.
    pub b: Option<f64>,
    /// Input-gradient backward `I`.
    pub i: Option<f64>,
    /// Weight-gradient `W`.
    pub w: Option<f64>,
    /// Overlapped pair `FB`.
    pub fb: Option<f64>,
}

/// Running sums of measured op durations, one timeline at a time (so a long run keeps five
/// sums, not every timeline); [`OpTally::means`] gives the [`OpTimes`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpTally {
    sums: [f64; 5],
    counts: [u64; 5],
}

impl OpTally {
    /// Adds every compute interval of `timeline`.
    pub fn add(&mut self, timeline: &Timeline) {
        for interval in timeline.compute.iter().flatten() {
            let slot = match interval.op {
                Op::F(_) => 0,
                Op::B(_) => 1,
                Op::I(_) => 2,
                Op::W(_) => 3,
                Op::FB { .. } => 4,
                _ => continue,
            };
            self.sums[slot] += interval.end - interval.start;
            self.counts[slot] += 1;
        }
    }

    /// The mean duration of each kind over everything added so far.
    pub fn means(&self) -> OpTimes {
        let mean = |k: usize| (self.counts[k] > 0).then(|| self.sums[k] / self.counts[k] as f64);
        OpTimes {
            f: mean(0),
            b: mean(1),
            i: mean(2),
            w: mean(3),
            fb: mean(4),
        }
    }
}

impl OpTimes {
    /// The mean durations over every compute interval of `timelines`.
    pub fn from_timelines<'a>(timelines: impl IntoIterator<Item = &'a Timeline>) -> Self {
        let mut tally = OpTally::default();
        for timeline in timelines {
            tally.add(timeline);
        }
        tally.means()
    }

    /// A uniform cost for the simulator, filling kinds that did not run from those that did:
    /// `B = I + W` when no full backward ran, `W = B - I` (or half of `B`) when no `W` ran,
    /// `F&B = F + B` when no pair ran. Means measured on a noisy machine can break the cost
    /// model's rules, so `W` is capped at `B` and `F&B` raised to at least `max(F, B)`.
    /// `None` without forwards or backwards.
    pub fn stage_cost(&self) -> Option<StageCost> {
        let f = self.f?;
        let b = match (self.b, self.i, self.w) {
            (Some(b), _, _) => b,
            (None, Some(i), Some(w)) => i + w,
            _ => return None,
        };
        let w = match (self.w, self.i) {
            (Some(w), _) => w.min(b),
            (None, Some(i)) => (b - i).max(0.0),
            (None, None) => 0.5 * b,
        };
        let fb = self.fb.unwrap_or(f + b).max(f.max(b));
        Some(StageCost::new(f, b, w, fb))
    }
}

#[cfg(test)]
mod tests {
    use dualpipe_schedule::Chunk;

    use crate::ComputeInterval;

    use super::*;

    fn interval(op: Op, start: f64, end: f64) -> ComputeInterval {
        ComputeInterval { op, start, end }
    }

    #[test]
    fn means_per_kind_and_filled_costs() {
        let c = Chunk::new(0, 0, 0);
        let mut t = Timeline::new(1);
        t.compute[0] = vec![
            interval(Op::F(c), 0.0, 1.0),
            interval(Op::F(c), 1.0, 4.0),
            interval(Op::I(c), 4.0, 5.0),
            interval(Op::W(c), 5.0, 7.0),
        ];
        let times = OpTimes::from_timelines([&t]);
        let mut tally = OpTally::default();
        tally.add(&t);
        assert_eq!(tally.means(), times);
        assert_eq!(times.f, Some(2.0));
        assert_eq!(
            (times.b, times.i, times.w, times.fb),
            (None, Some(1.0), Some(2.0), None)
        );
        let cost = times.stage_cost().unwrap();
        assert_eq!((cost.f, cost.b, cost.w, cost.fb), (2.0, 3.0, 2.0, 5.0));
        assert_eq!(OpTimes::default().stage_cost(), None);
        // Noisy means are brought back within the cost model's rules.
        let noisy = OpTimes {
            f: Some(1.0),
            b: Some(3.0),
            w: Some(4.0),
            fb: Some(2.0),
            ..OpTimes::default()
        };
        let cost = noisy.stage_cost().unwrap();
        assert_eq!((cost.w, cost.fb), (3.0, 3.0));
        assert!(cost.check("measured").is_ok());
    }
}
