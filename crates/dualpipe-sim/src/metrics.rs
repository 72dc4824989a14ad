//! Metrics of a timeline: step time, bubbles, activation memory, parameter copies.
//!
//! [`metrics`] takes a [`Timeline`], not a simulator, so the runtime computes the same
//! numbers from a measured step and "predicted vs measured" compares like with like.

use dualpipe_schedule::{Op, StagePlacement};
use serde::{Deserialize, Serialize};

use dualpipe_schedule::timeline::Timeline;

/// What one step cost, per rank and overall.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Number of ranks.
    pub ranks: usize,
    /// End of the last compute op or message, in seconds from the start of the step.
    pub makespan: f64,
    /// `busy_per_rank[r]`: total duration of rank `r`'s compute intervals.
    pub busy_per_rank: Vec<f64>,
    /// `bubble_per_rank[r]`: idle time of rank `r`'s compute stream, `makespan - busy`.
    pub bubble_per_rank: Vec<f64>,
    /// The largest per-rank bubble.
    pub bubble_max: f64,
    /// Total idle time over total capacity: `sum(bubble) / (ranks x makespan)`.
    pub bubble_ratio: f64,
    /// `peak_activations_per_rank[r]`: the most activations rank `r` held at once, in units
    /// of one micro-batch at one stage.
    pub peak_activations_per_rank: Vec<usize>,
    /// The largest per-rank peak.
    pub peak_activations: usize,
    /// `parameter_copies_per_rank[r]`: stages whose weights rank `r` holds.
    pub parameter_copies_per_rank: Vec<usize>,
    /// `comm_wait_per_rank[r]`: time rank `r`'s compute stream spent blocked on
    /// communication (receives not yet arrived, or its own sends when blocking).
    pub comm_wait_per_rank: Vec<f64>,
}

/// Computes the metrics of a (simulated or measured) timeline.
///
/// Activations: a forward adds one unit (one micro-batch at one stage) that lives until its
/// full backward (`B`, or the backward half of an `FB`) or, after an `I`, until its `W`. The
/// forward half of an `FB` adds one and its backward half frees one; the peak counts both
/// as alive during the pair. Parameter copies come from the placement.
pub fn metrics(timeline: &Timeline, placement: &StagePlacement) -> Metrics {
    let ranks = timeline.ranks();
    let makespan = timeline.makespan();
    let busy_per_rank: Vec<f64> = timeline
        .compute
        .iter()
        .map(|intervals| intervals.iter().map(|i| i.end - i.start).sum())
        .collect();
    let bubble_per_rank: Vec<f64> = busy_per_rank
        .iter()
        .map(|b| (makespan - b).max(0.0))
        .collect();
    let total_bubble: f64 = bubble_per_rank.iter().sum();
    let bubble_ratio = if ranks == 0 || makespan <= 0.0 {
        0.0
    } else {
        // At most 1 also when rounding makes the idle time a hair more than the makespan
        // (a step of messages only).
        (total_bubble / (ranks as f64 * makespan)).min(1.0)
    };
    let peak_activations_per_rank: Vec<usize> = timeline
        .compute
        .iter()
        .map(|intervals| {
            let mut order: Vec<usize> = (0..intervals.len()).collect();
            order.sort_by(|&a, &b| {
                intervals[a]
                    .start
                    .total_cmp(&intervals[b].start)
                    .then(intervals[a].end.total_cmp(&intervals[b].end))
            });
            peak_activations(order.into_iter().map(|k| &intervals[k].op))
        })
        .collect();
    Metrics {
        ranks,
        makespan,
        bubble_max: bubble_per_rank.iter().copied().fold(0.0, f64::max),
        busy_per_rank,
        bubble_per_rank,
        bubble_ratio,
        peak_activations: peak_activations_per_rank.iter().copied().max().unwrap_or(0),
        peak_activations_per_rank,
        parameter_copies_per_rank: placement.parameter_copies(),
        comm_wait_per_rank: timeline.comm_wait.clone(),
    }
}

/// The peak number of live activations along one rank's compute ops, in execution order.
pub fn peak_activations<'a>(ops: impl IntoIterator<Item = &'a Op>) -> usize {
    let mut live: i64 = 0;
    let mut peak: i64 = 0;
    for op in ops {
        match op {
            Op::F(_) => {
                live += 1;
                peak = peak.max(live);
            }
            Op::B(_) | Op::W(_) => live -= 1,
            Op::FB { .. } => {
                peak = peak.max(live + 1);
            }
            _ => {}
        }
    }
    usize::try_from(peak).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualpipe_schedule::timeline::ComputeInterval;
    use dualpipe_schedule::Chunk;

    fn interval(op: Op, start: f64, end: f64) -> ComputeInterval {
        ComputeInterval { op, start, end }
    }

    #[test]
    fn bubbles_and_ratio_follow_the_makespan() {
        let c = |mb| Chunk::new(0, 0, mb);
        let mut t = Timeline::new(2);
        t.compute[0] = vec![
            interval(Op::F(c(0)), 0.0, 1.0),
            interval(Op::B(c(0)), 3.0, 5.0),
        ];
        t.compute[1] = vec![interval(Op::F(Chunk::new(0, 1, 0)), 1.0, 2.0)];
        let placement = StagePlacement {
            ranks: 2,
            rank_of: vec![vec![0, 1]],
        };
        let m = metrics(&t, &placement);
        assert_eq!(m.makespan, 5.0);
        assert_eq!(m.busy_per_rank, vec![3.0, 1.0]);
        assert_eq!(m.bubble_per_rank, vec![2.0, 4.0]);
        assert_eq!(m.bubble_max, 4.0);
        assert!((m.bubble_ratio - 0.6).abs() < 1e-12);
        assert_eq!(m.parameter_copies_per_rank, vec![1, 1]);
        assert_eq!(m.peak_activations_per_rank, vec![1, 1]);
    }

    #[test]
    fn activations_live_until_the_full_backward() {
        let c = |mb| Chunk::new(0, 0, mb);
        // F0 F1 I0 F2 W0 B1 FB(f3, b2) B3: live 1 2 2 3 2 1 (2) 1 0.
        let ops = [
            Op::F(c(0)),
            Op::F(c(1)),
            Op::I(c(0)),
            Op::F(c(2)),
            Op::W(c(0)),
            Op::B(c(1)),
            Op::FB { f: c(3), b: c(2) },
            Op::B(c(3)),
        ];
        assert_eq!(peak_activations(&ops), 3);
        let fb_peak = [Op::F(c(0)), Op::F(c(1)), Op::FB { f: c(2), b: c(0) }];
        assert_eq!(peak_activations(&fb_peak), 3);
    }

    #[test]
    fn empty_timeline_has_zero_metrics() {
        let m = metrics(
            &Timeline::new(1),
            &StagePlacement {
                ranks: 1,
                rank_of: vec![vec![0]],
            },
        );
        assert_eq!(m.makespan, 0.0);
        assert_eq!(m.bubble_ratio, 0.0);
        assert_eq!(m.peak_activations, 0);
    }
}
