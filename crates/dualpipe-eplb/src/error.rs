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
    /// A load is negative, NaN, infinite or above the largest `f32`.
    #[error("invalid load {value} at layer {layer}, expert {expert}: loads must be finite and non-negative, and at most the largest f32 (3.4028235e38)")]
    InvalidLoad {
        /// Layer (row) of the bad value.
        layer: usize,
        /// Expert (column) of the bad value.
        expert: usize,
        /// The value itself.
        value: f64,
    },
    /// A layer's loads add up to more than the largest `f32` (the reference plans in `f32`).
    #[error("the loads of layer {layer} add up to {sum:e}, above the largest f32 (3.4028235e38); scale the loads down (only their ratios matter)")]
    LayerSumTooLarge {
        /// The layer.
        layer: usize,
        /// The sum of its loads.
        sum: f64,
    },
    /// A count such as `num_gpus` is zero.
    #[error("{name} is 0; it must be at least 1")]
    ZeroCount {
        /// Name of the parameter.
        name: &'static str,
    },
    /// A size is above this crate's cap ([`crate::MAX_SLOTS`]).
    #[error("{name} = {value} is above the cap of {cap} physical expert slots per plan; plan fewer layers at a time, or fewer replicas")]
    TooLarge {
        /// Name of the parameter.
        name: &'static str,
        /// The value given.
        value: usize,
        /// The cap.
        cap: usize,
    },
    /// The layout names another number of experts than the load matrix has.
    #[error(
        "the layout has {layout} experts but the loads have {loads}; give one load per expert"
    )]
    ExpertsMismatch {
        /// Experts of the layout.
        layout: usize,
        /// Experts (columns) of the loads.
        loads: usize,
    },
    /// The plan's `log2phy` would be too large ([`crate::MAX_LOG2PHY`]).
    #[error("log2phy would hold {entries} entries (layers x experts x {width} replicas of the most replicated expert), above the cap of {cap}; plan fewer layers at a time")]
    Log2phyTooLarge {
        /// Entries it would hold.
        entries: usize,
        /// Its width: the most replicas of one expert.
        width: usize,
        /// The cap.
        cap: usize,
    },
    /// `expert_bytes` times the slots of the plan does not fit in 64 bits.
    #[error("{expert_bytes} bytes per expert x {slots} slots overflows a 64-bit byte count; give the size of one expert's weights in bytes (at most {max})")]
    ExpertBytesOverflow {
        /// The size given.
        expert_bytes: u64,
        /// Slots of the plan (layers x replicas).
        slots: usize,
        /// The largest size that cannot overflow.
        max: u64,
    },
    /// The cluster shape is unusable for a planner.
    #[error("invalid layout: {0}")]
    Layout(String),
    /// The previous placement does not fit the layout or is not a placement.
    #[error("invalid previous placement: {0}; pass a phy2log matrix produced for the same experts, replicas and GPUs")]
    Previous(String),
    /// The previous placement was made for another topology.
    #[error("the previous placement was made for {recorded} but this plan is for {layout}; plan from scratch (no previous placement) or use the same GPUs and nodes")]
    PreviousTopology {
        /// The topology the previous plan records.
        recorded: String,
        /// The topology asked for now.
        layout: String,
    },
    /// A planner option is out of range.
    #[error("invalid option: {0}")]
    Option(String),
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
    /// A file could not be read (or is not a regular file, or is over its cap).
    #[error(transparent)]
    Read(#[from] dualpipe_io::ReadError),
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
