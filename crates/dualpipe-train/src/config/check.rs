//! The one check of a [`TrainConfig`]'s sizes ([`TrainConfig::check`]) and its memory estimate.

use dualpipe_nn::gpt::MAX_PARAMETERS;
use dualpipe_nn::{LrDecay, OptimizerKind};

use crate::config::memory::{self, MemoryEstimate, MEMORY_LIMIT_BYTES};
use crate::config::{Field, ModelKind, Naming, TrainConfig, MAX_STEPS};
use crate::error::TrainError;

/// The most data-parallel replicas of a run.
pub const MAX_DATA_PARALLEL: usize = 1024;
/// The longest receive timeout, in seconds (exclusive).
pub const MAX_RECV_TIMEOUT: f64 = 1e9;
/// The largest gradient bucket, in MiB.
pub const MAX_BUCKET_MB: f64 = 1024.0 * 1024.0;

/// A number as a user would write it: `1e300` rather than its 301 digits, `1e-9` rather than
/// `0.000000001`.
pub(crate) fn compact(x: f64) -> String {
    if x.is_finite() && x != 0.0 && !(1e-3..1e6).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

impl TrainConfig {
    /// [`TrainConfig::check`] in field names, for a process that holds every rank.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.check(Naming::Fields, 1)
    }

    /// Checks the sizes that do not depend on the schedule (the schedule checks its own),
    /// naming fields as `naming` says. Memory is checked against [`MEMORY_LIMIT_BYTES`] for the
    /// whole model and against this machine's available memory for the share one process holds
    /// when the ranks are spread over `processes` processes (1 locally).
    pub fn check(&self, naming: Naming, processes: usize) -> Result<(), TrainError> {
        let name = |field: Field| field.name(naming);
        let positive = [
            (Field::Ranks, self.schedule.ranks),
            (Field::MicroBatches, self.schedule.micro_batches),
            (Field::MicroBatchSize, self.schedule.micro_batch_size),
            (Field::VirtualStages, self.schedule.virtual_stages),
            (Field::Hidden, self.model.hidden),
            (Field::LayersPerStage, self.model.layers_per_stage),
            (Field::Steps, self.steps),
            (Field::DModel, self.model.d_model),
            (Field::Heads, self.model.heads),
            (Field::SeqLen, self.model.seq_len),
            (Field::DataParallel, self.parallelism.data_parallel),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(TrainError::Config(format!(
                    "{} is 0; it must be at least 1",
                    name(field)
                )));
            }
        }
        if self.steps > MAX_STEPS {
            return Err(TrainError::Config(format!(
                "{} {} is more than {MAX_STEPS}, the most one run takes (it keeps every step's \
                 loss); run fewer steps",
                name(Field::Steps),
                self.steps
            )));
        }
        if !(self.optimizer.lr.is_finite() && self.optimizer.lr > 0.0) {
            return Err(TrainError::Config(format!(
                "{} {}: the learning rate must be a positive number such as 0.001",
                name(Field::Lr),
                self.optimizer.lr
            )));
        }
        self.check_lr_schedule(naming)?;
        if let OptimizerKind::Sgd { momentum: m } = self.optimizer.kind {
            if !(m.is_finite() && (0.0..1.0).contains(&m)) {
                return Err(TrainError::Config(format!(
                    "{} {m}: it must be in [0, 1), such as 0.9",
                    name(Field::Momentum)
                )));
            }
        }
        if !(self.transport.recv_timeout.is_finite()
            && self.transport.recv_timeout > 0.0
            && self.transport.recv_timeout < MAX_RECV_TIMEOUT)
        {
            return Err(TrainError::Config(format!(
                "{} {}: the timeout must be more than 0 and less than {MAX_RECV_TIMEOUT:e} \
                 seconds (about 31 years), such as 60",
                name(Field::RecvTimeout),
                compact(self.transport.recv_timeout)
            )));
        }
        self.check_data_parallel(naming)?;
        self.check_model(naming)?;
        self.check_memory(naming, processes, memory::available_bytes())
    }

    /// The learning-rate schedule: a warm-up of at most [`MAX_STEPS`] (it may outlast the
    /// run), a floor for the cosine only, between 0 and the peak.
    fn check_lr_schedule(&self, naming: Naming) -> Result<(), TrainError> {
        let name = |field: Field| field.name(naming);
        if let Some(warmup) = self.optimizer.lr_warmup.filter(|&w| w > MAX_STEPS as u64) {
            return Err(TrainError::Config(format!(
                "{} {warmup} is more than {MAX_STEPS} steps; warm up for fewer",
                name(Field::LrWarmup)
            )));
        }
        if let Some(min) = self.optimizer.lr_min {
            if self.optimizer.lr_decay != LrDecay::Cosine {
                return Err(TrainError::Config(format!(
                    "{} {min} is the floor of the cosine decay; set {} cosine or drop it",
                    name(Field::LrMin),
                    name(Field::LrDecay)
                )));
            }
            if !(min.is_finite() && min >= 0.0 && min <= self.optimizer.lr) {
                return Err(TrainError::Config(format!(
                    "{} {min}: the floor must be between 0 and the peak {} {}",
                    name(Field::LrMin),
                    name(Field::Lr),
                    self.optimizer.lr
                )));
            }
        }
        Ok(())
    }

    /// The data-parallel sizes: the worker count and the bucket budget.
    fn check_data_parallel(&self, naming: Naming) -> Result<(), TrainError> {
        let name = |field: Field| field.name(naming);
        if self.parallelism.data_parallel > MAX_DATA_PARALLEL {
            return Err(TrainError::Config(format!(
                "{} {} is more than {MAX_DATA_PARALLEL} replicas; use fewer",
                name(Field::DataParallel),
                self.parallelism.data_parallel
            )));
        }
        if !(self.parallelism.bucket_mb.is_finite()
            && self.parallelism.bucket_mb > 0.0
            && self.parallelism.bucket_mb <= MAX_BUCKET_MB)
        {
            return Err(TrainError::Config(format!(
                "{} {}: the bucket size must be a positive number of MiB up to {MAX_BUCKET_MB}, \
                 such as 25",
                name(Field::BucketMb),
                self.parallelism.bucket_mb
            )));
        }
        Ok(())
    }

    /// The GPT's own checks: the architecture, the validation share, the clipping norm.
    fn check_model(&self, naming: Naming) -> Result<(), TrainError> {
        let name = |field: Field| field.name(naming);
        if let Some(clip) = self.optimizer.clip_grad {
            if !(clip.is_finite() && clip > 0.0) {
                return Err(TrainError::Config(format!(
                    "{} {clip}: the largest gradient norm must be a positive number such as 1.0",
                    name(Field::ClipGrad)
                )));
            }
        }
        if let (Some(clip), Some(warmup)) = (self.optimizer.clip_grad, self.one_bit_adam_from()) {
            return Err(TrainError::Config(format!(
                "{} {clip} with 1bit compression after {warmup} warm-up steps: 1-bit Adam \
                 exchanges AdamW's momentum, not the gradient, so there is no gradient norm \
                 to clip; drop {} or compress the gradient from the first step ({} 0)",
                name(Field::ClipGrad),
                name(Field::ClipGrad),
                name(Field::CompressionWarmup)
            )));
        }
        if self.model.dtype == crate::config::DType::F16
            && self.parallelism.data_parallel > 1
            && self.parallelism.gradient_compression != dualpipe_dp::Compression::None
        {
            return Err(TrainError::Config(format!(
                "{} f16 with `gradient_compression` {}: f16 loss scaling skips a step whose \
                 gradients overflowed, which a lossy compression's error feedback cannot take \
                 back; use {} bf16 (no loss scaling), or `gradient_compression` none (the \
                 exchange then carries bf16)",
                name(Field::DType),
                self.parallelism.gradient_compression.name(),
                name(Field::DType)
            )));
        }
        if self.model.half_projections
            && (self.model.dtype.half().is_none() || self.model.kind != ModelKind::Gpt)
        {
            return Err(TrainError::Config(format!(
                "{} runs the GPT's attention projections in the mixed-precision format, but \
                 this run trains the {} in {}: use the GPT with {} bf16 or f16, or drop {}",
                name(Field::HalfProjections),
                self.model.kind.name(),
                self.model.dtype,
                name(Field::DType),
                name(Field::HalfProjections)
            )));
        }
        if let Some(moe) = &self.model.moe {
            if self.model.kind != ModelKind::Gpt {
                return Err(TrainError::Config(
                    "the mixture of experts is a GPT feed-forward; drop it or use the GPT".into(),
                ));
            }
            moe.check(naming)?;
            moe.check_parallel(self.parallelism.data_parallel, naming)?;
            if moe.expert_parallel
                && self.parallelism.data_parallel > 1
                && self.parallelism.rebalance.is_some()
            {
                return Err(TrainError::Config(
                    "re-partitioning the stages rebuilds them without their expert groups; \
                     drop the stage rebalancing or the expert parallelism"
                        .into(),
                ));
            }
        }
        self.check_partition(naming)?;
        self.check_recompute(naming)?;
        if self.model.kind != ModelKind::Gpt {
            return Ok(());
        }
        if !self.model.d_model.is_multiple_of(self.model.heads) {
            return Err(TrainError::Config(format!(
                "{} {} does not divide {} {}; use a head count that divides the width",
                name(Field::Heads),
                self.model.heads,
                name(Field::DModel),
                self.model.d_model
            )));
        }
        if !(0.0..1.0).contains(&self.data.validation_fraction) {
            return Err(TrainError::Config(format!(
                "{} {}: the held-out share must be in [0, 1), such as 0.1",
                name(Field::ValidationFraction),
                self.data.validation_fraction
            )));
        }
        let gpt = self.gpt();
        if gpt.parameter_count() > MAX_PARAMETERS {
            return Err(TrainError::Config(format!(
                "{} {} with {} {} on {} model stages gives more than {MAX_PARAMETERS} \
                 parameters; use a smaller {} or fewer {}",
                name(Field::DModel),
                self.model.d_model,
                name(Field::LayersPerStage),
                self.model.layers_per_stage,
                self.model_stages(),
                name(Field::DModel),
                name(Field::LayersPerStage),
            )));
        }
        Ok(())
    }

    /// The memory part of [`TrainConfig::check`], against `available` bytes on this machine
    /// (`None`: unknown, only the documented cap applies).
    pub fn check_memory(
        &self,
        naming: Naming,
        processes: usize,
        available: Option<u128>,
    ) -> Result<(), TrainError> {
        let name = |field: Field| field.name(naming);
        let memory = self.memory_bytes();
        let gib = |bytes: u128| bytes.div_ceil(1 << 30);
        let share = |bytes: u128| bytes.div_ceil(processes.max(1) as u128);
        // Name the factor that makes the size absurd, not only the ones printed first.
        let stages = self.model_stages();
        let width = match self.model.kind {
            ModelKind::Mlp => self.model.hidden,
            ModelKind::Gpt => self.model.d_model,
        };
        let width_field = match self.model.kind {
            ModelKind::Mlp => Field::Hidden,
            ModelKind::Gpt => Field::DModel,
        };
        let width_squared = (width as u128).saturating_mul(width as u128);
        let parameters_hint =
            if stages as u128 > width_squared && stages > self.model.layers_per_stage {
                format!("fewer {}", name(Field::Ranks))
            } else if self.model.layers_per_stage as u128 > width_squared {
                format!("fewer {}", name(Field::LayersPerStage))
            } else {
                format!(
                    "a smaller {} or fewer {}",
                    name(width_field),
                    name(Field::LayersPerStage)
                )
            };
        let activations_hint = if self.schedule.micro_batches > self.schedule.micro_batch_size {
            format!("fewer {}", name(Field::MicroBatches))
        } else {
            format!("a smaller {}", name(Field::MicroBatchSize))
        };
        let parameters_too_big = |limit: u128, what: &str| {
            TrainError::Config(format!(
                "{} {} with {} {} on {} model stages ({} {}) needs {} GiB of parameters and \
                 optimizer state, more than {}; use {}",
                name(width_field),
                width,
                name(Field::LayersPerStage),
                self.model.layers_per_stage,
                stages,
                name(Field::Ranks),
                self.schedule.ranks,
                gib(memory.parameters),
                what.replace("{}", &gib(limit).to_string()),
                parameters_hint,
            ))
        };
        let activations_too_big = |limit: u128, what: &str| {
            TrainError::Config(format!(
                "{} {} with {} {} and {} {} needs {} GiB of activations per step, more than {}; \
                 use {}",
                name(Field::MicroBatchSize),
                self.schedule.micro_batch_size,
                name(Field::MicroBatches),
                self.schedule.micro_batches,
                name(width_field),
                width,
                gib(memory.activations),
                what.replace("{}", &gib(limit).to_string()),
                activations_hint,
            ))
        };
        const CAP: &str = "the {} GiB a run may use";
        if memory.parameters > MEMORY_LIMIT_BYTES {
            return Err(parameters_too_big(MEMORY_LIMIT_BYTES, CAP));
        }
        if memory.activations > MEMORY_LIMIT_BYTES {
            return Err(activations_too_big(MEMORY_LIMIT_BYTES, CAP));
        }
        if let Some(available) = available {
            const FREE: &str = "the {} GiB this machine has available";
            if share(memory.parameters) > available {
                return Err(parameters_too_big(available, FREE));
            }
            if share(memory.total()) > available {
                return Err(activations_too_big(available, FREE));
            }
        }
        Ok(())
    }

    /// An upper estimate of the memory a run needs, computed without overflow: every
    /// parameter for up to two copies of each stage, each with a gradient and two optimizer
    /// moments; and one step's saved activations.
    pub fn memory_bytes(&self) -> MemoryEstimate {
        match self.model.kind {
            ModelKind::Mlp => self.mlp_memory_bytes(),
            ModelKind::Gpt => self.gpt_memory_bytes(),
        }
    }

    /// The MLP: every block's h x 4h and 4h x h weights and biases; each block keeps its
    /// input, its 4h-wide hidden activations and their GELU input.
    fn mlp_memory_bytes(&self) -> MemoryEstimate {
        let bytes_per_value = self.model.dtype.size_in_bytes();
        let h = self.model.hidden as u128;
        let blocks =
            (self.model_stages() as u128).saturating_mul(self.model.layers_per_stage as u128);
        let parameters = blocks
            .saturating_mul(
                h.saturating_mul(h)
                    .saturating_mul(8)
                    .saturating_add(h.saturating_mul(5)),
            )
            .saturating_mul(2 * 4 * bytes_per_value);
        let activations = (self.schedule.micro_batch_size as u128)
            .saturating_mul(self.schedule.micro_batches as u128)
            .saturating_mul(h.saturating_mul(9))
            .saturating_mul(blocks)
            .saturating_mul(bytes_per_value);
        MemoryEstimate {
            parameters,
            activations,
        }
    }

    /// The GPT: `12 d² + 2d` parameters a block plus the embeddings and the head; each block
    /// keeps about `20 d` values a token (norms, q, k, v, the attention output, the 4d-wide MLP
    /// hidden state and its GELU input) plus `heads × seq_len` attention probabilities, and the
    /// head keeps 256 logits a token.
    fn gpt_memory_bytes(&self) -> MemoryEstimate {
        let bytes_per_value = self.model.dtype.size_in_bytes();
        let d = self.model.d_model as u128;
        let seq = self.model.seq_len as u128;
        let blocks = self.blocks() as u128;
        let parameters = blocks
            .saturating_mul(d.saturating_mul(d).saturating_mul(12).saturating_add(2 * d))
            .saturating_add((2 * 256u128 + 1).saturating_mul(d))
            .saturating_add(seq.saturating_mul(d))
            .saturating_mul(2 * 4 * bytes_per_value);
        let tokens = (self.schedule.micro_batch_size as u128)
            .saturating_mul(self.schedule.micro_batches as u128)
            .saturating_mul(seq);
        let per_token = blocks
            .saturating_mul(
                d.saturating_mul(20)
                    .saturating_add((self.model.heads as u128).saturating_mul(seq)),
            )
            .saturating_add(256);
        MemoryEstimate {
            parameters,
            activations: tokens
                .saturating_mul(per_token)
                .saturating_mul(bytes_per_value),
        }
    }
}
