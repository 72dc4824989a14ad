//! [`ReplicaExchange`]: one replica's end of the data-parallel gradient exchange, below the
//! trainer (what one replica does with its gradients; see the [module](super)
//! documentation).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dualpipe_dp::{
    BucketLayout, Compression, CopyLead, CopyPartner, ErrorFeedbackState, ExchangeConfig,
    ExchangeStats, GradExchange, GradFloat, NativeExchange, Reduce,
};
use dualpipe_nn::ModelStage;
use dualpipe_runtime::RankStages;
use dualpipe_schedule::StagePlacement;

use super::grads::{copies_of, exchanged_lens, lock_error, Snapshot, StageGrads};
use super::hook::ExchangeHook;
use super::links::{GroupLink, GroupTransport, ReplicaLinks};
use crate::config::{DType, TrainConfig};
use crate::error::TrainError;

/// One model stage's exchange and, during a step, what the hook has collected.
pub(super) struct Slot {
    pub(super) stage: usize,
    /// Whether this process keeps the stage's error feedback (not a [`CopyPartner`]).
    pub(super) keeps_feedback: bool,
    pub(super) state: Mutex<SlotState>,
}

pub(super) struct SlotState {
    pub(super) grads: StageGrads,
    /// The copies of the stage this process holds.
    pub(super) copies: usize,
    /// This step's copies whose gradients are final: (direction, gradients).
    pub(super) done: Vec<(usize, Snapshot)>,
    /// The rank whose thread started this step's buckets during the pipeline.
    pub(super) started_by: Option<usize>,
}

/// The figures [`ReplicaExchange::sum_over_replicas`] sums (the losses' exchange is at
/// least this long, even for one micro-batch per replica).
pub(super) const SUMMED_FIGURES: usize = 4;

pub use crate::summary::StepExchange;

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

impl ReplicaExchange {
    /// The exchange of replica `links.replica` for the held `stages` of `placement` (their
    /// parameter sizes cut the buckets), with `config`'s compression, buckets and warm-up.
    pub fn new(
        config: &TrainConfig,
        links: ReplicaLinks,
        placement: &StagePlacement,
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
                (DType::F32 | DType::Bf16 | DType::F16, GroupLink::Messages(t)) => StageGrads::F32(
                    Box::new(GradExchange::new(exchange.clone(), layout(4)?, s, t)?),
                ),
                (DType::F64, GroupLink::Messages(t)) => StageGrads::F64(Box::new(
                    GradExchange::new(exchange.clone(), layout(8)?, s, t)?,
                )),
                (DType::F32 | DType::Bf16 | DType::F16, GroupLink::SumF32(g)) => {
                    StageGrads::F32(Box::new(NativeExchange::new(summed, layout(4)?, s, g)?))
                }
                (DType::F64, GroupLink::SumF64(g)) => {
                    StageGrads::F64(Box::new(NativeExchange::new(summed, layout(8)?, s, g)?))
                }
                (DType::F32 | DType::Bf16 | DType::F16, GroupLink::Lead { replicas, copies }) => {
                    let inner = GradExchange::new(exchange.clone(), layout(4)?, s, replicas)?;
                    let lead = CopyLead::new(inner, copies, timeout)?;
                    StageGrads::F32(Box::new(if presummed { lead.presummed() } else { lead }))
                }
                (DType::F64, GroupLink::Lead { replicas, copies }) => {
                    let inner = GradExchange::new(exchange.clone(), layout(8)?, s, replicas)?;
                    let lead = CopyLead::new(inner, copies, timeout)?;
                    StageGrads::F64(Box::new(if presummed { lead.presummed() } else { lead }))
                }
                (DType::F32 | DType::Bf16 | DType::F16, GroupLink::Partner(t)) => {
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
            total.add(&state.grads.totals());
        }
        total
    }

    /// Wall-clock seconds this replica spent exchanging gradients after its pipelines (what
    /// compute did not hide).
    pub fn seconds(&self) -> f64 {
        self.seconds
    }
}
