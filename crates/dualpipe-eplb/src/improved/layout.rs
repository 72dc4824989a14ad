//! The improved policy's inputs: the cluster [`Layout`], its [`PlannerOptions`] and the
//! [`PlannerError`]s.

/// Errors of the planner.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum PlannerError {
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
    /// Checks the divisibility rules of the reference policy.
    pub fn check(&self) -> Result<(), PlannerError> {
        let bad = |m: String| Err(PlannerError::Layout(m));
        for (name, v) in [
            ("experts", self.experts),
            ("replicas", self.replicas),
            ("groups", self.groups),
            ("nodes", self.nodes),
            ("gpus", self.gpus),
        ] {
            if v == 0 {
                return bad(format!("{name} is 0; it must be at least 1"));
            }
        }
        if !self.replicas.is_multiple_of(self.gpus) {
            return bad(format!(
                "{} replicas do not divide over {} GPUs; use a multiple of the GPU count",
                self.replicas, self.gpus
            ));
        }
        if !self.gpus.is_multiple_of(self.nodes) {
            return bad(format!(
                "{} GPUs do not divide over {} nodes",
                self.gpus, self.nodes
            ));
        }
        if !self.experts.is_multiple_of(self.groups) {
            return bad(format!(
                "{} experts do not divide into {} groups",
                self.experts, self.groups
            ));
        }
        if self.replicas < self.experts {
            return bad(format!(
                "{} replicas cannot hold {} experts; give at least one replica per expert",
                self.replicas, self.experts
            ));
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
