//! [`Field`] and [`Naming`]: how the one check (and the job) names a configuration field, in
//! Rust / JSON words or in flags.

/// A configuration field, for messages: [`Naming::Fields`] calls it by its JSON name
/// (`micro_batch_size`; a job's own sections by their path, `checkpoint.dir`),
/// [`Naming::Flags`] by its command-line flag (`--micro-batch-size`), so the one check speaks
/// the words of whoever called it. The fields are [`TrainConfig`](super::TrainConfig)'s and
/// [`JobConfig`](crate::job::JobConfig)'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// The schedule kind.
    Schedule,
    /// [`ScheduleSection::ranks`](super::ScheduleSection::ranks).
    Ranks,
    /// [`ScheduleSection::micro_batches`](super::ScheduleSection::micro_batches).
    MicroBatches,
    /// [`ScheduleSection::micro_batch_size`](super::ScheduleSection::micro_batch_size).
    MicroBatchSize,
    /// [`ScheduleSection::virtual_stages`](super::ScheduleSection::virtual_stages).
    VirtualStages,
    /// [`ModelSection::hidden`](super::ModelSection::hidden).
    Hidden,
    /// [`ModelSection::layers_per_stage`](super::ModelSection::layers_per_stage).
    LayersPerStage,
    /// [`TrainConfig::steps`](super::TrainConfig::steps).
    Steps,
    /// [`OptimizerSection::lr`](super::OptimizerSection::lr).
    Lr,
    /// [`OptimizerSection::lr_warmup`](super::OptimizerSection::lr_warmup).
    LrWarmup,
    /// [`OptimizerSection::lr_decay`](super::OptimizerSection::lr_decay).
    LrDecay,
    /// [`OptimizerSection::lr_min`](super::OptimizerSection::lr_min).
    LrMin,
    /// [`TransportSection::recv_timeout`](super::TransportSection::recv_timeout).
    RecvTimeout,
    /// [`ModelSection::dtype`](super::ModelSection::dtype).
    DType,
    /// [`ModelSection::d_model`](super::ModelSection::d_model).
    DModel,
    /// [`ModelSection::heads`](super::ModelSection::heads).
    Heads,
    /// [`ModelSection::seq_len`](super::ModelSection::seq_len).
    SeqLen,
    /// [`DataSection::path`](super::DataSection::path).
    Data,
    /// [`DataSection::validation_fraction`](super::DataSection::validation_fraction).
    ValidationFraction,
    /// [`ModelSection::init_from`](super::ModelSection::init_from).
    InitFrom,
    /// [`OptimizerSection::clip_grad`](super::OptimizerSection::clip_grad).
    ClipGrad,
    /// [`ParallelismSection::data_parallel`](super::ParallelismSection::data_parallel).
    DataParallel,
    /// [`ParallelismSection::bucket_mb`](super::ParallelismSection::bucket_mb).
    BucketMb,
    /// SGD's momentum in [`OptimizerSection::kind`](super::OptimizerSection::kind).
    Momentum,
    /// The compression warm-up.
    CompressionWarmup,
    /// 1-bit Adam's variance refresh period.
    VarianceRefresh,
    /// The seed.
    Seed,
    /// The synthetic task.
    Task,
    /// The shuffled order of the data.
    Shuffle,
    /// A job's checkpoint directory.
    CheckpointDir,
    /// A job's steps between checkpoints.
    CheckpointEvery,
    /// A job resuming its checkpoint directory's latest checkpoint.
    Resume,
    /// A job resuming a given checkpoint.
    ResumeFrom,
    /// A job resuming its checkpoint directory's latest checkpoint if it has one.
    ResumeIfPresent,
    /// A resumed job's permission to change the data settings.
    AllowChangedSettings,
    /// A job's metrics address.
    MetricsAddr,
    /// A job's run log.
    Log,
    /// Where a job's final weights go.
    Save,
    /// Where a job's ranks run.
    Transport,
    /// A failure injected into a job.
    InjectFailure,
    /// [`ModelSection::partition`](super::ModelSection::partition).
    Partition,
    /// [`ParallelismSection::slow_rank`](super::ParallelismSection::slow_rank).
    SlowRank,
    /// [`ParallelismSection::rebalance`](super::ParallelismSection::rebalance): stage
    /// re-balancing on.
    Rebalance,
    /// The re-balancing threshold, [`RebalanceSettings::threshold`](crate::RebalanceSettings::threshold).
    RebalanceThreshold,
    /// The re-balancing window, [`RebalanceSettings::window`](crate::RebalanceSettings::window).
    RebalanceWindow,
    /// The overlap of the MoE all-to-alls, [`MoeSettings::overlap`](crate::MoeSettings::overlap).
    MoeOverlap,
    /// [`ModelSection::recompute`](super::ModelSection::recompute).
    Recompute,
    /// [`ModelSection::half_projections`](super::ModelSection::half_projections).
    HalfProjections,
}

/// How messages name a [`Field`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Naming {
    /// By field name (`micro_batch_size`): library users.
    #[default]
    Fields,
    /// By flag (`--micro-batch-size`): the command line.
    Flags,
}

impl Field {
    /// Every field, in declaration order.
    pub const ALL: [Field; 48] = [
        Field::Schedule,
        Field::Ranks,
        Field::MicroBatches,
        Field::MicroBatchSize,
        Field::VirtualStages,
        Field::Hidden,
        Field::LayersPerStage,
        Field::Steps,
        Field::Lr,
        Field::LrWarmup,
        Field::LrDecay,
        Field::LrMin,
        Field::RecvTimeout,
        Field::DType,
        Field::DModel,
        Field::Heads,
        Field::SeqLen,
        Field::Data,
        Field::ValidationFraction,
        Field::InitFrom,
        Field::ClipGrad,
        Field::DataParallel,
        Field::BucketMb,
        Field::Momentum,
        Field::CompressionWarmup,
        Field::VarianceRefresh,
        Field::Seed,
        Field::Task,
        Field::Shuffle,
        Field::CheckpointDir,
        Field::CheckpointEvery,
        Field::Resume,
        Field::ResumeFrom,
        Field::ResumeIfPresent,
        Field::AllowChangedSettings,
        Field::MetricsAddr,
        Field::Log,
        Field::Save,
        Field::Transport,
        Field::InjectFailure,
        Field::Partition,
        Field::SlowRank,
        Field::Rebalance,
        Field::RebalanceThreshold,
        Field::RebalanceWindow,
        Field::MoeOverlap,
        Field::Recompute,
        Field::HalfProjections,
    ];

    /// The field's name (as in JSON; a job section's field by its path).
    pub fn key(self) -> &'static str {
        match self {
            Field::Schedule => "schedule",
            Field::Ranks => "ranks",
            Field::MicroBatches => "micro_batches",
            Field::MicroBatchSize => "micro_batch_size",
            Field::VirtualStages => "virtual_stages",
            Field::Hidden => "hidden",
            Field::LayersPerStage => "layers_per_stage",
            Field::Steps => "steps",
            Field::Lr => "lr",
            Field::LrWarmup => "lr_warmup",
            Field::LrDecay => "lr_decay",
            Field::LrMin => "lr_min",
            Field::RecvTimeout => "recv_timeout",
            Field::DType => "dtype",
            Field::DModel => "d_model",
            Field::Heads => "heads",
            Field::SeqLen => "seq_len",
            Field::Data => "data",
            Field::ValidationFraction => "validation_fraction",
            Field::InitFrom => "init_from",
            Field::ClipGrad => "clip_grad",
            Field::DataParallel => "data_parallel",
            Field::BucketMb => "bucket_mb",
            Field::Momentum => "momentum",
            Field::CompressionWarmup => "compression_warmup",
            Field::VarianceRefresh => "variance_refresh",
            Field::Seed => "seed",
            Field::Task => "task",
            Field::Shuffle => "shuffle",
            Field::CheckpointDir => "checkpoint.dir",
            Field::CheckpointEvery => "checkpoint.every",
            Field::Resume => "checkpoint.resume",
            Field::ResumeFrom => "checkpoint.resume",
            Field::ResumeIfPresent => "checkpoint.resume",
            Field::AllowChangedSettings => "checkpoint.allow_changed_settings",
            Field::MetricsAddr => "observe.metrics_addr",
            Field::Log => "observe.log",
            Field::Save => "outputs.save",
            Field::Transport => "transport",
            Field::InjectFailure => "inject_failure",
            Field::Partition => "partition",
            Field::SlowRank => "slow_rank",
            Field::Rebalance => "rebalance",
            Field::RebalanceThreshold => "rebalance.threshold",
            Field::RebalanceWindow => "rebalance.window",
            Field::MoeOverlap => "moe.overlap",
            Field::Recompute => "recompute",
            Field::HalfProjections => "half_projections",
        }
    }

    /// The field whose [`key`](Field::key) is `key` (for [`Field::Resume`] and
    /// [`Field::ResumeFrom`], which share one, the first).
    pub fn from_key(key: &str) -> Option<Field> {
        Field::ALL.iter().copied().find(|f| f.key() == key)
    }

    /// The command-line flag that sets the field.
    fn flag(self) -> String {
        let flag = match self {
            Field::CheckpointDir => "checkpoint-dir",
            Field::CheckpointEvery => "checkpoint-every",
            Field::Resume => "resume",
            Field::ResumeFrom => "resume-from",
            Field::ResumeIfPresent => "resume-if-present",
            Field::AllowChangedSettings => "allow-changed-settings",
            Field::MetricsAddr => "metrics-addr",
            Field::Log => "log",
            Field::Save => "save",
            Field::Rebalance => "rebalance-stages",
            Field::RebalanceThreshold => "rebalance-threshold",
            Field::RebalanceWindow => "rebalance-window",
            Field::MoeOverlap => "no-moe-overlap",
            other => return format!("--{}", other.key().replace('_', "-")),
        };
        format!("--{flag}")
    }

    /// The field as `naming` calls it: `micro_batch_size` or `--micro-batch-size`.
    pub fn name(self, naming: Naming) -> String {
        match naming {
            Naming::Fields => self.key().to_string(),
            Naming::Flags => self.flag(),
        }
    }
}
