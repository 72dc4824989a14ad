//! The JSON form of a [`TrainConfig`]: one flat object (`{"model": "gpt", "schedule":
//! "dualpipe", "ranks": 4, ...}`), member for member as before the configuration had
//! sections, so checkpoints, summaries and the Python side read and write what they always
//! have. Missing members take [`TrainConfig::DEFAULT`]'s; unknown ones are refused.

use std::path::PathBuf;

use dualpipe_dp::Compression;
use dualpipe_nn::{LrDecay, OptimizerKind, Recompute};
use dualpipe_schedule::ScheduleKind;
use serde::{Deserialize, Serialize};

use super::serde_repr::{
    compression_name, lr_decay_name, optimizer_repr, recompute_repr, schedule_name,
};
use super::{
    DType, DataSection, ModelKind, ModelSection, OptimizerSection, ParallelismSection,
    ScheduleSection, Task, TrainConfig, TransportSection,
};
use crate::config::moe::MoeSettings;
use crate::config::rebalance::{RebalanceSettings, SlowRank};

fn is_constant(decay: &LrDecay) -> bool {
    *decay == LrDecay::Constant
}

/// Whether `b` holds (the default of `mpi_allreduce`: not written).
fn is_true(b: &bool) -> bool {
    *b
}

/// Whether `b` does not hold (the default of `one_bit_preconditioned`: not written).
fn is_false(b: &bool) -> bool {
    !*b
}

/// [`TrainConfig`] as one flat JSON object, in the order its members have always had.
#[derive(Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct Flat {
    model: ModelKind,
    #[serde(with = "schedule_name")]
    schedule: ScheduleKind,
    ranks: usize,
    micro_batches: usize,
    micro_batch_size: usize,
    virtual_stages: usize,
    hidden: usize,
    layers_per_stage: usize,
    d_model: usize,
    heads: usize,
    seq_len: usize,
    data: Option<PathBuf>,
    task: Task,
    validation_fraction: f64,
    eval_every: usize,
    shuffle: bool,
    init_from: Option<PathBuf>,
    clip_grad: Option<f64>,
    steps: usize,
    lr: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    lr_warmup: Option<u64>,
    #[serde(with = "lr_decay_name", skip_serializing_if = "is_constant")]
    lr_decay: LrDecay,
    #[serde(skip_serializing_if = "Option::is_none")]
    lr_min: Option<f64>,
    #[serde(with = "optimizer_repr")]
    optimizer: OptimizerKind,
    dtype: DType,
    seed: u64,
    recv_timeout: f64,
    data_parallel: usize,
    bucket_mb: f64,
    overlap: bool,
    #[serde(with = "compression_name")]
    gradient_compression: Compression,
    #[serde(skip_serializing_if = "Option::is_none")]
    compression_warmup: Option<u64>,
    #[serde(skip_serializing_if = "is_false")]
    one_bit_preconditioned: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    variance_refresh: Option<u64>,
    error_feedback: bool,
    #[serde(skip_serializing_if = "is_true")]
    mpi_allreduce: bool,
    moe: Option<MoeSettings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<Vec<usize>>,
    #[serde(
        default,
        with = "recompute_repr",
        skip_serializing_if = "recompute_repr::is_none"
    )]
    recompute: Option<Vec<Recompute>>,
    #[serde(default, skip_serializing_if = "is_false")]
    half_projections: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    slow_rank: Option<SlowRank>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rebalance: Option<RebalanceSettings>,
}

impl Default for Flat {
    fn default() -> Self {
        TrainConfig::DEFAULT.into()
    }
}

impl From<TrainConfig> for Flat {
    fn from(c: TrainConfig) -> Flat {
        let TrainConfig {
            model: m,
            schedule: s,
            parallelism: p,
            optimizer: o,
            data: d,
            transport: t,
            steps,
            seed,
        } = c;
        Flat {
            model: m.kind,
            schedule: s.kind,
            ranks: s.ranks,
            micro_batches: s.micro_batches,
            micro_batch_size: s.micro_batch_size,
            virtual_stages: s.virtual_stages,
            hidden: m.hidden,
            layers_per_stage: m.layers_per_stage,
            d_model: m.d_model,
            heads: m.heads,
            seq_len: m.seq_len,
            data: d.path,
            task: d.task,
            validation_fraction: d.validation_fraction,
            eval_every: d.eval_every,
            shuffle: d.shuffle,
            init_from: m.init_from,
            clip_grad: o.clip_grad,
            steps,
            lr: o.lr,
            lr_warmup: o.lr_warmup,
            lr_decay: o.lr_decay,
            lr_min: o.lr_min,
            optimizer: o.kind,
            dtype: m.dtype,
            seed,
            recv_timeout: t.recv_timeout,
            data_parallel: p.data_parallel,
            bucket_mb: p.bucket_mb,
            overlap: p.overlap,
            gradient_compression: p.gradient_compression,
            compression_warmup: p.compression_warmup,
            one_bit_preconditioned: p.one_bit_preconditioned,
            variance_refresh: p.variance_refresh,
            error_feedback: p.error_feedback,
            mpi_allreduce: t.mpi_allreduce,
            moe: m.moe,
            partition: m.partition,
            recompute: m.recompute,
            half_projections: m.half_projections,
            slow_rank: p.slow_rank,
            rebalance: p.rebalance,
        }
    }
}

impl From<Flat> for TrainConfig {
    fn from(f: Flat) -> TrainConfig {
        TrainConfig {
            model: ModelSection {
                kind: f.model,
                hidden: f.hidden,
                layers_per_stage: f.layers_per_stage,
                d_model: f.d_model,
                heads: f.heads,
                seq_len: f.seq_len,
                dtype: f.dtype,
                init_from: f.init_from,
                moe: f.moe,
                partition: f.partition,
                recompute: f.recompute,
                half_projections: f.half_projections,
            },
            schedule: ScheduleSection {
                kind: f.schedule,
                ranks: f.ranks,
                micro_batches: f.micro_batches,
                micro_batch_size: f.micro_batch_size,
                virtual_stages: f.virtual_stages,
            },
            parallelism: ParallelismSection {
                data_parallel: f.data_parallel,
                bucket_mb: f.bucket_mb,
                overlap: f.overlap,
                gradient_compression: f.gradient_compression,
                compression_warmup: f.compression_warmup,
                one_bit_preconditioned: f.one_bit_preconditioned,
                variance_refresh: f.variance_refresh,
                error_feedback: f.error_feedback,
                rebalance: f.rebalance,
                slow_rank: f.slow_rank,
            },
            optimizer: OptimizerSection {
                kind: f.optimizer,
                lr: f.lr,
                lr_warmup: f.lr_warmup,
                lr_decay: f.lr_decay,
                lr_min: f.lr_min,
                clip_grad: f.clip_grad,
            },
            data: DataSection {
                path: f.data,
                task: f.task,
                validation_fraction: f.validation_fraction,
                eval_every: f.eval_every,
                shuffle: f.shuffle,
            },
            transport: TransportSection {
                recv_timeout: f.recv_timeout,
                mpi_allreduce: f.mpi_allreduce,
            },
            steps: f.steps,
            seed: f.seed,
        }
    }
}
