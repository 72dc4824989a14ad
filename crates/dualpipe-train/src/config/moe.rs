//! [`MoeSettings`]: the configuration's section of the GPT's mixture of experts (the experts
//! themselves in training are [`crate::parallel::experts`]).

use dualpipe_nn::gpt::moe::parallel::LinkModel;
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

#[cfg(test)]
mod tests {
    use super::*;

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
