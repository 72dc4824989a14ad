//! Data parallelism: `data_parallel` replicas of the whole pipeline, each training on its own
//! share of the global batch, their gradients averaged per model stage before the optimizer.
//!
//! - [`ReplicaExchange`] — one replica's end of the exchange: per model stage it holds, a
//!   [`GradExchange`] over the stage's data-parallel group (the same stage in every replica),
//!   plus a small uncompressed exchange that gathers every replica's micro-batch losses so each
//!   replica reports the global step loss;
//! - [`DataParallel`] — the local backend: `data_parallel` [`Trainer`]s, one per replica, each
//!   running its pipeline on its own threads, concurrently, joined by in-process channels
//!   ([`ChannelTransport`]).
//!
//! The step of a replica: its pipeline (micro-batch losses scaled by `1 / micro_batches`, so
//! a replica's gradient is the mean over its micro-batches), the sum of DualPipe's stage
//! copies, then the exchange (the mean over replicas: the global-batch mean), then clipping and
//! the optimizer. The exchange runs after the pipeline, not during it: with
//! [`TrainConfig::overlap`] every stage's buckets are started before any is waited for (the
//! stages' exchanges overlap each other), without it (`--no-overlap`) one stage's plain
//! all-reduce follows another. See `docs/distributed.md`.

use std::time::Instant;

use candle_core::{Tensor, WithDType};
use dualpipe_dp::{
    BucketLayout, ChannelTransport, ErrorFeedbackState, ExchangeConfig, ExchangeStats,
    GradExchange, GradFloat, GradTransport, Reduce,
};
use dualpipe_nn::ModelStage;
use dualpipe_runtime::RankStages;
use dualpipe_schedule::Schedule;

use crate::config::{DType, TrainConfig};
use crate::driver::LocalThreads;
use crate::error::TrainError;
use crate::summary::RunSummary;
use crate::trainer::{StepEvent, StepReport, Trainer};

/// A data-parallel group's transport, as one replica's end of it.
pub type GroupTransport = Box<dyn GradTransport + Send>;

/// One replica's ends of its data-parallel groups, before the exchange is built.
pub struct ReplicaLinks {
    /// This replica's index, and the replica count.
    pub replica: usize,
    /// The replica count.
    pub replicas: usize,
    /// Per model stage this replica holds: the stage and its group's transport.
    pub stages: Vec<(usize, GroupTransport)>,
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
    F32(GradExchange<f32, GroupTransport>),
    F64(GradExchange<f64, GroupTransport>),
}

impl StageGrads {
    fn totals(&self) -> ExchangeStats {
        match self {
            StageGrads::F32(ex) => ex.totals(),
            StageGrads::F64(ex) => ex.totals(),
        }
    }
}

/// What one step's gradient exchange cost one replica (the losses' exchange not included).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepExchange {
    /// Wall-clock seconds of the exchange (after the pipeline: nothing hides it).
    pub seconds: f64,
    /// Bytes this replica sent: gradient bodies and message headers.
    pub bytes_sent: u64,
    /// What the gradient bodies would have carried uncompressed.
    pub bytes_uncompressed: u64,
}

/// One replica's end of the gradient exchange (see the [module](self) documentation).
pub struct ReplicaExchange {
    replica: usize,
    replicas: usize,
    micro_batches: usize,
    overlap: bool,
    stages: Vec<(usize, StageGrads)>,
    losses: GradExchange<f64, GroupTransport>,
    /// Wall-clock seconds spent in the gradient exchange (nothing hides it: it runs after
    /// the pipeline).
    seconds: f64,
}

impl std::fmt::Debug for ReplicaExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaExchange")
            .field("replica", &self.replica)
            .field("replicas", &self.replicas)
            .field("overlap", &self.overlap)
            .field("stages", &self.stages.len())
            .finish()
    }
}

fn copies_of(
    stages: &mut [RankStages<ModelStage>],
    model_stage: usize,
) -> impl Iterator<Item = &mut ModelStage> {
    stages
        .iter_mut()
        .flat_map(RankStages::iter_mut)
        .map(|(_, s)| s)
        .filter(move |s| s.model_stage() == model_stage)
}

fn model_error(e: candle_core::Error) -> TrainError {
    TrainError::Execution(format!("gradient exchange: {e}"))
}

/// The gradients of model stage `model_stage`'s copy of the lowest direction, flattened
/// parameter after parameter.
fn read_grads<T: WithDType>(
    stages: &mut [RankStages<ModelStage>],
    model_stage: usize,
) -> Result<Vec<T>, TrainError> {
    let canon = copies_of(stages, model_stage)
        .min_by_key(|s| s.dir())
        .ok_or_else(|| TrainError::Execution(format!("no copy of stage {model_stage}")))?;
    let mut out = Vec::new();
    for p in canon.params() {
        out.extend(
            p.grad
                .flatten_all()
                .and_then(|g| g.to_vec1::<T>())
                .map_err(model_error)?,
        );
    }
    Ok(out)
}

/// Writes the exchanged gradients into every copy of `model_stage`.
fn write_grads<T: WithDType + GradFloat, X: GradTransport>(
    stages: &mut [RankStages<ModelStage>],
    model_stage: usize,
    ex: &GradExchange<T, X>,
) -> Result<(), TrainError> {
    for copy in copies_of(stages, model_stage) {
        for (j, p) in copy.params_mut().into_iter().enumerate() {
            p.grad = Tensor::from_slice(ex.param(j), p.grad.shape(), p.grad.device())
                .map_err(model_error)?;
        }
    }
    Ok(())
}

fn param_lens(stages: &mut [RankStages<ModelStage>], model_stage: usize) -> Vec<usize> {
    copies_of(stages, model_stage)
        .min_by_key(|s| s.dir())
        .map(|s| s.params().iter().map(|p| p.grad.elem_count()).collect())
        .unwrap_or_default()
}

impl ReplicaExchange {
    /// The exchange of replica `links.replica` for the held `stages` (their parameter sizes
    /// cut the buckets), with `config`'s compression, buckets and warm-up.
    pub fn new(
        config: &TrainConfig,
        links: ReplicaLinks,
        stages: &mut [RankStages<ModelStage>],
    ) -> Result<Self, TrainError> {
        let exchange = config.exchange_config();
        let mut built = Vec::with_capacity(links.stages.len());
        for (s, transport) in links.stages {
            let lens = param_lens(stages, s);
            let grads = match config.dtype {
                DType::F32 => StageGrads::F32(GradExchange::new(
                    exchange.clone(),
                    BucketLayout::new(&lens, exchange.bucket_bytes, 4)?,
                    s,
                    transport,
                )?),
                DType::F64 => StageGrads::F64(GradExchange::new(
                    exchange.clone(),
                    BucketLayout::new(&lens, exchange.bucket_bytes, 8)?,
                    s,
                    transport,
                )?),
            };
            built.push((s, grads));
        }
        let loss_config = ExchangeConfig {
            compression: dualpipe_dp::Compression::None,
            reduce: Reduce::Sum,
            ..exchange
        };
        let all = links.replicas * config.micro_batches;
        let losses = GradExchange::new(
            loss_config,
            BucketLayout::from_bucket_lens(&[all]),
            usize::MAX,
            links.losses,
        )?;
        Ok(ReplicaExchange {
            replica: links.replica,
            replicas: links.replicas,
            micro_batches: config.micro_batches,
            overlap: config.overlap,
            stages: built,
            losses,
            seconds: 0.0,
        })
    }

    /// This replica's index.
    pub fn replica(&self) -> usize {
        self.replica
    }

    /// Replaces every held stage's gradients (both DualPipe copies, already summed) by their
    /// mean over the replicas; returns what this replica's exchange of the step cost.
    pub fn exchange(
        &mut self,
        step: usize,
        stages: &mut [RankStages<ModelStage>],
    ) -> Result<StepExchange, TrainError> {
        let began = Instant::now();
        let before = self.totals();
        let step = step as u64;
        if self.overlap {
            for (s, grads) in &mut self.stages {
                match grads {
                    StageGrads::F32(ex) => start(ex, step, &read_grads::<f32>(stages, *s)?)?,
                    StageGrads::F64(ex) => start(ex, step, &read_grads::<f64>(stages, *s)?)?,
                }
            }
            for (s, grads) in &mut self.stages {
                match grads {
                    StageGrads::F32(ex) => {
                        ex.finish()?;
                        write_grads(stages, *s, ex)?;
                    }
                    StageGrads::F64(ex) => {
                        ex.finish()?;
                        write_grads(stages, *s, ex)?;
                    }
                }
            }
        } else {
            for (s, grads) in &mut self.stages {
                match grads {
                    StageGrads::F32(ex) => {
                        let mut g = read_grads::<f32>(stages, *s)?;
                        ex.all_reduce(step, &mut g)?;
                        write_grads(stages, *s, ex)?;
                    }
                    StageGrads::F64(ex) => {
                        let mut g = read_grads::<f64>(stages, *s)?;
                        ex.all_reduce(step, &mut g)?;
                        write_grads(stages, *s, ex)?;
                    }
                }
            }
        }
        let seconds = began.elapsed().as_secs_f64();
        self.seconds += seconds;
        let after = self.totals();
        let sent = |t: &ExchangeStats| t.grad_bytes_sent.saturating_add(t.header_bytes_sent);
        Ok(StepExchange {
            seconds,
            bytes_sent: sent(&after).saturating_sub(sent(&before)),
            bytes_uncompressed: after
                .grad_bytes_uncompressed
                .saturating_sub(before.grad_bytes_uncompressed),
        })
    }

    /// Every replica's micro-batch losses of step `step`, in global micro-batch order
    /// (replica after replica), from this replica's `mine`. Exact: the other replicas'
    /// entries are zeros added to each value.
    pub fn gather_losses(&mut self, step: usize, mine: &[f64]) -> Result<Vec<f64>, TrainError> {
        let m = mine.len();
        let mut all = vec![0.0; m * self.replicas];
        all[self.replica * m..(self.replica + 1) * m].copy_from_slice(mine);
        self.losses.all_reduce(step as u64, &mut all)?;
        Ok(all)
    }

    /// `values` summed over the replicas, exactly for integers below 2^53 (in the losses'
    /// exchange, as step `step`, which must follow every training step).
    pub fn sum_over_replicas(
        &mut self,
        step: usize,
        values: [f64; 4],
    ) -> Result<[f64; 4], TrainError> {
        let mut all = vec![0.0; self.replicas * self.micro_batches];
        all[..4].copy_from_slice(&values);
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
        self.stages
            .iter()
            .map(|(s, g)| {
                let state = match g {
                    StageGrads::F32(ex) => widen(ex.error_feedback()),
                    StageGrads::F64(ex) => widen(ex.error_feedback()),
                };
                (*s, state)
            })
            .collect()
    }

    /// Restores model stage `stage`'s error-feedback buffers (from
    /// [`ReplicaExchange::error_feedback`]); refused when they do not fit its buckets. A
    /// stage this replica does not hold is ignored.
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
        for (s, g) in &mut self.stages {
            if *s == stage {
                match g {
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
        for (_, g) in &self.stages {
            let t = g.totals();
            total.grad_bytes_sent += t.grad_bytes_sent;
            total.header_bytes_sent += t.header_bytes_sent;
            total.grad_bytes_uncompressed += t.grad_bytes_uncompressed;
            total.messages += t.messages;
            total.exchange_seconds += t.exchange_seconds;
            total.finish_seconds += t.finish_seconds;
        }
        total
    }

    /// Wall-clock seconds this replica spent exchanging gradients (none of it hidden by
    /// compute: the exchange follows the pipeline).
    pub fn seconds(&self) -> f64 {
        self.seconds
    }
}

fn start<T: GradFloat, X: GradTransport>(
    ex: &mut GradExchange<T, X>,
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

    fn build(config: TrainConfig, schedule: Option<Schedule>) -> Result<Self, TrainError> {
        let replicas = config.data_parallel.max(1);
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
                .filter_map(|(s, g)| g.next().map(|t| (s, Box::new(t) as GroupTransport)))
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
            let mut trainer =
                Trainer::for_replica(config.clone(), schedule.clone(), LocalThreads, links)?;
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
