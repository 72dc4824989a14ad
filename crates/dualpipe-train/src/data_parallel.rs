//! Data parallelism: `data_parallel` replicas of the whole pipeline, each training on its own
//! share of the global batch, their gradients averaged per model stage before the optimizer.
//!
//! - [`ReplicaExchange`] — one replica's end of the exchange: per model stage it holds, a
//!   [`GradExchange`] over the stage's data-parallel group (the same stage in every replica),
//!   or under MPI without compression a [`NativeExchange`] on MPI's own all-reduce over every
//!   copy of the stage ([`GroupLink`]), plus a small uncompressed exchange that gathers every
//!   replica's micro-batch losses so each replica reports the global step loss;
//! - [`ExchangeHook`] — the executor's [`StepHook`]: on the rank's own thread, as soon as
//!   every copy of a stage this process holds has run its last weight-gradient op, it sums the
//!   copies and starts the stage's buckets, and it makes progress on them between ops;
//! - [`DataParallel`] — the local backend: `data_parallel` [`Trainer`]s, one per replica, each
//!   running its pipeline on its own threads, concurrently, joined by in-process channels
//!   ([`ChannelTransport`]).
//!
//! The step of a replica: its pipeline (micro-batch losses scaled by `1 / micro_batches`, so
//! a replica's gradient is the mean over its micro-batches), during which, with
//! [`TrainConfig::overlap`], each stage's exchange starts as soon as its gradients are final
//! (DualPipe's two copies summed first, in direction order, as `sum_stage_copies` does); after
//! it the step waits for the exchanges (the mean over replicas: the global-batch mean), then
//! clips and steps the optimizer. Where the process does not hold every copy of its stages
//! (DualPipe with one rank per process), MPI's all-reduce needs no sum first (each copy joins
//! it), and on point-to-point groups the holder of the lowest direction's copy leads: the
//! other copy's holder sends it its copy from its hook, the lead sums them in direction order
//! and starts the replicas' exchange of the sum from its own hook, then sends the result back
//! ([`GroupLink::Lead`], [`GroupLink::Partner`], `dualpipe_dp::copies`). Under 1-bit Adam
//! (the momentum is folded after the pipeline) the copies are summed and every exchange
//! started after the pipeline; without overlap (`--no-overlap`) one stage's plain all-reduce
//! follows another after the pipeline. See `docs/distributed.md`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::{Tensor, WithDType};
use dualpipe_dp::{
    AllReduce, BucketExchange, BucketLayout, ChannelTransport, Compression, CopyLead, CopyPartner,
    DpError, ErrorFeedbackState, ExchangeConfig, ExchangeStats, GradExchange, GradFloat,
    GradTransport, NativeExchange, Reduce,
};
use dualpipe_nn::ModelStage;
use dualpipe_runtime::{RankStages, StageError, StepHook};
use dualpipe_schedule::{Placement, Schedule};

use crate::config::{DType, TrainConfig};
use crate::driver::LocalThreads;
use crate::error::TrainError;
use crate::summary::RunSummary;
use crate::trainer::{StepEvent, StepReport, Trainer};

/// A data-parallel group's transport, as one replica's end of it.
pub type GroupTransport = Box<dyn GradTransport + Send>;

/// How one model stage's group exchanges its gradients.
pub enum GroupLink {
    /// Our bucketed reduce-scatter and all-gather on point-to-point messages (every
    /// compression); the group is the stage's holder in every replica, which holds every copy
    /// of the stage (summed before they join it) or its only one.
    Messages(GroupTransport),
    /// A library's own sum (MPI's `MPI_Iallreduce`), uncompressed only, of `f32` or `f64`
    /// gradients (the run's type); the group holds **every copy** of the stage in every
    /// replica (DualPipe: `2 D` members, each adding its own copy), and the sum is divided by
    /// the replica count.
    SumF32(Box<dyn AllReduce<f32>>),
    /// As [`GroupLink::SumF32`], for `f64` runs.
    SumF64(Box<dyn AllReduce<f64>>),
    /// This process holds the lowest direction's copy of a stage whose other copies are in
    /// other processes of its replica (DualPipe, one rank per process): it sums the copies
    /// as they come over `copies` (the stage's copy holders in direction order, this one
    /// first) and exchanges the sum over `replicas` (the stage's lead in every replica), as a
    /// process holding every copy does ([`CopyLead`]).
    Lead {
        /// The stage's lead in every replica.
        replicas: GroupTransport,
        /// The stage's copy holders in this replica, in direction order (this one first).
        copies: GroupTransport,
    },
    /// This process holds another copy of such a stage: it sends its copy to the lead over
    /// the copy holders' group (in direction order) and takes the result back
    /// ([`CopyPartner`]).
    Partner(GroupTransport),
}

/// One replica's ends of its data-parallel groups, before the exchange is built.
pub struct ReplicaLinks {
    /// This replica's index, and the replica count.
    pub replica: usize,
    /// The replica count.
    pub replicas: usize,
    /// Per model stage this replica holds: the stage and its group.
    pub stages: Vec<(usize, GroupLink)>,
    /// The group of every replica, for the step's losses.
    pub losses: GroupTransport,
}

impl std::fmt::Debug for ReplicaLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaLinks")
            .field("replica", &self.replica)
            .field("replicas", &self.replicas)
            .field("stages", &self.stages.len())
            .finish()
    }
}

enum StageGrads {
    F32(Box<dyn BucketExchange<f32> + Send>),
    F64(Box<dyn BucketExchange<f64> + Send>),
}

/// One copy's gradients, flattened, in the run's float type.
enum Snapshot {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl StageGrads {
    fn totals(&self) -> ExchangeStats {
        match self {
            StageGrads::F32(ex) => ex.totals(),
            StageGrads::F64(ex) => ex.totals(),
        }
    }

    fn method(&self) -> &'static str {
        match self {
            StageGrads::F32(ex) => ex.method(),
            StageGrads::F64(ex) => ex.method(),
        }
    }

    fn snapshot(&self, copy: &ModelStage) -> Result<Snapshot, TrainError> {
        Ok(match self {
            StageGrads::F32(_) => Snapshot::F32(copy_grads(copy)?),
            StageGrads::F64(_) => Snapshot::F64(copy_grads(copy)?),
        })
    }

    /// Begins `step` and starts every bucket from the sum of `copies` (in the order given).
    fn start(&mut self, step: u64, copies: Vec<Snapshot>) -> Result<(), TrainError> {
        let mismatch = || TrainError::Execution("a copy's gradients of another type".into());
        match self {
            StageGrads::F32(ex) => {
                let copies = copies.into_iter().map(|c| match c {
                    Snapshot::F32(v) => Ok(v),
                    Snapshot::F64(_) => Err(mismatch()),
                });
                start(ex.as_mut(), step, &sum(copies)?)
            }
            StageGrads::F64(ex) => {
                let copies = copies.into_iter().map(|c| match c {
                    Snapshot::F64(v) => Ok(v),
                    Snapshot::F32(_) => Err(mismatch()),
                });
                start(ex.as_mut(), step, &sum(copies)?)
            }
        }
    }

    fn progress(&mut self) -> Result<(), DpError> {
        match self {
            StageGrads::F32(ex) => ex.progress(),
            StageGrads::F64(ex) => ex.progress(),
        }
    }

    /// Waits for the started step and writes the result into every target.
    fn finish(&mut self, targets: &mut [&mut ModelStage]) -> Result<(), TrainError> {
        match self {
            StageGrads::F32(ex) => {
                ex.finish()?;
                write_grads(targets, ex.as_ref())
            }
            StageGrads::F64(ex) => {
                ex.finish()?;
                write_grads(targets, ex.as_ref())
            }
        }
    }

    /// The whole step at once (`--no-overlap`): the first target's gradients (the copies
    /// already summed) in, the result into every target.
    fn all_reduce(&mut self, step: u64, targets: &mut [&mut ModelStage]) -> Result<(), TrainError> {
        let source = targets
            .first()
            .ok_or_else(|| TrainError::Execution("no copy to exchange".into()))?;
        match self {
            StageGrads::F32(ex) => {
                ex.all_reduce(step, &mut copy_grads::<f32>(source)?)?;
                write_grads(targets, ex.as_ref())
            }
            StageGrads::F64(ex) => {
                ex.all_reduce(step, &mut copy_grads::<f64>(source)?)?;
                write_grads(targets, ex.as_ref())
            }
        }
    }
}

/// The element-wise sum of `copies`, left to right (`(c_0 + c_1) + ...`, the order
/// `sum_stage_copies` adds DualPipe's copies in).
fn sum<T: GradFloat>(
    copies: impl Iterator<Item = Result<Vec<T>, TrainError>>,
) -> Result<Vec<T>, TrainError> {
    let mut total: Option<Vec<T>> = None;
    for copy in copies {
        let copy = copy?;
        match &mut total {
            None => total = Some(copy),
            Some(t) if t.len() == copy.len() => {
                t.iter_mut().zip(&copy).for_each(|(a, &b)| *a = *a + b);
            }
            Some(t) => {
                return Err(TrainError::Execution(format!(
                    "a stage's copies hold {} and {} gradient values",
                    t.len(),
                    copy.len()
                )))
            }
        }
    }
    total.ok_or_else(|| TrainError::Execution("no copy to exchange".into()))
}

/// One model stage's exchange and, during a step, what the hook has collected.
struct Slot {
    stage: usize,
    /// Whether this process keeps the stage's error feedback (not a [`CopyPartner`]).
    keeps_feedback: bool,
    state: Mutex<SlotState>,
}

struct SlotState {
    grads: StageGrads,
    /// The copies of the stage this process holds.
    copies: usize,
    /// This step's copies whose gradients are final: (direction, gradients).
    done: Vec<(usize, Snapshot)>,
    /// The rank whose thread started this step's buckets during the pipeline.
    started_by: Option<usize>,
}

/// The figures [`ReplicaExchange::sum_over_replicas`] sums (the losses' exchange is at
/// least this long, even for one micro-batch per replica).
const SUMMED_FIGURES: usize = 4;

/// What one step's gradient exchange cost one replica (the losses' exchange not included).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepExchange {
    /// Wall-clock seconds of the exchange after the pipeline (waiting for what the pipeline
    /// did not hide and writing the results back; starting buckets and making progress
    /// during the pipeline counts as pipeline time).
    pub seconds: f64,
    /// Bytes this replica sent: gradient bodies and message headers.
    pub bytes_sent: u64,
    /// What the gradient bodies would have carried uncompressed.
    pub bytes_uncompressed: u64,
    /// How many of this replica's stage exchanges started during the pipeline (from the
    /// [`ExchangeHook`]); 0 when the exchange runs after the pipeline.
    pub started_in_pipeline: usize,
    /// The L2 norm of this replica's error-feedback buffers after the step (worker and
    /// server residuals of every stage whose feedback it keeps): what compression still owes
    /// the model; 0 without a lossy compression or during the warm-up.
    pub feedback_norm: f64,
}

/// One replica's end of the gradient exchange (see the [module](self) documentation).
pub struct ReplicaExchange {
    replica: usize,
    replicas: usize,
    micro_batches: usize,
    overlap: bool,
    /// Whether the hook starts the exchanges during the pipeline (and sums the copies).
    in_pipeline: bool,
    /// Whether the groups sum DualPipe's copies across processes themselves, with or without
    /// overlap: a library's sums over every copy of their stage, or copy leads and partners.
    joins_remote_copies: bool,
    slots: Arc<[Slot]>,
    losses: GradExchange<f64, GroupTransport>,
    /// Wall-clock seconds spent in the gradient exchange after the pipelines.
    seconds: f64,
    /// The totals when the last step was reported.
    reported: ExchangeStats,
    /// Exchanges the hook started during the current step's pipeline.
    started_in_pipeline: Arc<AtomicUsize>,
    /// Over the run: (stage exchanges started during a pipeline, stage exchanges).
    started_over_run: (usize, usize),
}

impl std::fmt::Debug for ReplicaExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaExchange")
            .field("replica", &self.replica)
            .field("replicas", &self.replicas)
            .field("overlap", &self.overlap)
            .field("in_pipeline", &self.in_pipeline)
            .field("stages", &self.slots.len())
            .finish()
    }
}

/// The held copies of model stage `model_stage`, lowest direction first.
fn copies_of(stages: &mut [RankStages<ModelStage>], model_stage: usize) -> Vec<&mut ModelStage> {
    let mut copies: Vec<&mut ModelStage> = stages
        .iter_mut()
        .flat_map(RankStages::iter_mut)
        .map(|(_, s)| s)
        .filter(|s| s.model_stage() == model_stage)
        .collect();
    copies.sort_by_key(|s| s.dir());
    copies
}

fn model_error(e: candle_core::Error) -> TrainError {
    TrainError::Execution(format!("gradient exchange: {e}"))
}

fn lock_error(stage: usize) -> TrainError {
    TrainError::Execution(format!(
        "the gradient exchange of stage {stage} was poisoned by a panic"
    ))
}

/// `copy`'s parameters the exchange carries: all but the routed experts of an
/// expert-parallel MoE block (their gradients are summed among their holders only, see
/// [`ExpertGroup::exchange_gradients`](crate::expert_parallel::ExpertGroup::exchange_gradients)).
fn exchanged(copy: &ModelStage) -> Vec<&dualpipe_nn::layers::Param> {
    let sharded = copy.sharded_params();
    copy.params()
        .into_iter()
        .zip(sharded)
        .filter_map(|(p, s)| (!s).then_some(p))
        .collect()
}

/// The sizes of the parameters [`exchanged`] will carry for `copy` once its MoE blocks
/// serve their placements: with expert parallelism (set up after the exchange is built) no
/// routed expert.
fn exchanged_lens(config: &TrainConfig, copy: &ModelStage) -> Vec<usize> {
    let ep =
        config.model.moe.is_some_and(|m| m.expert_parallel) && config.parallelism.data_parallel > 1;
    copy.param_names()
        .iter()
        .zip(copy.params())
        .zip(copy.sharded_params())
        .filter(|((name, _), sharded)| !(*sharded || (ep && name.contains(".moe.experts."))))
        .map(|((_, p), _)| p.grad.elem_count())
        .collect()
}

/// [`exchanged`] mutably.
fn exchanged_mut(copy: &mut ModelStage) -> Vec<&mut dualpipe_nn::layers::Param> {
    let sharded = copy.sharded_params();
    copy.params_mut()
        .into_iter()
        .zip(sharded)
        .filter_map(|(p, s)| (!s).then_some(p))
        .collect()
}

/// `copy`'s exchanged gradients ([`exchanged`]), flattened parameter after parameter.
fn copy_grads<T: WithDType>(copy: &ModelStage) -> Result<Vec<T>, TrainError> {
    let mut out = Vec::new();
    for p in exchanged(copy) {
        out.extend(
            p.grad
                .flatten_all()
                .and_then(|g| g.to_vec1::<T>())
                .map_err(model_error)?,
        );
    }
    Ok(out)
}

/// Writes the exchanged gradients into every target copy.
fn write_grads<T: WithDType + GradFloat>(
    targets: &mut [&mut ModelStage],
    ex: &dyn BucketExchange<T>,
) -> Result<(), TrainError> {
    for copy in targets {
        for (j, p) in exchanged_mut(copy).into_iter().enumerate() {
            p.grad = Tensor::from_slice(ex.param(j), p.grad.shape(), p.grad.device())
                .map_err(model_error)?;
        }
    }
    Ok(())
}

impl ReplicaExchange {
    /// The exchange of replica `links.replica` for the held `stages` of `placement` (their
    /// parameter sizes cut the buckets), with `config`'s compression, buckets and warm-up.
    pub fn new(
        config: &TrainConfig,
        links: ReplicaLinks,
        placement: &Placement,
        stages: &mut [RankStages<ModelStage>],
    ) -> Result<Self, TrainError> {
        let exchange = config.exchange_config();
        let mut slots = Vec::with_capacity(links.stages.len());
        // Whether every copy of every held stage takes part in its exchange from here: all
        // of them are held here, or the group holds every copy (a library's sum).
        let mut every_copy_joins = true;
        let mut joins_remote_copies = false;
        for (s, link) in links.stages {
            let copies = copies_of(stages, s);
            let lens: Vec<usize> = copies
                .first()
                .map(|c| exchanged_lens(config, c))
                .ok_or_else(|| TrainError::Config(format!("no held copy of stage {s}")))?;
            let layout = |bytes| BucketLayout::new(&lens, exchange.bucket_bytes, bytes);
            // A library's sum over every copy of every replica, divided by the replicas.
            let summed = ExchangeConfig {
                reduce: Reduce::Divide(links.replicas),
                ..exchange.clone()
            };
            let wrong_type = |link: &str| {
                TrainError::Config(format!(
                    "stage {s}'s group sums {link} gradients but the run trains in {}",
                    config.model.dtype.name()
                ))
            };
            let sums = matches!(link, GroupLink::SumF32(_) | GroupLink::SumF64(_));
            let paired = matches!(link, GroupLink::Lead { .. } | GroupLink::Partner(_));
            if (sums || paired) && copies.len() != 1 {
                return Err(TrainError::Config(format!(
                    "stage {s}: a group over every copy takes one copy per member, but this \
                     process holds {} (use the point-to-point exchange)",
                    copies.len()
                )));
            }
            // Under 1-bit Adam the copies are summed (and the momentum folded from the sum)
            // before the exchange: a lead exchanges its copy alone, its partner sends nothing.
            let presummed = paired && config.one_bit_adam_from().is_some();
            every_copy_joins &= sums || paired || copies.len() == placement.dirs();
            joins_remote_copies |= sums || (paired && !presummed);
            let keeps_feedback = !matches!(link, GroupLink::Partner(_));
            let timeout = exchange.timeout;
            let grads = match (config.model.dtype, link) {
                (DType::F32, GroupLink::Messages(t)) => StageGrads::F32(Box::new(
                    GradExchange::new(exchange.clone(), layout(4)?, s, t)?,
                )),
                (DType::F64, GroupLink::Messages(t)) => StageGrads::F64(Box::new(
                    GradExchange::new(exchange.clone(), layout(8)?, s, t)?,
                )),
                (DType::F32, GroupLink::SumF32(g)) => {
                    StageGrads::F32(Box::new(NativeExchange::new(summed, layout(4)?, s, g)?))
                }
                (DType::F64, GroupLink::SumF64(g)) => {
                    StageGrads::F64(Box::new(NativeExchange::new(summed, layout(8)?, s, g)?))
                }
                (DType::F32, GroupLink::Lead { replicas, copies }) => {
                    let inner = GradExchange::new(exchange.clone(), layout(4)?, s, replicas)?;
                    let lead = CopyLead::new(inner, copies, timeout)?;
                    StageGrads::F32(Box::new(if presummed { lead.presummed() } else { lead }))
                }
                (DType::F64, GroupLink::Lead { replicas, copies }) => {
                    let inner = GradExchange::new(exchange.clone(), layout(8)?, s, replicas)?;
                    let lead = CopyLead::new(inner, copies, timeout)?;
                    StageGrads::F64(Box::new(if presummed { lead.presummed() } else { lead }))
                }
                (DType::F32, GroupLink::Partner(t)) => {
                    let partner = CopyPartner::new(layout(4)?, s, t, timeout)?;
                    StageGrads::F32(Box::new(if presummed {
                        partner.presummed()
                    } else {
                        partner
                    }))
                }
                (DType::F64, GroupLink::Partner(t)) => {
                    let partner = CopyPartner::new(layout(8)?, s, t, timeout)?;
                    StageGrads::F64(Box::new(if presummed {
                        partner.presummed()
                    } else {
                        partner
                    }))
                }
                (_, GroupLink::SumF32(_)) => return Err(wrong_type("f32")),
                (_, GroupLink::SumF64(_)) => return Err(wrong_type("f64")),
            };
            slots.push(Slot {
                stage: s,
                keeps_feedback,
                state: Mutex::new(SlotState {
                    grads,
                    copies: copies.len(),
                    done: Vec::new(),
                    started_by: None,
                }),
            });
        }
        // Exact on every step: no warm-up or refresh format either.
        let loss_config = ExchangeConfig {
            compression: Compression::None,
            warmup_compression: Compression::None,
            refresh_every: 0,
            reduce: Reduce::Sum,
            ..exchange
        };
        // Every replica's micro-batch losses, or the run's four summed figures if more.
        let all = (links.replicas * config.schedule.micro_batches).max(SUMMED_FIGURES);
        let losses = GradExchange::new(
            loss_config,
            BucketLayout::from_bucket_lens(&[all]),
            usize::MAX,
            links.losses,
        )?;
        Ok(ReplicaExchange {
            replica: links.replica,
            replicas: links.replicas,
            micro_batches: config.schedule.micro_batches,
            overlap: config.parallelism.overlap,
            in_pipeline: config.parallelism.overlap
                && every_copy_joins
                && config.one_bit_adam_from().is_none(),
            joins_remote_copies,
            slots: slots.into(),
            losses,
            seconds: 0.0,
            reported: ExchangeStats::default(),
            started_in_pipeline: Arc::new(AtomicUsize::new(0)),
            started_over_run: (0, 0),
        })
    }

    /// This replica's index.
    pub fn replica(&self) -> usize {
        self.replica
    }

    /// Whether the exchange itself sums DualPipe's stage copies (its hook starts each stage
    /// during the pipeline from the sum of the held copies, every copy joins a library's sum,
    /// or a copy's lead sums the copies of other processes), so the step must not sum them
    /// first.
    pub fn sums_copies(&self) -> bool {
        self.in_pipeline || self.joins_remote_copies
    }

    /// Where this replica's stage exchanges started over the run so far: `"in-pipeline"`
    /// (every one from the [`ExchangeHook`], as soon as its gradients were final),
    /// `"after-pipeline"` (none), `"partly-in-pipeline"` (some).
    pub fn started(&self) -> &'static str {
        match self.started_over_run {
            (0, _) => "after-pipeline",
            (hooked, all) if hooked == all => "in-pipeline",
            _ => "partly-in-pipeline",
        }
    }

    /// How the gradients move: `"point-to-point"` (ours) or `"mpi-allreduce"` (MPI's own).
    pub fn method(&self) -> &'static str {
        self.slots
            .first()
            .and_then(|slot| slot.state.lock().ok().map(|s| s.grads.method()))
            .unwrap_or("point-to-point")
    }

    /// The executor hook of step `step` (see [`ExchangeHook`]); it does nothing unless
    /// [`ReplicaExchange::sums_copies`].
    pub fn hook(&self, step: usize) -> ExchangeHook {
        self.started_in_pipeline.store(0, Ordering::Relaxed);
        ExchangeHook {
            slots: Arc::clone(&self.slots),
            started: Arc::clone(&self.started_in_pipeline),
            active: self.in_pipeline,
            step: step as u64,
        }
    }

    /// Replaces every held stage's gradients (in every copy) by their mean over the
    /// replicas, finishing what the [`ExchangeHook`] started during the pipeline and running
    /// the rest; returns what this replica's exchange of the step cost. DualPipe's copies
    /// must already be summed unless [`ReplicaExchange::sums_copies`].
    pub fn exchange(
        &mut self,
        step: usize,
        stages: &mut [RankStages<ModelStage>],
    ) -> Result<StepExchange, TrainError> {
        let began = Instant::now();
        let step = step as u64;
        let sums_copies = self.sums_copies();
        if self.overlap {
            for slot in self.slots.iter() {
                let mut state = slot.state.lock().map_err(|_| lock_error(slot.stage))?;
                if state.started_by.is_none() {
                    let copies = copies_of(stages, slot.stage);
                    // Summed here (all held copies) or already (the first holds the sum).
                    let take = if sums_copies { copies.len() } else { 1 };
                    let snaps = copies[..take.min(copies.len())]
                        .iter()
                        .map(|c| state.grads.snapshot(c))
                        .collect::<Result<Vec<_>, _>>()?;
                    state.grads.start(step, snaps)?;
                }
            }
            for slot in self.slots.iter() {
                let mut state = slot.state.lock().map_err(|_| lock_error(slot.stage))?;
                state.grads.finish(&mut copies_of(stages, slot.stage))?;
                state.started_by = None;
                state.done.clear();
            }
        } else {
            for slot in self.slots.iter() {
                let mut state = slot.state.lock().map_err(|_| lock_error(slot.stage))?;
                state
                    .grads
                    .all_reduce(step, &mut copies_of(stages, slot.stage))?;
            }
        }
        let seconds = began.elapsed().as_secs_f64();
        self.seconds += seconds;
        let (before, after) = (self.reported, self.totals());
        self.reported = after;
        let sent = |t: &ExchangeStats| t.grad_bytes_sent.saturating_add(t.header_bytes_sent);
        let started_in_pipeline = self.started_in_pipeline.swap(0, Ordering::Relaxed);
        self.started_over_run.0 += started_in_pipeline;
        self.started_over_run.1 += self.slots.len();
        Ok(StepExchange {
            seconds,
            bytes_sent: sent(&after).saturating_sub(sent(&before)),
            bytes_uncompressed: after
                .grad_bytes_uncompressed
                .saturating_sub(before.grad_bytes_uncompressed),
            started_in_pipeline,
            feedback_norm: self.feedback_norm(),
        })
    }

    /// The L2 norm of every error-feedback buffer this replica keeps.
    fn feedback_norm(&self) -> f64 {
        fn squares<T: GradFloat>(state: &ErrorFeedbackState<T>) -> f64 {
            state
                .worker
                .iter()
                .chain(&state.server)
                .flatten()
                .map(|&x| x.to_f64() * x.to_f64())
                .sum()
        }
        let mut total = 0.0;
        for slot in self.slots.iter().filter(|slot| slot.keeps_feedback) {
            if let Ok(state) = slot.state.lock() {
                total += match &state.grads {
                    StageGrads::F32(ex) => squares(ex.error_feedback()),
                    StageGrads::F64(ex) => squares(ex.error_feedback()),
                };
            }
        }
        total.sqrt()
    }

    /// Every replica's micro-batch losses of step `step`, in global micro-batch order
    /// (replica after replica), from this replica's `mine`. Exact: the other replicas'
    /// entries are zeros added to each value.
    pub fn gather_losses(&mut self, step: usize, mine: &[f64]) -> Result<Vec<f64>, TrainError> {
        let m = mine.len();
        let mut all = vec![0.0; (m * self.replicas).max(SUMMED_FIGURES)];
        all[self.replica * m..(self.replica + 1) * m].copy_from_slice(mine);
        self.losses.all_reduce(step as u64, &mut all)?;
        all.truncate(m * self.replicas);
        Ok(all)
    }

    /// `values` summed over the replicas, exactly for integers below 2^53 (in the losses'
    /// exchange, as step `step`, which must follow every training step).
    pub fn sum_over_replicas(
        &mut self,
        step: usize,
        values: [f64; SUMMED_FIGURES],
    ) -> Result<[f64; SUMMED_FIGURES], TrainError> {
        let mut all = vec![0.0; (self.replicas * self.micro_batches).max(SUMMED_FIGURES)];
        all[..SUMMED_FIGURES].copy_from_slice(&values);
        self.losses.all_reduce(step as u64, &mut all)?;
        Ok([all[0], all[1], all[2], all[3]])
    }

    /// The error-feedback buffers of every held model stage (what a lossy compression
    /// dropped, to add to the next step), as `f64` (exact for `f32` runs): checkpoints save
    /// them.
    pub fn error_feedback(&self) -> Vec<(usize, ErrorFeedbackState<f64>)> {
        fn widen<T: GradFloat>(state: &ErrorFeedbackState<T>) -> ErrorFeedbackState<f64> {
            let wide = |b: &Vec<Vec<T>>| -> Vec<Vec<f64>> {
                b.iter()
                    .map(|v| v.iter().map(|x| x.to_f64()).collect())
                    .collect()
            };
            ErrorFeedbackState {
                worker: wide(&state.worker),
                server: wide(&state.server),
            }
        }
        self.slots
            .iter()
            .filter(|slot| slot.keeps_feedback)
            .filter_map(|slot| {
                let state = slot.state.lock().ok()?;
                let fb = match &state.grads {
                    StageGrads::F32(ex) => widen(ex.error_feedback()),
                    StageGrads::F64(ex) => widen(ex.error_feedback()),
                };
                Some((slot.stage, fb))
            })
            .collect()
    }

    /// The bucket layout of model stage `stage`'s exchange when this replica keeps its error
    /// feedback (`None` otherwise): what [`ErrorFeedbackState::regroup`] re-splits by.
    pub fn feedback_layout(&self, stage: usize) -> Option<dualpipe_dp::BucketLayout> {
        let slot = self
            .slots
            .iter()
            .find(|slot| slot.stage == stage && slot.keeps_feedback)?;
        let state = slot.state.lock().ok()?;
        Some(match &state.grads {
            StageGrads::F32(ex) => ex.layout().clone(),
            StageGrads::F64(ex) => ex.layout().clone(),
        })
    }

    /// Restores model stage `stage`'s error-feedback buffers (from
    /// [`ReplicaExchange::error_feedback`]); refused when they do not fit its buckets. A
    /// stage this replica does not hold, or holds as a [`CopyPartner`] (the lead keeps the
    /// feedback), is ignored.
    pub fn set_error_feedback(
        &mut self,
        stage: usize,
        state: &ErrorFeedbackState<f64>,
    ) -> Result<(), TrainError> {
        fn narrow<T: GradFloat>(state: &ErrorFeedbackState<f64>) -> ErrorFeedbackState<T> {
            let narrow = |b: &Vec<Vec<f64>>| -> Vec<Vec<T>> {
                b.iter()
                    .map(|v| v.iter().map(|&x| T::from_f64(x)).collect())
                    .collect()
            };
            ErrorFeedbackState {
                worker: narrow(&state.worker),
                server: narrow(&state.server),
            }
        }
        for slot in self.slots.iter() {
            if slot.stage == stage && slot.keeps_feedback {
                let mut held = slot.state.lock().map_err(|_| lock_error(stage))?;
                match &mut held.grads {
                    StageGrads::F32(ex) => ex.set_error_feedback(narrow(state))?,
                    StageGrads::F64(ex) => ex.set_error_feedback(narrow(state))?,
                }
            }
        }
        Ok(())
    }

    /// What this replica's gradient exchanges sent over the run (the losses not included).
    pub fn totals(&self) -> ExchangeStats {
        let mut total = ExchangeStats::default();
        for slot in self.slots.iter() {
            let Ok(state) = slot.state.lock() else {
                continue;
            };
            let t = state.grads.totals();
            total.grad_bytes_sent += t.grad_bytes_sent;
            total.header_bytes_sent += t.header_bytes_sent;
            total.grad_bytes_uncompressed += t.grad_bytes_uncompressed;
            total.messages += t.messages;
            total.exchange_seconds += t.exchange_seconds;
            total.finish_seconds += t.finish_seconds;
        }
        total
    }

    /// Wall-clock seconds this replica spent exchanging gradients after its pipelines (what
    /// compute did not hide).
    pub fn seconds(&self) -> f64 {
        self.seconds
    }
}

/// The executor's [`StepHook`] for one replica's step ([`ReplicaExchange::hook`]): on the
/// rank's own thread, right after a stage copy's last weight-gradient op, it takes a copy of
/// its gradients; once every held copy of the stage has reported, it sums them (lowest
/// direction first) and starts the stage's buckets (they send at once and never wait). After
/// every op it makes progress on the exchanges that rank started (takes arrivals, reduces
/// complete shards, sends results). The same calls serve local threads and one rank per
/// process (under MPI all of them come from the thread that initialised it).
pub struct ExchangeHook {
    slots: Arc<[Slot]>,
    started: Arc<AtomicUsize>,
    active: bool,
    step: u64,
}

impl std::fmt::Debug for ExchangeHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExchangeHook")
            .field("step", &self.step)
            .field("active", &self.active)
            .finish()
    }
}

impl StepHook<ModelStage> for ExchangeHook {
    fn stage_done(
        &self,
        rank: usize,
        _dir: usize,
        _stage: usize,
        copy: &ModelStage,
    ) -> Result<(), StageError> {
        if !self.active {
            return Ok(());
        }
        let stage = copy.model_stage();
        let Some(slot) = self.slots.iter().find(|s| s.stage == stage) else {
            return Err(StageError(format!(
                "model stage {stage} has no data-parallel group"
            )));
        };
        let fail = |e: TrainError| StageError(e.to_string());
        let mut state = slot.state.lock().map_err(|_| fail(lock_error(stage)))?;
        let snapshot = state.grads.snapshot(copy).map_err(fail)?;
        state.done.push((copy.dir(), snapshot));
        if state.done.len() < state.copies {
            return Ok(());
        }
        // Every held copy is final: their sum, lowest direction first, starts the buckets.
        let mut done = std::mem::take(&mut state.done);
        done.sort_by_key(|(dir, _)| *dir);
        let copies = done.into_iter().map(|(_, c)| c).collect();
        state.grads.start(self.step, copies).map_err(fail)?;
        state.started_by = Some(rank);
        self.started.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn between_ops(&self, rank: usize) -> Result<(), StageError> {
        if !self.active {
            return Ok(());
        }
        for slot in self.slots.iter() {
            // Only the rank that started an exchange makes progress on it during the
            // pipeline; a slot another rank holds at the moment is skipped, not waited for.
            let Ok(mut state) = slot.state.try_lock() else {
                continue;
            };
            if state.started_by == Some(rank) {
                state
                    .grads
                    .progress()
                    .map_err(|e| StageError(e.to_string()))?;
            }
        }
        Ok(())
    }
}

fn start<T: GradFloat>(
    ex: &mut dyn BucketExchange<T>,
    step: u64,
    grads: &[T],
) -> Result<(), TrainError> {
    ex.begin_step(step)?;
    let mut at = 0;
    for bucket in 0..ex.layout().buckets() {
        let n = ex.layout().len(bucket);
        ex.start_bucket(bucket, &grads[at..at + n])?;
        at += n;
    }
    Ok(())
}

/// `data_parallel` replicas of the pipeline in this process (see the [module](self)
/// documentation): replica `d` is a [`Trainer`] whose ranks run on their own threads.
#[derive(Debug)]
pub struct DataParallel {
    replicas: Vec<Trainer<LocalThreads>>,
}

impl DataParallel {
    /// The replicas of `config` with the schedule it generates.
    pub fn new(config: TrainConfig) -> Result<Self, TrainError> {
        DataParallel::build(config, None)
    }

    /// The replicas of `config`, each running `schedule` (checked as
    /// [`Trainer::with_schedule`] does).
    pub fn with_schedule(config: TrainConfig, schedule: Schedule) -> Result<Self, TrainError> {
        DataParallel::build(config, Some(schedule))
    }

    /// The replicas of `config` training `workload` (a user's model) instead of the one
    /// `config` describes, each on `schedule` or the one `config` generates.
    pub fn with_workload(
        config: TrainConfig,
        schedule: Option<Schedule>,
        workload: &crate::custom::CustomWorkload,
    ) -> Result<Self, TrainError> {
        DataParallel::build_of(config, schedule, Some(workload))
    }

    fn build(config: TrainConfig, schedule: Option<Schedule>) -> Result<Self, TrainError> {
        DataParallel::build_of(config, schedule, None)
    }

    fn build_of(
        config: TrainConfig,
        schedule: Option<Schedule>,
        workload: Option<&crate::custom::CustomWorkload>,
    ) -> Result<Self, TrainError> {
        let replicas = config.parallelism.data_parallel.max(1);
        let mut stage_groups: Vec<_> = (0..config.model_stages())
            .map(|_| ChannelTransport::group(replicas).into_iter())
            .collect();
        let mut loss_group = ChannelTransport::group(replicas).into_iter();
        let mut expert_links = crate::expert_parallel::links_for(&config, replicas).into_iter();
        let mut trainers = Vec::with_capacity(replicas);
        for replica in 0..replicas {
            let stages = stage_groups
                .iter_mut()
                .enumerate()
                .filter_map(|(s, g)| g.next().map(|t| (s, GroupLink::Messages(Box::new(t)))))
                .collect();
            let losses = loss_group
                .next()
                .map(|t| Box::new(t) as GroupTransport)
                .ok_or_else(|| TrainError::Execution("no loss transport".into()))?;
            let links = ReplicaLinks {
                replica,
                replicas,
                stages,
                losses,
            };
            let mut trainer = match workload {
                Some(w) => Trainer::with_workload(
                    config.clone(),
                    schedule.clone(),
                    LocalThreads,
                    Some(links),
                    crate::Workload::Custom(Box::new(w.clone())),
                )?,
                None => {
                    Trainer::for_replica(config.clone(), schedule.clone(), LocalThreads, links)?
                }
            };
            if let Some(links) = expert_links.next() {
                trainer.join_expert_group(replica, links)?;
            }
            trainers.push(trainer);
        }
        Ok(DataParallel { replicas: trainers })
    }

    /// The replicas' trainers (replica 0 first: it evaluates and reports).
    pub fn replicas(&self) -> &[Trainer<LocalThreads>] {
        &self.replicas
    }

    /// Replica `d`'s trainer (e.g. replica 0's [`Trainer::weights`], the same on every
    /// replica).
    pub fn replica_mut(&mut self, d: usize) -> &mut Trainer<LocalThreads> {
        &mut self.replicas[d]
    }

    /// Gives every replica a handle on `writer` (which must expect one part per replica).
    pub fn set_checkpoints(&mut self, writer: &crate::checkpoint::CheckpointWriter) {
        for t in &mut self.replicas {
            if let Some(sink) = writer.sink() {
                t.set_checkpoints(sink);
            }
        }
    }

    /// Stops every replica's checkpoints (so the writer can finish).
    pub fn clear_checkpoints(&mut self) {
        self.replicas
            .iter_mut()
            .for_each(Trainer::clear_checkpoints);
    }

    /// [`Trainer::restore`] on every replica (replica 0's report).
    pub fn restore(
        &mut self,
        checkpoint: &crate::checkpoint::Checkpoint,
    ) -> Result<crate::trainer::Restored, TrainError> {
        let mut first = None;
        for t in &mut self.replicas {
            let restored = t.restore(checkpoint)?;
            first.get_or_insert(restored);
        }
        first.ok_or_else(|| TrainError::Execution("no replica".into()))
    }

    /// One step of every replica, concurrently; returns replica 0's report (its losses are
    /// every replica's, in global micro-batch order).
    pub fn step(&mut self) -> Result<StepReport, TrainError> {
        let results = self.on_every_replica(|t, _| t.step());
        first_error(results).map(|mut reports| reports.swap_remove(0))
    }

    /// [`Trainer::run`] on every replica concurrently; `on_step` hears replica 0 (whose
    /// reports carry the global losses). The summary is replica 0's with the exchange's
    /// figures over every worker: `grad_bytes_sent` and `grad_bytes_uncompressed` summed,
    /// `communication_overhead` the mean of the replicas' (processes') shares.
    ///
    /// A replica that fails leaves the others waiting in the exchange until their
    /// `recv_timeout`; the error reported is the first replica's (in replica order) that is
    /// not a timeout of the exchange, if any.
    pub fn run(
        &mut self,
        mut on_step: impl FnMut(StepEvent<'_>) -> Result<(), String>,
    ) -> Result<RunSummary, TrainError> {
        let (first, rest) = self
            .replicas
            .split_first_mut()
            .ok_or_else(|| TrainError::Execution("no replica".into()))?;
        let (head, tail) = std::thread::scope(|scope| {
            let handles: Vec<_> = rest
                .iter_mut()
                .map(|t| scope.spawn(move || t.run(|_| Ok(()))))
                .collect();
            let head = first.run(&mut on_step);
            let tail: Vec<_> = handles.into_iter().map(join).collect();
            (head, tail)
        });
        let mut results = vec![head];
        results.extend(tail);
        // Every replica's summary already holds the figures over every worker; the replicas'
        // rank threads ran at the same time.
        let replicas = self.replicas.len();
        first_error(results).map(|mut summaries| {
            let mut summary = summaries.swap_remove(0);
            summary.rank_threads = summary.rank_threads.saturating_mul(replicas);
            summary
        })
    }

    fn on_every_replica<R: Send>(
        &mut self,
        f: impl Fn(&mut Trainer<LocalThreads>, usize) -> Result<R, TrainError> + Sync,
    ) -> Vec<Result<R, TrainError>> {
        let f = &f;
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .replicas
                .iter_mut()
                .enumerate()
                .map(|(d, t)| scope.spawn(move || f(t, d)))
                .collect();
            handles.into_iter().map(join).collect()
        })
    }
}

fn join<R>(h: std::thread::ScopedJoinHandle<'_, Result<R, TrainError>>) -> Result<R, TrainError> {
    h.join()
        .unwrap_or_else(|_| Err(TrainError::Execution("a replica's thread panicked".into())))
}

/// Every value, or the first error that is not an exchange timeout (else the first error).
fn first_error<R>(results: Vec<Result<R, TrainError>>) -> Result<Vec<R>, TrainError> {
    if results.iter().all(Result::is_ok) {
        return Ok(results.into_iter().filter_map(Result::ok).collect());
    }
    let errors: Vec<TrainError> = results.into_iter().filter_map(Result::err).collect();
    let timed_out = |e: &TrainError| {
        matches!(
            e,
            TrainError::Exchange(dualpipe_dp::DpError::TimedOut { .. })
        )
    };
    let pick = errors.iter().position(|e| !timed_out(e)).unwrap_or(0);
    Err(errors
        .into_iter()
        .nth(pick)
        .unwrap_or_else(|| TrainError::Execution("a replica failed".into())))
}
