//! Errors of the cost model and the simulator.

/// Anything that can go wrong while checking a cost model or simulating a schedule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// A cost-model value is out of range. The message names the value and the valid range.
    #[error("{0}")]
    Cost(String),
    /// The schedule cannot be simulated as written (a missing message, a producer that runs
    /// after its consumer, a chunk outside the placement, a deadlock). The message names the
    /// rank, the op and the rule.
    #[error("{0}")]
    Schedule(String),
    /// Every cost is finite but the simulated times add up past the largest `f64`. The message
    /// names the first op or message that ends at infinity.
    #[error("{0}")]
    Overflow(String),
    /// A topology file or network is malformed. The message names the field and the fix.
    #[error("{0}")]
    Topology(String),
}
