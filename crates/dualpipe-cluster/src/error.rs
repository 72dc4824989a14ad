//! Why a cluster file, a trace or a simulation was refused.

/// A refusal, naming the file's field or row, the value and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The cluster file is malformed or holds a bad value.
    #[error("cluster: {0}")]
    Cluster(String),
    /// A trace row is malformed or holds a bad value.
    #[error("trace: {0}")]
    Trace(String),
    /// A job's model profile could not be read or planned.
    #[error("profile: {0}")]
    Profile(String),
    /// The generator's parameters are out of range.
    #[error("synthetic trace: {0}")]
    Synth(String),
    /// A placement file is malformed or holds a bad value.
    #[error("placement: {0}")]
    NodePlacement(String),
    /// The scheduler of the real mode cannot start (its state directory, address, slots).
    #[error("{0}")]
    Serve(String),
}
