//! The improved policy's inputs: the cluster [`Layout`], its [`PlannerOptions`] and the
//! [`PlannerError`]s.

use crate::EplbError;

/// Errors of the planner.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlannerError {
    /// The sizes or loads break a rule of the reference policy (same message as it gives).
    #[error(transparent)]
    Eplb(#[from] EplbError),
    /// The cluster shape is unusable.
    #[error("invalid layout: {0}")]
    Layout(String),
    /// The load matrix does not fit the layout.
    #[error("invalid loads: {0}")]
    Loads(String),
    /// The previous placement does not fit the layout or is not a placement.
    #[error("invalid previous placement: {0}; pass a phy2log matrix produced for the same experts, replicas and GPUs")]
    Previous(String),
    /// An option is out of range.
    #[error("invalid option: {0}")]
    Option(String),
}

/// The shape of the cluster and the model, per layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Logical experts per layer.
    pub experts: usize,
    /// Physical experts (replicas) per layer; a multiple of `gpus`.
    pub replicas: usize,
    /// Expert groups; divides `experts`.
    pub groups: usize,
    /// Nodes; divides `gpus`.
    pub nodes: usize,
    /// GPUs.
    pub gpus: usize,
}

impl Layout {
    /// Checks the sizing rules of the reference policy, with its messages.
    pub fn check(&self) -> Result<(), PlannerError> {
        self.check_with(&[vec![0.0; self.experts]])
    }

    /// Checks the sizes and `load` (`[layers][experts]`) in the order and with the messages of
    /// the reference policy's checks, plus a bound on the planner's working memory.
    pub fn check_with(&self, load: &[Vec<f64>]) -> Result<(), PlannerError> {
        for (name, value) in [
            ("num_replicas", self.replicas),
            ("num_groups", self.groups),
            ("num_nodes", self.nodes),
            ("num_gpus", self.gpus),
        ] {
            if value == 0 {
                return Err(EplbError::ZeroCount { name }.into());
            }
            if value > u32::MAX as usize / 2 {
                return Err(EplbError::TooLarge { name, value }.into());
            }
        }
        let experts = self.experts;
        if load.is_empty() || experts == 0 {
            return Err(EplbError::EmptyLoads {
                layers: load.len(),
                experts,
            }
            .into());
        }
        if let Some((layer, row)) = load.iter().enumerate().find(|(_, r)| r.len() != experts) {
            return Err(EplbError::RaggedLoads {
                layer,
                len: row.len(),
                expected: experts,
            }
            .into());
        }
        let slots = load.len().saturating_mul(self.replicas);
        if slots > 1 << 31 {
            return Err(EplbError::TooLarge {
                name: "layers x num_replicas",
                value: slots,
            }
            .into());
        }
        for (layer, row) in load.iter().enumerate() {
            if let Some(expert) = row.iter().position(|v| !(v.is_finite() && *v >= 0.0)) {
                return Err(EplbError::InvalidLoad {
                    layer,
                    expert,
                    value: row[expert],
                }
                .into());
            }
        }
        if !experts.is_multiple_of(self.groups) {
            return Err(EplbError::ExpertsNotMultipleOfGroups {
                experts,
                groups: self.groups,
            }
            .into());
        }
        if self.replicas < experts {
            return Err(EplbError::FewerReplicasThanExperts {
                replicas: self.replicas,
                experts,
            }
            .into());
        }
        if !self.replicas.is_multiple_of(self.gpus) {
            return Err(EplbError::ReplicasNotMultipleOfGpus {
                replicas: self.replicas,
                gpus: self.gpus,
            }
            .into());
        }
        if !self.gpus.is_multiple_of(self.nodes) {
            return Err(EplbError::GpusNotMultipleOfNodes {
                gpus: self.gpus,
                nodes: self.nodes,
            }
            .into());
        }
        // The planner keeps a GPU x expert table per domain.
        let (domains, gpd) = self.domains();
        let cells = (gpd as u128) * (experts / domains) as u128;
        if cells > 1 << 28 {
            return Err(PlannerError::Layout(format!(
                "{gpd} GPUs x {} experts in one placement domain is too large for the improved policy (at most 2^28); use --policy deepseek or more nodes",
                experts / domains
            )));
        }
        Ok(())
    }

    /// Whether the hierarchical policy applies (groups divide over nodes).
    pub fn hierarchical(&self) -> bool {
        self.groups.is_multiple_of(self.nodes)
    }

    /// Slots on one GPU.
    pub fn slots_per_gpu(&self) -> usize {
        self.replicas / self.gpus
    }

    /// GPUs on one node.
    pub fn gpus_per_node(&self) -> usize {
        self.gpus / self.nodes
    }

    /// The placement domains: `(nodes of the policy, GPUs per domain)`.
    pub(crate) fn domains(&self) -> (usize, usize) {
        if self.hierarchical() {
            (self.nodes, self.gpus_per_node())
        } else {
            (1, self.gpus)
        }
    }

    /// Groups of the policy (1 for the global policy).
    pub(crate) fn policy_groups(&self) -> usize {
        if self.hierarchical() {
            self.groups
        } else {
            1
        }
    }
}

/// Knobs of the improved policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlannerOptions {
    /// With a previous placement: how much hotter than a fresh plan the hottest GPU of a layer
    /// may be, as a fraction (0.0 = no worse than a fresh plan of this policy).
    pub tolerance: f64,
    /// With a previous placement: leave a layer untouched while its hottest GPU carries at most
    /// this multiple of the mean GPU load (hysteresis). `None` re-plans every layer.
    pub min_imbalance: Option<f64>,
    /// Steps of the improvement pass per domain.
    pub search_steps: usize,
    /// With a previous placement: the most replicas of a domain that the re-plan from the
    /// previous placement may move, as a fraction of the domain's slots; past it the fresh plan
    /// (relabelled) is used.
    pub max_move_fraction: f64,
    /// Packing ties: a GPU that held the expert before wins when its load is within this
    /// fraction of the mean GPU load of the least-loaded candidate.
    pub near_equal: f64,
}

impl Default for PlannerOptions {
    fn default() -> Self {
        PlannerOptions {
            tolerance: 0.0,
            min_imbalance: None,
            search_steps: 256,
            max_move_fraction: 0.5,
            near_equal: 0.02,
        }
    }
}

impl PlannerOptions {
    /// Checks that every option is in range.
    pub fn check(&self) -> Result<(), PlannerError> {
        let bad = |m: String| Err(PlannerError::Option(m));
        if !(self.tolerance.is_finite() && self.tolerance >= 0.0) {
            return bad(format!(
                "tolerance {} must be a finite number >= 0",
                self.tolerance
            ));
        }
        if let Some(x) = self.min_imbalance {
            if !(x.is_finite() && x >= 1.0) {
                return bad(format!(
                    "min-imbalance {x} must be a finite number >= 1 (max / mean)"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.max_move_fraction) {
            return bad(format!(
                "max-move-fraction {} must be in [0, 1]",
                self.max_move_fraction
            ));
        }
        if !(self.near_equal.is_finite() && self.near_equal >= 0.0) {
            return bad(format!(
                "near-equal {} must be a finite number >= 0",
                self.near_equal
            ));
        }
        Ok(())
    }
}
