//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong when balancing experts or reading loads.
///
/// Each message says what is wrong, where, and how to fix it, so a command-line tool can print
/// it as it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EplbError {
    /// The load matrix has no layers or no experts.
    #[error("the load matrix is empty ({layers} layers x {experts} experts); give at least one layer with at least one expert")]
    EmptyLoads {
        /// Number of layers (rows) given.
        layers: usize,
        /// Number of experts (columns) given.
        experts: usize,
    },
    /// A row of the load matrix has a different length than the first row.
    #[error("ragged load matrix: layer {layer} has {len} experts but layer 0 has {expected}; every layer must list the same experts")]
    RaggedLoads {
        /// The offending layer (row).
        layer: usize,
        /// Its length.
        len: usize,
        /// The length of the first row.
        expected: usize,
    },
    /// A flat buffer does not hold `layers x experts` values.
    #[error("a {layers} x {experts} load matrix needs {expected} values but {len} were given")]
    ShapeMismatch {
        /// Layers asked for.
        layers: usize,
        /// Experts asked for.
        experts: usize,
        /// `layers * experts`.
        expected: usize,
        /// Values given.
        len: usize,
    },
    /// A load is negative, NaN or infinite.
    #[error("invalid load {value} at layer {layer}, expert {expert}: loads must be finite and non-negative")]
    InvalidLoad {
        /// Layer (row) of the bad value.
        layer: usize,
        /// Expert (column) of the bad value.
        expert: usize,
        /// The value itself.
        value: f64,
    },
    /// A count such as `num_gpus` is zero.
    #[error("{name} is 0; it must be at least 1")]
    ZeroCount {
        /// Name of the parameter.
        name: &'static str,
    },
    /// A count is too large for the balancer's 32-bit indices.
    #[error(
        "{name} = {value} is too large; it must be below 2^31 (split the layers into several runs)"
    )]
    TooLarge {
        /// Name of the parameter.
        name: &'static str,
        /// The value given.
        value: usize,
    },
    /// `num_replicas` is not a multiple of `num_gpus`.
    #[error("{replicas} replicas do not divide evenly over {gpus} GPUs; choose a number of replicas that is a multiple of the number of GPUs")]
    ReplicasNotMultipleOfGpus {
        /// Physical experts (replicas) per layer.
        replicas: usize,
        /// GPUs.
        gpus: usize,
    },
    /// `num_gpus` is not a multiple of `num_nodes`.
    #[error("{gpus} GPUs do not divide evenly over {nodes} nodes; every node must hold the same number of GPUs")]
    GpusNotMultipleOfNodes {
        /// GPUs.
        gpus: usize,
        /// Nodes.
        nodes: usize,
    },
    /// The number of experts is not a multiple of `num_groups`.
    #[error("{experts} experts do not divide evenly into {groups} groups; every expert group must hold the same number of experts")]
    ExpertsNotMultipleOfGroups {
        /// Logical experts per layer.
        experts: usize,
        /// Expert groups.
        groups: usize,
    },
    /// The hierarchical policy was asked for but the groups do not divide over the nodes.
    #[error("the hierarchical policy needs the {groups} expert groups to divide evenly over the {nodes} nodes; use the global policy or change the number of groups or nodes")]
    GroupsNotMultipleOfNodes {
        /// Expert groups.
        groups: usize,
        /// Nodes.
        nodes: usize,
    },
    /// Fewer physical slots than logical experts.
    #[error("{replicas} replicas cannot hold {experts} experts; give at least one replica per expert (num_replicas >= {experts})")]
    FewerReplicasThanExperts {
        /// Physical experts (replicas) per layer.
        replicas: usize,
        /// Logical experts per layer.
        experts: usize,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A load file could be read but not understood.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, where, and how to fix it.
        message: String,
    },
    /// A history (3-D load array) could not be reduced to one load matrix.
    #[error("{0}")]
    History(String),
}
