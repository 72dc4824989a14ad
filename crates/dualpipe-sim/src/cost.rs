//! The cost model: how long each op and each message takes.
//!
//! Compute: `F` (forward), `B` (full backward), `W` (deferred weight gradient), `I = B - W`
//! (input gradient only) and `F&B` (a forward overlapped with a full backward of another
//! chunk), uniform or per stage. Communication: every message costs `latency + bytes /
//! bandwidth` on its sender's communication stream, which overlaps the compute stream unless
//! [`CommCost::blocking`] is set (then the compute stream waits for its own sends). An MoE
//! stage with expert parallelism adds [`ExpertComm`]: the all-to-all waits inside its `F` and
//! `B` (or `I`), which an `F&B` pair can hide behind the other chunk's compute.

use dualpipe_schedule::Op;
use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::topology::Network;

/// Durations of the compute ops of one stage, in seconds (or any unit, used consistently).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageCost {
    /// Forward of one chunk.
    pub f: f64,
    /// Full backward (input and weight gradients) of one chunk.
    pub b: f64,
    /// Deferred weight gradient of one chunk (`W`); the input-gradient part is `B - W`.
    pub w: f64,
    /// A forward overlapped with a full backward (`F&B`).
    pub fb: f64,
}

impl StageCost {
    /// A stage cost from its four durations.
    pub const fn new(f: f64, b: f64, w: f64, fb: f64) -> Self {
        StageCost { f, b, w, fb }
    }

    /// The same costs with `extra` seconds of recomputed forward (see
    /// [`Recompute`](crate::Recompute)) run at the start of every backward: added to `B` and
    /// `F&B` (so to `I`), not to `W`.
    pub fn with_recompute(self, extra: f64) -> Self {
        StageCost {
            b: self.b + extra,
            fb: self.fb + extra,
            ..self
        }
    }

    /// Duration of `I`, the input-gradient-only backward: `B - W`.
    pub fn i(&self) -> f64 {
        self.b - self.w
    }

    /// Checks the durations: finite, non-negative, `W <= B`, and `F&B` at least as long as the
    /// longer of its two halves. `what` names the cost in error messages.
    pub fn check(&self, what: &str) -> Result<(), SimError> {
        for (name, value) in [
            ("F", self.f),
            ("B", self.b),
            ("W", self.w),
            ("F&B", self.fb),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(SimError::Cost(format!(
                    "{what}: duration {name} = {value} is invalid; durations must be finite numbers >= 0"
                )));
            }
        }
        if self.w > self.b {
            return Err(SimError::Cost(format!(
                "{what}: W = {} is longer than B = {}; W is the weight-gradient part of the full backward B, so W <= B",
                self.w, self.b
            )));
        }
        let longer = self.f.max(self.b);
        if self.fb < longer {
            return Err(SimError::Cost(format!(
                "{what}: F&B = {} is shorter than max(F, B) = {longer}; an overlapped forward and backward pair cannot finish before its longer half (set F&B between max(F, B) and F + B = {})",
                self.fb,
                self.f + self.b
            )));
        }
        Ok(())
    }
}

impl Default for StageCost {
    /// `F = 1, B = 2, W = 1, F&B = F + B = 3`.
    fn default() -> Self {
        StageCost::new(1.0, 2.0, 1.0, 3.0)
    }
}

/// Cost of point-to-point messages.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommCost {
    /// Fixed cost of every message, in seconds.
    pub latency: f64,
    /// Link bandwidth in bytes per second; `None` means infinite (the bytes cost nothing).
    pub bandwidth: Option<f64>,
    /// Size of every message in bytes (activations of one micro-batch at a stage boundary;
    /// gradients have the same shape).
    pub message_bytes: u64,
    /// When set, the compute stream waits for each of its own sends to complete (no
    /// overlap of computation and communication on the sending side).
    pub blocking: bool,
}

impl CommCost {
    /// Free, non-blocking communication (the setting of the DualPipe README's formulas).
    pub const FREE: CommCost = CommCost {
        latency: 0.0,
        bandwidth: None,
        message_bytes: 0,
        blocking: false,
    };

    /// Time one message occupies its sender's communication stream:
    /// `latency + message_bytes / bandwidth`.
    pub fn message_time(&self) -> f64 {
        let transfer = match self.bandwidth {
            Some(bw) => self.message_bytes as f64 / bw,
            None => 0.0,
        };
        self.latency + transfer
    }

    /// Checks latency (finite, `>= 0`) and bandwidth (finite, `> 0`).
    pub fn check(&self) -> Result<(), SimError> {
        if !self.latency.is_finite() || self.latency < 0.0 {
            return Err(SimError::Cost(format!(
                "communication latency = {} is invalid; it must be a finite number of seconds >= 0",
                self.latency
            )));
        }
        if let Some(bw) = self.bandwidth {
            if !bw.is_finite() || bw <= 0.0 {
                return Err(SimError::Cost(format!(
                    "bandwidth = {bw} bytes/s is invalid; it must be a finite number > 0 (leave it unset for infinite bandwidth)"
                )));
            }
        }
        Ok(())
    }
}

impl Default for CommCost {
    fn default() -> Self {
        CommCost::FREE
    }
}

/// The expert all-to-alls inside the compute ops of an MoE stage with expert parallelism:
/// a forward waits `forward` seconds on its dispatch and combine (every MoE block of the
/// stage), an input backward (`I`, or `B`) waits `backward` seconds on its gradient dispatch
/// and combine; `W` exchanges nothing. The stage's `F`, `B`, `I`, `W` and `F&B` are then
/// compute only (no waits in them).
///
/// A lone `F`, `B` or `I` pays its wait in full. An `F&B` pair with `overlap` runs its two
/// chunks side by side on one compute resource (one computes while the other waits), so it
/// lasts `max(F&B, F + forward + handover, B + backward + handover)`: the pair's compute, or
/// either chunk's own chain of compute, waits and hand-overs (a chunk whose wait is over
/// waits `handover` seconds in all to get the compute resource back from the other),
/// whichever is longer. Without `overlap` it lasts `F&B + forward + backward`.
///
/// Inside an overlapped pair a chunk's costs need not be a lone op's: its compute shares the
/// core with the other chunk's, and its all-to-alls wait for the peers' matching chunks, which
/// wait for their own compute tokens. [`ExpertComm::pair_chunks`] gives them as measured
/// inside the pairs; each chunk's chain is then its own compute + waits + hand-over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExpertComm {
    /// Seconds a forward waits on its all-to-alls.
    pub forward: f64,
    /// Seconds an input backward waits on its all-to-alls.
    pub backward: f64,
    /// Whether an `F&B` pair overlaps one chunk's waits with the other's compute.
    pub overlap: bool,
    /// Seconds an overlapped chunk's waits, all together, take to hand the compute back
    /// (0: at once).
    #[serde(default)]
    pub handover: f64,
    /// The forward and the backward chunk of an overlapped pair, each as it costs inside
    /// the pair (`None`: the lone `F` and `B` compute, `forward` and `backward` waits and
    /// `handover`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair_chunks: Option<[PairChunkCost; 2]>,
}

/// One chunk of an overlapped `F&B` pair, as it costs inside the pair (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PairChunkCost {
    /// Its compute.
    pub compute: f64,
    /// Its all-to-alls' waits, all together.
    pub wait: f64,
    /// Its all-to-alls' hand-overs (getting the compute back), all together.
    pub handover: f64,
}

impl ExpertComm {
    /// The waits of a stage with `moe_blocks` expert-parallel MoE blocks over a link of
    /// `latency` seconds and `bandwidth` bytes per second (`None`: infinite), an all-to-all's
    /// largest message `message_bytes`: two all-to-alls per block each way, each lasting
    /// `latency + message_bytes / bandwidth` (its messages travel side by side).
    pub fn of_link(
        moe_blocks: usize,
        latency: f64,
        bandwidth: Option<f64>,
        message_bytes: f64,
        overlap: bool,
    ) -> Self {
        let one = latency + bandwidth.map_or(0.0, |bw| message_bytes / bw);
        let wait = 2.0 * moe_blocks as f64 * one;
        ExpertComm {
            forward: wait,
            backward: wait,
            overlap,
            handover: 0.0,
            pair_chunks: None,
        }
    }

    /// The same waits with `handover` seconds of hand-over per overlapped chunk.
    pub fn with_handover(mut self, handover: f64) -> Self {
        self.handover = handover;
        self
    }

    /// The same waits with an overlapped pair's `forward` and `backward` chunks costing
    /// what they cost inside the pair.
    pub fn with_pair_chunks(mut self, forward: PairChunkCost, backward: PairChunkCost) -> Self {
        self.pair_chunks = Some([forward, backward]);
        self
    }

    /// Checks both waits, the hand-over and the pair's chunks: finite and `>= 0`.
    pub fn check(&self) -> Result<(), SimError> {
        let mut values = vec![
            ("forward", self.forward),
            ("backward", self.backward),
            ("pair hand-over", self.handover),
        ];
        if let Some([f, b]) = self.pair_chunks {
            values.extend([
                ("pair's forward chunk's compute", f.compute),
                ("pair's forward chunk's wait", f.wait),
                ("pair's forward chunk's hand-over", f.handover),
                ("pair's backward chunk's compute", b.compute),
                ("pair's backward chunk's wait", b.wait),
                ("pair's backward chunk's hand-over", b.handover),
            ]);
        }
        for (name, value) in values {
            if !value.is_finite() || value < 0.0 {
                return Err(SimError::Cost(format!(
                    "expert all-to-all cost: {name} = {value} is invalid; it must be a finite number of seconds >= 0"
                )));
            }
        }
        Ok(())
    }

    /// How long an `F&B` pair lasts: `f` and `b` its halves' lone compute, `fb` the pair's
    /// (with [`ExpertComm::pair_chunks`], overlapped, each chunk's chain is its own).
    pub fn pair(&self, f: f64, b: f64, fb: f64) -> f64 {
        if self.overlap {
            let h = self.handover;
            let [cf, cb] = self.pair_chunks.unwrap_or([
                PairChunkCost {
                    compute: f,
                    wait: self.forward,
                    handover: h,
                },
                PairChunkCost {
                    compute: b,
                    wait: self.backward,
                    handover: h,
                },
            ]);
            let chain = |c: PairChunkCost| c.compute + c.wait + c.handover;
            fb.max(chain(cf)).max(chain(cb))
        } else {
            fb + self.forward + self.backward
        }
    }
}

/// Durations of every op and message of a simulated step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Compute durations used by every stage without its own entry in `per_stage`.
    pub compute: StageCost,
    /// Optional per-stage durations, indexed by stage along a direction's pipeline (stage
    /// `s` of every direction holds the same layers). Empty means uniform.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_stage: Vec<StageCost>,
    /// Message costs.
    pub comm: CommCost,
    /// Optional relative compute speed of each rank (op durations are divided by it); empty
    /// means every rank runs at speed 1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_speed: Vec<f64>,
    /// Optional links between the ranks: when set, every message is charged by the link it
    /// crosses (see [`Network`]) instead of by `comm`'s latency and bandwidth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// Optional expert all-to-all waits inside every stage's compute ops (an MoE model with
    /// expert parallelism); `None`: the ops communicate nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_comm: Option<ExpertComm>,
}

impl CostModel {
    /// A uniform cost model with free communication.
    pub fn uniform(f: f64, b: f64, w: f64, fb: f64) -> Self {
        CostModel {
            compute: StageCost::new(f, b, w, fb),
            per_stage: Vec::new(),
            comm: CommCost::FREE,
            rank_speed: Vec::new(),
            network: None,
            expert_comm: None,
        }
    }

    /// The same model with expert all-to-all waits inside the compute ops.
    pub fn with_expert_comm(mut self, expert_comm: ExpertComm) -> Self {
        self.expert_comm = Some(expert_comm);
        self
    }

    /// The same model with per-rank relative speeds.
    pub fn with_rank_speed(mut self, rank_speed: Vec<f64>) -> Self {
        self.rank_speed = rank_speed;
        self
    }

    /// The same model with messages charged by the links of `network`.
    pub fn with_network(mut self, network: Network) -> Self {
        self.network = Some(network);
        self
    }

    /// The relative speed of `rank` (1 when no speeds are given).
    pub fn speed(&self, rank: usize) -> f64 {
        self.rank_speed.get(rank).copied().unwrap_or(1.0)
    }

    /// The same model with communication costs `comm`.
    pub fn with_comm(mut self, comm: CommCost) -> Self {
        self.comm = comm;
        self
    }

    /// The same model with per-stage compute durations.
    pub fn with_per_stage(mut self, per_stage: Vec<StageCost>) -> Self {
        self.per_stage = per_stage;
        self
    }

    /// Checks every duration (see [`StageCost::check`] and [`CommCost::check`]).
    pub fn check(&self) -> Result<(), SimError> {
        self.compute.check("cost model")?;
        for (stage, cost) in self.per_stage.iter().enumerate() {
            cost.check(&format!("cost of stage {stage}"))?;
        }
        for (rank, &speed) in self.rank_speed.iter().enumerate() {
            if !speed.is_finite() || speed <= 0.0 {
                return Err(SimError::Cost(format!(
                    "speed of rank {rank} = {speed} is invalid; relative speeds must be finite numbers > 0"
                )));
            }
        }
        if let Some(e) = &self.expert_comm {
            e.check()?;
        }
        self.comm.check()
    }

    /// The compute durations of `stage` (its `per_stage` entry, or the uniform ones).
    pub fn stage(&self, stage: usize) -> &StageCost {
        self.per_stage.get(stage).unwrap_or(&self.compute)
    }

    /// How long a compute op takes (0 for communication ops, which the comm stream carries).
    /// An `FB` pair of two different stages costs the mean of their two `F&B` values. With
    /// [`CostModel::expert_comm`], `F`, `B` and `I` add their all-to-all waits and an `FB`
    /// pair lasts [`ExpertComm::pair`].
    pub fn duration(&self, op: &Op) -> f64 {
        let (wf, wb) = self
            .expert_comm
            .map_or((0.0, 0.0), |e| (e.forward, e.backward));
        match *op {
            Op::F(c) => self.stage(c.stage).f + wf,
            Op::B(c) => self.stage(c.stage).b + wb,
            Op::I(c) => self.stage(c.stage).i() + wb,
            Op::W(c) => self.stage(c.stage).w,
            Op::FB { f, b } => {
                let fb = if f.stage == b.stage {
                    self.stage(f.stage).fb
                } else {
                    0.5 * (self.stage(f.stage).fb + self.stage(b.stage).fb)
                };
                match &self.expert_comm {
                    Some(e) => e.pair(self.stage(f.stage).f, self.stage(b.stage).b, fb),
                    None => fb,
                }
            }
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualpipe_schedule::Chunk;

    #[test]
    fn recompute_is_charged_to_the_backward() {
        let s = StageCost::new(1.0, 2.0, 0.5, 2.5).with_recompute(0.75);
        assert_eq!((s.f, s.b, s.w, s.fb, s.i()), (1.0, 2.75, 0.5, 3.25, 2.25));
    }

    #[test]
    fn durations_follow_the_model() {
        let cost = CostModel::uniform(1.0, 2.0, 0.5, 2.5);
        let c = Chunk::new(0, 0, 0);
        assert_eq!(cost.duration(&Op::F(c)), 1.0);
        assert_eq!(cost.duration(&Op::B(c)), 2.0);
        assert_eq!(cost.duration(&Op::I(c)), 1.5);
        assert_eq!(cost.duration(&Op::W(c)), 0.5);
        assert_eq!(cost.duration(&Op::FB { f: c, b: c }), 2.5);
        assert_eq!(cost.duration(&Op::Wait), 0.0);
    }

    #[test]
    fn per_stage_costs_override_the_uniform_ones() {
        let cost = CostModel::uniform(1.0, 2.0, 1.0, 3.0).with_per_stage(vec![
            StageCost::new(1.0, 2.0, 1.0, 3.0),
            StageCost::new(2.0, 4.0, 2.0, 5.0),
        ]);
        let f = Chunk::new(0, 0, 0);
        let b = Chunk::new(1, 1, 0);
        assert_eq!(cost.duration(&Op::F(b)), 2.0);
        assert_eq!(cost.duration(&Op::FB { f, b }), 4.0);
        assert_eq!(cost.duration(&Op::F(Chunk::new(0, 7, 0))), 1.0);
    }

    #[test]
    fn bad_durations_are_rejected_with_a_reason() {
        let err = CostModel::uniform(-1.0, 2.0, 1.0, 3.0).check().unwrap_err();
        assert!(err.to_string().contains("F = -1"), "{err}");
        let err = CostModel::uniform(1.0, 2.0, 3.0, 3.0).check().unwrap_err();
        assert!(err.to_string().contains("W <= B"), "{err}");
        let err = CostModel::uniform(1.0, 2.0, 1.0, 1.5).check().unwrap_err();
        assert!(err.to_string().contains("max(F, B)"), "{err}");
        let err = CostModel::uniform(1.0, f64::NAN, 1.0, 3.0)
            .check()
            .unwrap_err();
        assert!(err.to_string().contains("B = NaN"), "{err}");
        let comm = CommCost {
            bandwidth: Some(0.0),
            ..CommCost::FREE
        };
        assert!(CostModel::default().with_comm(comm).check().is_err());
        assert!(CostModel::default().check().is_ok());
    }

    #[test]
    fn an_fb_pair_hides_the_all_to_all_a_lone_op_pays() {
        // F = 1, B = 2, W = 0.5, F&B = 3; each chunk waits 1.5 s on its all-to-alls.
        let comm = ExpertComm {
            forward: 1.5,
            backward: 1.5,
            overlap: true,
            handover: 0.0,
            pair_chunks: None,
        };
        let cost = CostModel::uniform(1.0, 2.0, 0.5, 3.0).with_expert_comm(comm);
        let c = Chunk::new(0, 0, 0);
        assert_eq!(cost.duration(&Op::F(c)), 2.5);
        assert_eq!(cost.duration(&Op::B(c)), 3.5);
        assert_eq!(cost.duration(&Op::I(c)), 3.0);
        assert_eq!(cost.duration(&Op::W(c)), 0.5);
        // Overlapped: the backward's chain 2 + 1.5 is the longest (the pair's compute is 3,
        // the forward's chain 1 + 1.5); sequential: 3 + 1.5 + 1.5.
        assert_eq!(cost.duration(&Op::FB { f: c, b: c }), 3.5);
        let apart = cost.clone().with_expert_comm(ExpertComm {
            overlap: false,
            ..comm
        });
        assert_eq!(apart.duration(&Op::FB { f: c, b: c }), 6.0);
        // Short waits hide completely: the pair costs its compute.
        let short = cost.clone().with_expert_comm(ExpertComm {
            forward: 0.25,
            backward: 0.5,
            ..comm
        });
        assert_eq!(short.duration(&Op::FB { f: c, b: c }), 3.0);
        // A hand-over of 0.75 s per chunk lengthens the backward's chain to 2 + 1.5 + 0.75;
        // the short waits' chains stay below the pair's compute (2 + 0.5 + 0.25 < 3).
        let handed = cost.clone().with_expert_comm(comm.with_handover(0.75));
        assert_eq!(handed.duration(&Op::FB { f: c, b: c }), 4.25);
        let short_handed = short.with_expert_comm(ExpertComm {
            forward: 0.25,
            backward: 0.5,
            ..comm.with_handover(0.25)
        });
        assert_eq!(short_handed.duration(&Op::FB { f: c, b: c }), 3.0);
        // The hand-over is an overlapped pair's only: a sequential pair and a lone op pay none.
        let apart_handed = cost.clone().with_expert_comm(ExpertComm {
            overlap: false,
            ..comm.with_handover(0.75)
        });
        assert_eq!(apart_handed.duration(&Op::FB { f: c, b: c }), 6.0);
        assert_eq!(apart_handed.duration(&Op::F(c)), 2.5);
        // Chunks that cost more inside the pair (compute 1.25 and 1.75, waits 2 and 1.5,
        // hand-overs 0.5 and 0.25): the forward's chain 1.25 + 2 + 0.5 = 3.75 is the longest;
        // a sequential pair and lone ops ignore them.
        let inside = |compute, wait, handover| PairChunkCost {
            compute,
            wait,
            handover,
        };
        let chunks = comm.with_pair_chunks(inside(1.25, 2.0, 0.5), inside(1.75, 1.5, 0.25));
        let measured = cost.clone().with_expert_comm(chunks);
        assert_eq!(measured.duration(&Op::FB { f: c, b: c }), 3.75);
        assert_eq!(measured.duration(&Op::F(c)), 2.5);
        let apart_measured = cost.clone().with_expert_comm(ExpertComm {
            overlap: false,
            ..chunks
        });
        assert_eq!(apart_measured.duration(&Op::FB { f: c, b: c }), 6.0);
        let bad_chunk = cost.clone().with_expert_comm(
            comm.with_pair_chunks(inside(1.0, f64::NAN, 0.0), inside(1.0, 1.0, 0.0)),
        );
        assert!(bad_chunk
            .check()
            .unwrap_err()
            .to_string()
            .contains("forward chunk's wait"));
        // From link parameters: 2 blocks, 4 all-to-alls of 0.5 + 100 / 200 s each way.
        let link = ExpertComm::of_link(2, 0.5, Some(200.0), 100.0, true);
        assert_eq!((link.forward, link.backward), (4.0, 4.0));
        let bad = cost.with_expert_comm(ExpertComm {
            forward: -1.0,
            ..comm
        });
        assert!(bad
            .check()
            .unwrap_err()
            .to_string()
            .contains("forward = -1"));
    }

    #[test]
    fn message_time_is_latency_plus_transfer() {
        let comm = CommCost {
            latency: 0.5,
            bandwidth: Some(100.0),
            message_bytes: 50,
            blocking: false,
        };
        assert_eq!(comm.message_time(), 1.0);
        assert_eq!(CommCost::FREE.message_time(), 0.0);
    }
}
