//! [`Field`] and [`Naming`]: how the one check names a configuration field, in Rust / JSON
//! words or in flags.

#[cfg(doc)]
use super::TrainConfig;

/// A configuration field, for messages: [`Naming::Fields`] calls it by its Rust / JSON name
/// (`micro_batch_size`), [`Naming::Flags`] by its command-line flag (`--micro-batch-size`), so
/// the one check speaks the words of whoever called it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// [`TrainConfig::ranks`].
    Ranks,
    /// [`TrainConfig::micro_batches`].
    MicroBatches,
    /// [`TrainConfig::micro_batch_size`].
    MicroBatchSize,
    /// [`TrainConfig::virtual_stages`].
    VirtualStages,
    /// [`TrainConfig::hidden`].
    Hidden,
    /// [`TrainConfig::layers_per_stage`].
    LayersPerStage,
    /// [`TrainConfig::steps`].
    Steps,
    /// [`TrainConfig::lr`].
    Lr,
    /// [`TrainConfig::lr_warmup`].
    LrWarmup,
    /// [`TrainConfig::lr_decay`].
    LrDecay,
    /// [`TrainConfig::lr_min`].
    LrMin,
    /// [`TrainConfig::recv_timeout`].
    RecvTimeout,
    /// [`TrainConfig::dtype`].
    DType,
    /// [`TrainConfig::d_model`].
    DModel,
    /// [`TrainConfig::heads`].
    Heads,
    /// [`TrainConfig::seq_len`].
    SeqLen,
    /// [`TrainConfig::data`].
    Data,
    /// [`TrainConfig::validation_fraction`].
    ValidationFraction,
    /// [`TrainConfig::init_from`].
    InitFrom,
    /// [`TrainConfig::clip_grad`].
    ClipGrad,
    /// [`TrainConfig::data_parallel`].
    DataParallel,
    /// [`TrainConfig::bucket_mb`].
    BucketMb,
    /// SGD's momentum in [`TrainConfig::optimizer`].
    Momentum,
    /// [`TrainConfig::compression_warmup`].
    CompressionWarmup,
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
    /// The field's name (as in JSON).
    pub fn key(self) -> &'static str {
        match self {
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
        }
    }

    /// The field as `naming` calls it: `micro_batch_size` or `--micro-batch-size`.
    pub fn name(self, naming: Naming) -> String {
        match naming {
            Naming::Fields => self.key().to_string(),
            Naming::Flags => format!("--{}", self.key().replace('_', "-")),
        }
    }
}
