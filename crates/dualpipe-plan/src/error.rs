//! Errors of the planner.

/// Anything that can go wrong while reading inputs or planning.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// A cost profile is malformed. The message names the field and the fix.
    #[error("{0}")]
    Profile(String),
    /// A previous plan is malformed or does not fit the profile.
    #[error("{0}")]
    Previous(String),
    /// No plan fits: too few layers, too little memory, no schedule accepts the sizes.
    #[error("{0}")]
    NoPlan(String),
    /// The simulator refused a candidate (a bad topology, a cost overflow).
    #[error(transparent)]
    Sim(#[from] dualpipe_sim::SimError),
}
