//! Stages that re-balance themselves: per-rank compute measured over a window of steps and,
//! when the slowest rank exceeds the mean by more than a threshold, a new partition that moves
//! whole blocks between neighbouring stages ([`StageRebalancer`]); and the slow rank that tests and
//! demonstrations use to make the imbalance ([`SlowRank`]).
//!
//! The model of a rank's time: rank `r`'s compute over the window is `k_r · units_r`, where
//! `units_r` sums, over the forwards its program runs, the blocks of that forward's stage (plus
//! the head's share on the last stage, [`head_units`]), so a micro-batch's backward is counted
//! with its forward. `k_r` (seconds per unit, the rank's slowness) is measured; a candidate
//! partition is predicted as `max_r k_r · units_r` and searched by moving one block at a time
//! between neighbouring stages while the prediction improves ([`propose`]). The trainer
//! ([`Trainer::repartition`](crate::Trainer::repartition)) then moves the weights and the
//! optimizer state of the moved blocks at a step boundary; the math is unchanged.

use serde::{Deserialize, Serialize};

use dualpipe_schedule::{Op, Schedule};
use dualpipe_sim::Timeline;

pub use crate::config::rebalance::{
    RebalanceSettings, SlowRank, DEFAULT_THRESHOLD, DEFAULT_WINDOW,
};

/// One re-partitioning the trainer made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Repartition {
    /// Steps done when the blocks moved (the move happened before step `after_steps + 1`).
    pub after_steps: usize,
    /// The blocks per stage before.
    pub from: Vec<usize>,
    /// The blocks per stage after.
    pub to: Vec<usize>,
    /// Measured compute per rank over the window, in seconds.
    pub rank_seconds: Vec<f64>,
    /// The predicted compute of the slowest rank before and after, in seconds.
    pub predicted: (f64, f64),
}

/// The head's (final norm, LM head, loss) cost in blocks: `256 / (12 · d_model)` (its
/// multiply-adds per token against a block's dense ones).
pub fn head_units(d_model: usize) -> f64 {
    dualpipe_nn::gpt::VOCAB as f64 / (12.0 * d_model.max(1) as f64)
}

/// For every rank, how many forwards its program runs of each model stage
/// (`[rank][stage]`).
pub fn forward_counts(schedule: &Schedule) -> Vec<Vec<usize>> {
    let stages = schedule.placement.stages();
    schedule
        .programs
        .iter()
        .map(|program| {
            let mut counts = vec![0; stages];
            for op in program {
                let chunk = match *op {
                    Op::F(c) => Some(c),
                    Op::FB { f, .. } => Some(f),
                    _ => None,
                };
                if let Some(c) = chunk.filter(|c| c.stage < stages) {
                    counts[c.stage] += 1;
                }
            }
            counts
        })
        .collect()
}

/// Each rank's work units under `blocks` (see the module documentation).
pub fn rank_units(counts: &[Vec<usize>], blocks: &[usize], head: f64) -> Vec<f64> {
    let last = blocks.len().saturating_sub(1);
    counts
        .iter()
        .map(|per_stage| {
            per_stage
                .iter()
                .zip(blocks)
                .enumerate()
                .map(|(s, (&n, &b))| {
                    let extra = if s == last { head } else { 0.0 };
                    n as f64 * (b as f64 + extra)
                })
                .sum()
        })
        .collect()
}

/// The slowest rank's predicted compute under `blocks`, with `slowness[r]` seconds per unit.
pub fn predicted_max(counts: &[Vec<usize>], blocks: &[usize], head: f64, slowness: &[f64]) -> f64 {
    rank_units(counts, blocks, head)
        .iter()
        .zip(slowness)
        .map(|(u, k)| u * k)
        .fold(0.0, f64::max)
}

/// The partition that moving single blocks between neighbouring stages reaches from
/// `blocks` while the predicted slowest rank (then the sum of squares) improves; every
/// stage keeps at least one block.
pub fn propose(counts: &[Vec<usize>], blocks: &[usize], head: f64, slowness: &[f64]) -> Vec<usize> {
    let score = |b: &[usize]| {
        let times: Vec<f64> = rank_units(counts, b, head)
            .iter()
            .zip(slowness)
            .map(|(u, k)| u * k)
            .collect();
        let max = times.iter().copied().fold(0.0, f64::max);
        (max, times.iter().map(|t| t * t).sum::<f64>())
    };
    let mut best = blocks.to_vec();
    let mut best_score = score(&best);
    let total: usize = blocks.iter().sum();
    for _ in 0..total.saturating_mul(blocks.len()).max(1) {
        let mut step: Option<(Vec<usize>, (f64, f64))> = None;
        for from in 0..best.len() {
            if best[from] <= 1 {
                continue;
            }
            for to in [from.wrapping_sub(1), from + 1] {
                if to >= best.len() {
                    continue;
                }
                let mut cand = best.clone();
                cand[from] -= 1;
                cand[to] += 1;
                let s = score(&cand);
                let better = |a: (f64, f64), b: (f64, f64)| {
                    a.0 < b.0 * (1.0 - 1e-12) || (a.0 <= b.0 && a.1 < b.1 * (1.0 - 1e-12))
                };
                if better(s, step.as_ref().map_or(best_score, |x| x.1)) {
                    step = Some((cand, s));
                }
            }
        }
        match step {
            Some((cand, s)) => (best, best_score) = (cand, s),
            None => break,
        }
    }
    best
}

/// What [`StageRebalancer::observe`] proposes.
#[derive(Clone, Debug, PartialEq)]
pub struct Proposal {
    /// The blocks per stage to move to.
    pub to: Vec<usize>,
    /// Measured compute per rank over the window, in seconds.
    pub rank_seconds: Vec<f64>,
    /// The predicted compute of the slowest rank before and after, in seconds.
    pub predicted: (f64, f64),
}

/// Measures each rank's compute over a window of steps and decides when to re-partition.
#[derive(Clone, Debug)]
pub struct StageRebalancer {
    settings: RebalanceSettings,
    counts: Vec<Vec<usize>>,
    head: f64,
    /// Steps still to skip before measuring (warm-up).
    skip: usize,
    measured: usize,
    seconds: Vec<f64>,
}

impl StageRebalancer {
    /// A rebalancer for `schedule`'s ranks, the head's share `head` ([`head_units`]).
    pub fn new(settings: RebalanceSettings, schedule: &Schedule, head: f64) -> Self {
        StageRebalancer {
            settings,
            counts: forward_counts(schedule),
            head,
            skip: 1,
            measured: 0,
            seconds: vec![0.0; schedule.ranks],
        }
    }

    /// Adds a step's measured timeline. When a window is complete and the slowest rank's
    /// compute exceeds the mean by more than the threshold, returns the partition to move
    /// to (when it predicts a gain of more than half the threshold).
    pub fn observe(&mut self, timeline: &Timeline, blocks: &[usize]) -> Option<Proposal> {
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        for (acc, intervals) in self.seconds.iter_mut().zip(&timeline.compute) {
            *acc += intervals
                .iter()
                .map(|i| (i.end - i.start).max(0.0))
                .sum::<f64>();
        }
        self.measured += 1;
        if self.measured < self.settings.window {
            return None;
        }
        let seconds = std::mem::replace(&mut self.seconds, vec![0.0; self.counts.len()]);
        self.measured = 0;
        let mean = seconds.iter().sum::<f64>() / seconds.len().max(1) as f64;
        let max = seconds.iter().copied().fold(0.0, f64::max);
        if !(mean > 0.0 && max > mean * (1.0 + self.settings.threshold)) {
            return None;
        }
        let units = rank_units(&self.counts, blocks, self.head);
        let slowness: Vec<f64> = seconds
            .iter()
            .zip(&units)
            .map(|(t, u)| if *u > 0.0 { t / u } else { 0.0 })
            .collect();
        let before = predicted_max(&self.counts, blocks, self.head, &slowness);
        let proposal = propose(&self.counts, blocks, self.head, &slowness);
        let after = predicted_max(&self.counts, &proposal, self.head, &slowness);
        if proposal == blocks || after >= before * (1.0 - self.settings.threshold / 2.0) {
            return None;
        }
        self.skip = 1;
        Some(Proposal {
            to: proposal,
            rank_seconds: seconds,
            predicted: (before, after),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualpipe_schedule::ScheduleKind;

    #[test]
    fn parses_and_checks_the_slow_rank() {
        let s = SlowRank::parse("1:2").unwrap();
        assert_eq!((s.rank, s.factor), (1, 2.0));
        assert!(SlowRank::parse("1").unwrap_err().contains("RANK:FACTOR"));
        assert!(s.check(4, "slow_rank").is_ok());
        let err = s.check(1, "slow_rank").unwrap_err().to_string();
        assert!(err.contains("rank 1 does not exist"), "{err}");
        let err = SlowRank {
            rank: 0,
            factor: 0.5,
        }
        .check(4, "slow_rank")
        .unwrap_err()
        .to_string();
        assert!(err.contains("from 1 to 1000"), "{err}");
    }

    #[test]
    fn a_slow_rank_gives_its_blocks_to_its_neighbours() {
        let schedule = dualpipe_schedule::build(ScheduleKind::OneFOneB, 4, 8, 1).unwrap();
        let counts = forward_counts(&schedule);
        assert_eq!(counts[1], vec![0, 8, 0, 0]);
        // Rank 1 twice as slow: it should hold about half the blocks of the others.
        let slowness = [1.0, 2.0, 1.0, 1.0];
        let p = propose(&counts, &[3, 3, 3, 3], 0.0, &slowness);
        assert_eq!(p.iter().sum::<usize>(), 12);
        assert!(p[1] < 3 && p.iter().all(|&b| b >= 1), "{p:?}");
        let before = predicted_max(&counts, &[3, 3, 3, 3], 0.0, &slowness);
        let after = predicted_max(&counts, &p, 0.0, &slowness);
        assert!(after < before, "{before} -> {after}");
        // Even speeds keep an even partition.
        assert_eq!(
            propose(&counts, &[3, 3, 3, 3], 0.0, &[1.0; 4]),
            vec![3, 3, 3, 3]
        );
    }

    #[test]
    fn dualpipe_counts_both_stages_of_a_rank() {
        let schedule = dualpipe_schedule::build(ScheduleKind::DualPipe, 4, 8, 1).unwrap();
        let counts = forward_counts(&schedule);
        // Rank 1 holds stage 1 of one direction and stage 2 of the other.
        assert_eq!(counts[1][1] + counts[1][2], 8);
        let p = propose(&counts, &[2, 2, 2, 2], 0.0, &[1.0, 2.0, 1.0, 1.0]);
        assert!(p[1] + p[2] < 4, "{p:?}");
    }
}
