//! The one description of a cluster and model for balancing, [`Layout`], and the one validator
//! of a planning request, [`Layout::validate`].
//!
//! Physical expert slots (replicas) are numbered `0 .. replicas` per layer; slot `p` lives on
//! GPU `p / (replicas / gpus)` and node `gpu / (gpus / nodes)`.

use crate::matrix::LoadMatrix;
use crate::plan::Policy;
use crate::EplbError;

/// The most physical expert slots one plan may hold, over all layers (`layers x replicas`,
/// 2^24 = 16,777,216; the outputs alone take 32 bytes per slot and the planners several
/// times that). Also the most replicas per layer. Plan fewer layers at a time above it.
pub const MAX_SLOTS: usize = 1 << 24;

/// The most entries `log2phy` (`layers x experts x most replicas of an expert`) may hold
/// (2^26, 512 MiB of `i64`).
pub const MAX_LOG2PHY: usize = 1 << 26;

/// The largest load a cell, and the sum of one layer's loads, may hold: the largest finite
/// `f32`. The reference policy plans in `f32`, so larger values would become infinite there.
pub const MAX_LOAD: f64 = f32::MAX as f64;

/// The shape of the model and the cluster, per MoE layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Logical experts per layer.
    pub experts: usize,
    /// Physical experts (replicas) per layer; a multiple of `gpus`, at least `experts`.
    pub replicas: usize,
    /// Expert groups (consecutive experts of equal count); divides `experts`.
    pub groups: usize,
    /// Nodes; divides `gpus`.
    pub nodes: usize,
    /// GPUs in total.
    pub gpus: usize,
}

impl Layout {
    /// A layout from its five sizes.
    pub fn new(experts: usize, replicas: usize, groups: usize, nodes: usize, gpus: usize) -> Self {
        Layout {
            experts,
            replicas,
            groups,
            nodes,
            gpus,
        }
    }

    /// The layout of `loads`' experts on `replicas` slots, `groups` groups, `nodes` nodes and
    /// `gpus` GPUs.
    pub fn of_loads(
        loads: &LoadMatrix,
        replicas: usize,
        groups: usize,
        nodes: usize,
        gpus: usize,
    ) -> Self {
        Layout::new(loads.cols(), replicas, groups, nodes, gpus)
    }

    /// Checks the sizes and the loads, in the order and with the messages of DeepSeek's
    /// reference checks, plus the caps of this crate ([`MAX_SLOTS`], [`MAX_LOAD`]).
    pub fn validate(&self, loads: &LoadMatrix) -> Result<(), EplbError> {
        for (name, value) in [
            ("num_replicas", self.replicas),
            ("num_groups", self.groups),
            ("num_nodes", self.nodes),
            ("num_gpus", self.gpus),
        ] {
            if value == 0 {
                return Err(EplbError::ZeroCount { name });
            }
            if value > MAX_SLOTS {
                return Err(EplbError::TooLarge {
                    name,
                    value,
                    cap: MAX_SLOTS,
                });
            }
        }
        if loads.rows() == 0 || loads.cols() == 0 {
            return Err(EplbError::EmptyLoads {
                layers: loads.rows(),
                experts: loads.cols(),
            });
        }
        if loads.cols() != self.experts {
            return Err(EplbError::ExpertsMismatch {
                layout: self.experts,
                loads: loads.cols(),
            });
        }
        let slots = loads.rows().saturating_mul(self.replicas);
        if slots > MAX_SLOTS {
            return Err(EplbError::TooLarge {
                name: "layers x num_replicas",
                value: slots,
                cap: MAX_SLOTS,
            });
        }
        check_load_values(loads)?;
        let experts = self.experts;
        if !experts.is_multiple_of(self.groups) {
            return Err(EplbError::ExpertsNotMultipleOfGroups {
                experts,
                groups: self.groups,
            });
        }
        if self.replicas < experts {
            return Err(EplbError::FewerReplicasThanExperts {
                replicas: self.replicas,
                experts,
            });
        }
        if !self.replicas.is_multiple_of(self.gpus) {
            return Err(EplbError::ReplicasNotMultipleOfGpus {
                replicas: self.replicas,
                gpus: self.gpus,
            });
        }
        if !self.gpus.is_multiple_of(self.nodes) {
            return Err(EplbError::GpusNotMultipleOfNodes {
                gpus: self.gpus,
                nodes: self.nodes,
            });
        }
        Ok(())
    }

    /// The reference policy `policy` runs as on this layout: [`Policy::Auto`] resolved, and
    /// [`Policy::Hierarchical`] refused when the groups do not divide over the nodes.
    pub fn resolve(&self, policy: Policy) -> Result<Policy, EplbError> {
        let policy = policy.resolve(self.groups, self.nodes);
        if policy == Policy::Hierarchical && !self.groups.is_multiple_of(self.nodes) {
            return Err(EplbError::GroupsNotMultipleOfNodes {
                groups: self.groups,
                nodes: self.nodes,
            });
        }
        Ok(policy)
    }

    /// Whether the hierarchical policy applies (groups divide over nodes).
    pub fn hierarchical(&self) -> bool {
        self.groups.is_multiple_of(self.nodes)
    }

    /// Slots on one GPU.
    pub fn slots_per_gpu(&self) -> usize {
        self.replicas / self.gpus.max(1)
    }

    /// GPUs on one node.
    pub fn gpus_per_node(&self) -> usize {
        self.gpus / self.nodes.max(1)
    }

    /// The placement domains of the improved policy: `(nodes of the policy, GPUs per domain)`.
    pub(crate) fn domains(&self) -> (usize, usize) {
        if self.hierarchical() {
            (self.nodes, self.gpus_per_node())
        } else {
            (1, self.gpus)
        }
    }

    /// Groups of the improved policy (1 for the global policy).
    pub(crate) fn policy_groups(&self) -> usize {
        if self.hierarchical() {
            self.groups
        } else {
            1
        }
    }
}

impl std::fmt::Display for Layout {
    /// `8 replicas of 4 experts (2 groups) on 4 GPUs in 2 nodes`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} replicas of {} experts ({} groups) on {} GPUs in {} nodes",
            self.replicas, self.experts, self.groups, self.gpus, self.nodes
        )
    }
}

/// Checks every load (finite, non-negative, at most [`MAX_LOAD`]) and every layer's sum (at
/// most [`MAX_LOAD`]), layer by layer.
fn check_load_values(loads: &LoadMatrix) -> Result<(), EplbError> {
    for (layer, row) in loads.iter_rows().enumerate() {
        if let Some(expert) = row
            .iter()
            .position(|v| !(v.is_finite() && *v >= 0.0 && *v <= MAX_LOAD))
        {
            return Err(EplbError::InvalidLoad {
                layer,
                expert,
                value: row[expert],
            });
        }
        let sum: f64 = row.iter().sum();
        if sum > MAX_LOAD {
            return Err(EplbError::LayerSumTooLarge { layer, sum });
        }
    }
    Ok(())
}
