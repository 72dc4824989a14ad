//! The mixture of experts' figures in a run's report: each step's router load
//! ([`ExpertLoad`]) and the measured waits of the experts' all-to-alls ([`ExpertWaits`]).

use dualpipe_nn::gpt::moe::waits::{self, Tally};
use serde::{Deserialize, Serialize};

/// One step's router load: tokens per (MoE block, expert), summed over every copy of the
/// block (both directions of DualPipe), and how uneven it was.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExpertLoad {
    /// The step (0-based).
    pub step: usize,
    /// The worst block's max/mean tokens per expert (1: perfectly balanced).
    pub max_over_mean: f64,
    /// The model-wide index of that block.
    pub worst_layer: usize,
    /// The MoE blocks' model-wide indices, in the order of `counts`.
    pub layers: Vec<usize>,
    /// Tokens per expert of each MoE block.
    pub counts: Vec<Vec<u64>>,
    /// With expert parallelism: the worst block's max/mean rows per worker (the rows each
    /// worker's experts computed; 1: perfectly balanced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_max_over_mean: Option<f64>,
    /// With expert parallelism: the block of that worst ratio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_worst_layer: Option<usize>,
    /// With expert parallelism: rows per worker of each MoE block (in the order of `layers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_rows: Option<Vec<Vec<u64>>>,
}

impl ExpertLoad {
    /// The figures of `counts` (per MoE block: its index and tokens per expert).
    pub fn new(step: usize, mut counts: Vec<(usize, Vec<u64>)>) -> Self {
        counts.sort_by_key(|(l, _)| *l);
        let (worst_layer, max_over_mean) = worst(&counts);
        ExpertLoad {
            step,
            max_over_mean,
            worst_layer,
            layers: counts.iter().map(|(l, _)| *l).collect(),
            counts: counts.into_iter().map(|(_, c)| c).collect(),
            worker_max_over_mean: None,
            worker_worst_layer: None,
            worker_rows: None,
        }
    }

    /// Adds the per-worker figures of expert parallelism from `rows` (per MoE block: rows
    /// each worker's experts computed).
    pub fn with_worker_rows(mut self, mut rows: Vec<(usize, Vec<u64>)>) -> Self {
        rows.sort_by_key(|(l, _)| *l);
        let (layer, ratio) = worst(&rows);
        self.worker_max_over_mean = Some(ratio);
        self.worker_worst_layer = Some(layer);
        self.worker_rows = Some(rows.into_iter().map(|(_, r)| r).collect());
        self
    }
}

/// max/mean of `c` (1 when empty or all zero).
fn ratio(c: &[u64]) -> f64 {
    let total: u64 = c.iter().sum();
    if total == 0 {
        1.0
    } else {
        let mean = total as f64 / c.len() as f64;
        *c.iter().max().unwrap_or(&0) as f64 / mean
    }
}

/// The block with the largest max/mean, and that ratio.
fn worst(counts: &[(usize, Vec<u64>)]) -> (usize, f64) {
    counts
        .iter()
        .map(|(l, c)| (*l, ratio(c)))
        .fold((0, 0.0), |best, x| if x.1 > best.1 { x } else { best })
}

/// Sums per-copy counts by block: copies of the same block (DualPipe's two directions) add.
pub fn sum_by_layer(copies: impl IntoIterator<Item = (usize, Vec<u64>)>) -> Vec<(usize, Vec<u64>)> {
    let mut out: std::collections::BTreeMap<usize, Vec<u64>> = Default::default();
    for (l, c) in copies {
        let e = out.entry(l).or_insert_with(|| vec![0; c.len()]);
        for (a, b) in e.iter_mut().zip(&c) {
            *a += b;
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_block_is_reported() {
        let load = ExpertLoad::new(3, vec![(3, vec![4, 4, 4, 4]), (1, vec![10, 2, 2, 2])]);
        assert_eq!(load.layers, vec![1, 3]);
        assert_eq!(load.worst_layer, 1);
        assert!((load.max_over_mean - 2.5).abs() < 1e-15);
        let summed = sum_by_layer(vec![(1, vec![1, 2]), (0, vec![5, 5]), (1, vec![3, 0])]);
        assert_eq!(summed, vec![(0, vec![5, 5]), (1, vec![4, 2])]);
    }
}

/// One tally of [`ExpertWaits`]: the mean seconds and how many were measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitMean {
    /// Mean seconds.
    pub seconds: f64,
    /// How many durations the mean is over.
    pub count: u64,
}

impl From<Tally> for WaitMean {
    fn from(t: Tally) -> Self {
        WaitMean {
            seconds: t.mean(),
            count: t.count,
        }
    }
}

/// With an emulated link (`--link-latency` / `--link-bandwidth`): where the time around the
/// expert all-to-alls went over the run (`expert_waits` in the JSON;
/// [`dualpipe_nn::gpt::moe::waits`] measures it): per all-to-all, the wait of its receive
/// in a lone forward, a lone input backward, and the forward and backward chunks of an
/// overlapped FB pair, and the link's own part of each (`*_due`: the latency plus how late
/// the last peer sent); per overlapped chunk, the time it held the compute token; per
/// all-to-all inside a pair, the hand-over (from the end of its wait to having the token
/// back); the holds and hand-overs also per chunk (`held_*`, `regain_*`), and per chunk its
/// wait for the token before it first computed (`start_*`); per pair, its forward chunk's
/// thread start (`thread_start`) and its span to the later chunk's end (`pair_span`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExpertWaits {
    /// A lone forward's all-to-all.
    pub forward: WaitMean,
    /// A lone input backward's all-to-all.
    pub backward: WaitMean,
    /// A forward's all-to-all inside an overlapped pair.
    pub pair_forward: WaitMean,
    /// A backward's all-to-all inside an overlapped pair.
    pub pair_backward: WaitMean,
    /// An overlapped chunk's compute (token held).
    pub token_held: WaitMean,
    /// An overlapped all-to-all's hand-over.
    pub token_regain: WaitMean,
    /// The compute of an overlapped pair's forward chunk.
    pub held_forward: WaitMean,
    /// The compute of an overlapped pair's backward chunk.
    pub held_backward: WaitMean,
    /// The hand-over of an all-to-all of a pair's forward chunk.
    pub regain_forward: WaitMean,
    /// The hand-over of an all-to-all of a pair's backward chunk.
    pub regain_backward: WaitMean,
    /// A pair's forward chunk's wait for the token before it first computed.
    pub start_forward: WaitMean,
    /// A pair's backward chunk's wait for the token before it first computed.
    pub start_backward: WaitMean,
    /// A pair's start until its forward chunk's thread ran.
    pub thread_start: WaitMean,
    /// A pair's start to the end of its later chunk.
    pub pair_span: WaitMean,
    /// The link's part of a lone forward's all-to-all wait.
    pub forward_due: WaitMean,
    /// The link's part of a lone input backward's all-to-all wait.
    pub backward_due: WaitMean,
    /// The link's part of a pair's forward all-to-all wait.
    pub pair_forward_due: WaitMean,
    /// The link's part of a pair's backward all-to-all wait.
    pub pair_backward_due: WaitMean,
}

impl ExpertWaits {
    /// The process's tallies so far (see [`waits::snapshot`]).
    pub fn measured() -> Self {
        let w = waits::snapshot();
        ExpertWaits {
            forward: w.forward.into(),
            backward: w.backward.into(),
            pair_forward: w.pair_forward.into(),
            pair_backward: w.pair_backward.into(),
            token_held: w.token_held.into(),
            token_regain: w.token_regain.into(),
            held_forward: w.held_forward.into(),
            held_backward: w.held_backward.into(),
            regain_forward: w.regain_forward.into(),
            regain_backward: w.regain_backward.into(),
            start_forward: w.start_forward.into(),
            start_backward: w.start_backward.into(),
            thread_start: w.thread_start.into(),
            pair_span: w.pair_span.into(),
            forward_due: w.forward_due.into(),
            backward_due: w.backward_due.into(),
            pair_forward_due: w.pair_forward_due.into(),
            pair_backward_due: w.pair_backward_due.into(),
        }
    }
}
