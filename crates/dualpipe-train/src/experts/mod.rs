//! The GPT's mixture of experts in training, one module for the concept:
//!
//! - here: the settings ([`MoeSettings`], `--experts` and friends) and the per-step expert
//!   load figures ([`ExpertLoad`], `expert_load_imbalance` in the JSON);
//! - [`group`] — MoE over the data-parallel group ([`group::ExpertGroup`]): counts summed over
//!   replicas, expert parallelism (all-to-all dispatch and combine);
//! - [`shards`] — which routed experts a worker holds, their gradients and checkpoints;
//! - [`eplb`] — EPLB in training ([`eplb::ExpertRebalancer`]): re-placing experts from the
//!   router counts;
//! - `mpi` (feature `mpi`) — the experts' all-to-alls over MPI.
//!
//! The trainer's side (the experts as a parallelism of the step) is `trainer/experts.rs`.

pub mod eplb;
pub mod group;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod shards;

use dualpipe_nn::gpt::moe::parallel::LinkModel;
use dualpipe_nn::gpt::moe::waits::{self, Tally};
use dualpipe_nn::gpt::MoeConfig;
use serde::{Deserialize, Serialize};

use crate::config::Naming;
use crate::error::TrainError;

/// The MoE feed-forward of the GPT and its balancing. `TrainConfig::moe = None` is the dense
/// model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MoeSettings {
    /// Routed experts per MoE block (`--experts`).
    pub experts: usize,
    /// Experts per token (`--top-k`).
    pub top_k: usize,
    /// Hidden width of each expert (`--expert-hidden`; `None`: `4·d_model / top_k`, so the
    /// routed compute per token matches the dense MLP's).
    pub expert_hidden: Option<usize>,
    /// Shared experts every token passes through (`--shared-experts`).
    pub shared_experts: usize,
    /// Every `every`-th block is an MoE block (`--moe-every`; 1: every block).
    pub every: usize,
    /// Coefficient of the standard auxiliary balance loss (`--aux-loss`; 0: off).
    pub aux_loss: f64,
    /// γ of the auxiliary-loss-free bias step `bⱼ += γ·sign(mean − loadⱼ)` after every step
    /// (`--bias-update-rate`; 0: the bias stays zero).
    pub bias_update_rate: f64,
    /// Spread the routed experts over the data-parallel group (`--expert-parallel`): each
    /// worker stores (weights and optimizer state) and computes its placed experts for every
    /// worker's tokens (all-to-all dispatch and combine).
    pub expert_parallel: bool,
    /// Extra expert slots per MoE block beyond one per logical expert
    /// (`--redundant-experts`; with expert parallelism: `experts + R` a multiple of the
    /// data-parallel size).
    pub redundant_experts: usize,
    /// Re-place the experts by EPLB every this many steps (`--eplb-every`; 0: never).
    pub eplb_every: usize,
    /// Link emulation for the expert all-to-alls: seconds every message takes
    /// (`--link-latency`; 0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub link_latency: f64,
    /// Link emulation for the expert all-to-alls: bytes per second (`--link-bandwidth`;
    /// `None`: the bytes cost nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_bandwidth: Option<f64>,
    /// With expert parallelism, DualPipe's FB pair runs its forward and backward chunks
    /// overlapped: one computes while the other waits on an all-to-all (`--no-moe-overlap`
    /// turns it off: the forward, then the backward).
    #[serde(skip_serializing_if = "is_true")]
    pub overlap: bool,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn is_true(v: &bool) -> bool {
    *v
}

impl MoeSettings {
    /// 8 experts, top-2, no shared expert, every block, no auxiliary loss, γ = 1e-3.
    pub const DEFAULT: MoeSettings = MoeSettings {
        experts: 8,
        top_k: 2,
        expert_hidden: None,
        shared_experts: 0,
        every: 1,
        aux_loss: 0.0,
        bias_update_rate: 1e-3,
        expert_parallel: false,
        redundant_experts: 0,
        eplb_every: 0,
        link_latency: 0.0,
        link_bandwidth: None,
        overlap: true,
    };

    /// The emulated link of the expert all-to-alls.
    pub fn link(&self) -> LinkModel {
        LinkModel {
            latency: self.link_latency,
            bandwidth: self.link_bandwidth,
        }
    }

    /// The architecture part, for a model of width `d_model`.
    pub fn architecture(&self, d_model: usize) -> MoeConfig {
        MoeConfig {
            experts: self.experts,
            top_k: self.top_k,
            expert_hidden: self
                .expert_hidden
                .unwrap_or_else(|| (4 * d_model / self.top_k.max(1)).max(1)),
            shared_experts: self.shared_experts,
            every: self.every,
        }
    }

    /// Checks the sizes and rates; the message names the settings as `naming` says.
    pub fn check(&self, naming: Naming) -> Result<(), TrainError> {
        let name = |flag: &str, field: &str| match naming {
            Naming::Flags => format!("--{flag}"),
            Naming::Fields => format!("moe.{field}"),
        };
        for (flag, field, v) in [
            ("experts", "experts", self.experts),
            ("top-k", "top_k", self.top_k),
            ("moe-every", "every", self.every),
            (
                "expert-hidden",
                "expert_hidden",
                self.expert_hidden.unwrap_or(1),
            ),
        ] {
            if v == 0 {
                return Err(TrainError::Config(format!(
                    "{} is 0; it must be at least 1",
                    name(flag, field)
                )));
            }
        }
        if self.top_k > self.experts {
            return Err(TrainError::Config(format!(
                "{} {} is more than {} {}; route to at most every expert",
                name("top-k", "top_k"),
                self.top_k,
                name("experts", "experts"),
                self.experts
            )));
        }
        for (flag, field, v) in [
            ("aux-loss", "aux_loss", self.aux_loss),
            (
                "bias-update-rate",
                "bias_update_rate",
                self.bias_update_rate,
            ),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(TrainError::Config(format!(
                    "{} {v}: it must be a number at least 0, such as 0.001",
                    name(flag, field)
                )));
            }
        }
        Ok(())
    }
}

impl MoeSettings {
    /// Checks expert parallelism and EPLB against `data_parallel` replicas; the message names
    /// the settings as `naming` says.
    pub fn check_parallel(&self, data_parallel: usize, naming: Naming) -> Result<(), TrainError> {
        let name = |flag: &str, field: &str| match naming {
            Naming::Flags => format!("--{flag}"),
            Naming::Fields => format!("moe.{field}"),
        };
        let ep = name("expert-parallel", "expert_parallel");
        let latency = name("link-latency", "link_latency");
        if !(self.link_latency.is_finite() && self.link_latency >= 0.0) {
            return Err(TrainError::Config(format!(
                "{latency} {}: it must be a number of seconds at least 0, such as 0.002",
                self.link_latency
            )));
        }
        let bandwidth = name("link-bandwidth", "link_bandwidth");
        if let Some(bw) = self.link_bandwidth {
            if !(bw.is_finite() && bw > 0.0) {
                return Err(TrainError::Config(format!(
                    "{bandwidth} {bw}: it must be a positive number of bytes per second, \
                     such as 1e8"
                )));
            }
        }
        if !self.expert_parallel {
            let traffic = [
                (latency, self.link_latency > 0.0),
                (bandwidth, self.link_bandwidth.is_some()),
                (name("no-moe-overlap", "overlap false"), !self.overlap),
            ];
            if let Some((flag, _)) = traffic.into_iter().find(|(_, on)| *on) {
                return Err(TrainError::Config(format!(
                    "{flag} is about the expert all-to-all; add {ep} or drop it"
                )));
            }
            for (flag, field, v) in [
                (
                    "redundant-experts",
                    "redundant_experts",
                    self.redundant_experts,
                ),
                ("eplb-every", "eplb_every", self.eplb_every),
            ] {
                if v > 0 {
                    return Err(TrainError::Config(format!(
                        "{} {v} places experts over workers; add {ep} or drop it",
                        name(flag, field)
                    )));
                }
            }
            return Ok(());
        }
        let slots = self.experts.saturating_add(self.redundant_experts);
        let replicated = self.redundant_experts > 0 || self.eplb_every > 0;
        if replicated && !slots.is_multiple_of(data_parallel.max(1)) {
            return Err(TrainError::Config(format!(
                "{} {} + {} {} = {slots} expert slots do not split over {data_parallel} \
                 data-parallel workers; make the sum a multiple of {data_parallel}",
                name("experts", "experts"),
                self.experts,
                name("redundant-experts", "redundant_experts"),
                self.redundant_experts
            )));
        }
        if self.redundant_experts > self.experts.saturating_mul(data_parallel.max(1)) {
            return Err(TrainError::Config(format!(
                "{} {} is more than one replica of every expert on every worker ({}); use fewer",
                name("redundant-experts", "redundant_experts"),
                self.redundant_experts,
                self.experts.saturating_mul(data_parallel.max(1))
            )));
        }
        Ok(())
    }
}

impl Default for MoeSettings {
    /// [`MoeSettings::DEFAULT`].
    fn default() -> Self {
        MoeSettings::DEFAULT
    }
}

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

    #[test]
    fn bad_settings_are_refused_by_flag() {
        let bad = MoeSettings {
            top_k: 9,
            ..MoeSettings::DEFAULT
        };
        let msg = bad.check(Naming::Flags).unwrap_err().to_string();
        assert!(
            msg.contains("--top-k 9") && msg.contains("--experts 8"),
            "{msg}"
        );
        let bad = MoeSettings {
            aux_loss: -1.0,
            ..MoeSettings::DEFAULT
        };
        assert!(bad
            .check(Naming::Fields)
            .unwrap_err()
            .to_string()
            .contains("moe.aux_loss"));
        assert_eq!(MoeSettings::DEFAULT.architecture(64).expert_hidden, 128);
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
