//! One rank per process: running a step's program over an [`Endpoint`], summing the copies of
//! DualPipe's stages and reducing the losses over the same transport.
//!
//! Every process builds only its own rank's stages and calls, per step, [`run_rank_step`]
//! (the rank's program; then every rank's losses and measured timeline are exchanged, so each
//! process returns the same [`StepOutcome`] the local executor would), then
//! [`sum_stage_copies_remote`] (each DualPipe stage copy sends its gradients to the other
//! copy's rank and adds the other's in, in the same order as [`sum_stage_copies`], so the
//! sums are bit-identical to a local run's), then its optimizer. [`barrier`] lines the
//! processes up before they exit.
//!
//! Tensors cross as [`WireData`] through the stage's [`WireStage`] codec. Every message is
//! stamped with the step, so nothing of one step can be taken for another. A rank that fails
//! tells every other ([`Endpoint::fail`]); they stop with [`RuntimeError::PeerFailed`] naming
//! it.
//!
//! [`sum_stage_copies`]: crate::sum_stage_copies

use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use dualpipe_schedule::{MessageKind, Timeline};
use dualpipe_schedule::{Schedule, StagePlacement};

use super::check::check_rank_setup;
use super::cpu::{available_cores, RankTimes};
use super::hook::{NoHook, StepHook};
use super::report::{decode_report, encode_report};
use super::types::{ExecOptions, MicroBatchLoss, RankStages, StepOutcome};
use super::worker::Worker;
use crate::error::panic_message;
use crate::transport::endpoint::{Endpoint, Link, NetError, NOTICE_GRACE};
use crate::transport::wire::{Class, Stamp, WireData};
use crate::transport::{Key, Transport, WaitError};
use crate::{RuntimeError, WireStage};

/// The executor's view of an endpoint during one step.
struct RemoteTransport<'e, L, S> {
    endpoint: &'e mut Endpoint<L>,
    step: u64,
    _stage: PhantomData<fn() -> S>,
}

fn stamp_of(step: u64, key: Key) -> Stamp {
    let class = match key.kind {
        MessageKind::Forward => Class::Forward,
        MessageKind::Backward => Class::Backward,
    };
    Stamp::chunk(step, class, key.chunk.dir, key.chunk.stage, key.chunk.mb)
}

fn wait_error(err: NetError) -> WaitError {
    match err {
        NetError::Aborted { rank, message } => WaitError::PeerFailed { rank, message },
        NetError::TimedOut { .. } => WaitError::TimedOut,
        other => WaitError::Transport(other.to_string()),
    }
}

fn decode_one<S: WireStage>(
    src: usize,
    mut tensors: Vec<WireData>,
) -> Result<(usize, S::Tensor), WaitError> {
    if tensors.len() != 1 {
        return Err(WaitError::Transport(format!(
            "rank {src} sent {} tensors where one was expected",
            tensors.len()
        )));
    }
    let data = tensors
        .pop()
        .ok_or_else(|| WaitError::Transport("no tensor".into()))?;
    S::tensor_from_wire(data)
        .map(|t| (src, t))
        .map_err(|e| WaitError::Transport(format!("cannot decode the tensor from rank {src}: {e}")))
}

impl<L: Link, S: WireStage> Transport<S::Tensor> for RemoteTransport<'_, L, S> {
    fn send(&mut self, dst: usize, key: Key, tensor: S::Tensor) -> Result<(), WaitError> {
        let data = S::tensor_to_wire(tensor)
            .map_err(|e| WaitError::Transport(format!("cannot encode the tensor: {e}")))?;
        self.endpoint
            .send(dst, stamp_of(self.step, key), vec![data])
            .map_err(wait_error)
    }

    fn try_take(&mut self, key: Key) -> Result<Option<(usize, S::Tensor)>, WaitError> {
        match self
            .endpoint
            .try_take(stamp_of(self.step, key))
            .map_err(wait_error)?
        {
            Some((src, tensors)) => decode_one::<S>(src, tensors).map(Some),
            None => Ok(None),
        }
    }

    fn take(
        &mut self,
        key: Key,
        deadline: Instant,
        _poll: Duration,
    ) -> Result<(usize, S::Tensor), WaitError> {
        let (src, tensors) = self
            .endpoint
            .take(stamp_of(self.step, key), deadline)
            .map_err(wait_error)?;
        decode_one::<S>(src, tensors)
    }

    fn aborted(&mut self) -> bool {
        self.endpoint.aborted().is_some()
    }

    fn fail(&mut self, err: RuntimeError) {
        self.endpoint.fail(&err.to_string(), NOTICE_GRACE);
    }

    fn failed_peer(&mut self) -> Option<(usize, String)> {
        self.endpoint.aborted()
    }
}

/// Maps an endpoint failure during a collective to the runtime's error (and tells the other
/// ranks when the failure is this rank's own).
fn collective_error<L: Link>(
    endpoint: &mut Endpoint<L>,
    what: &str,
    peer: usize,
    timeout: Duration,
    err: NetError,
) -> RuntimeError {
    let rank = endpoint.rank();
    let err = match err {
        NetError::Aborted {
            rank: failed_rank,
            message,
        } => {
            return RuntimeError::PeerFailed {
                rank,
                failed_rank,
                message,
            }
        }
        NetError::TimedOut { .. } => RuntimeError::Timeout {
            rank,
            what: what.to_string(),
            peer,
            timeout,
        },
        other => RuntimeError::Transport {
            rank,
            op: what.to_string(),
            message: other.to_string(),
        },
    };
    endpoint.fail(&err.to_string(), NOTICE_GRACE);
    err
}

/// Reports `err` (this rank's own failure) to every rank and returns it.
fn own_failure<L: Link>(endpoint: &mut Endpoint<L>, err: RuntimeError) -> RuntimeError {
    endpoint.fail(&err.to_string(), NOTICE_GRACE);
    err
}

/// Runs this process's rank of step `step` and exchanges every rank's losses and timeline.
///
/// `stages` holds this rank's stages (those of `schedule.placement.stages_of(rank)`), and
/// `endpoint` must span exactly `schedule.ranks` ranks. Every rank of the world must call this
/// with the same schedule and step. Returns the same outcome on every rank: all losses
/// ordered by `global_mb`, and a timeline with every rank's compute intervals and messages
/// (each rank's times count from its own start of the step).
///
/// On failure this rank tells every other rank and returns its error; a rank that learns of
/// another's failure returns [`RuntimeError::PeerFailed`] naming it.
pub fn run_rank_step<S: WireStage, L: Link>(
    schedule: &Schedule,
    stages: &mut RankStages<S>,
    endpoint: &mut Endpoint<L>,
    step: u64,
    options: &ExecOptions,
) -> Result<StepOutcome, RuntimeError> {
    run_rank_step_with(schedule, stages, endpoint, step, options, &NoHook)
}

/// [`run_rank_step`], telling `hook` on this thread when a stage's gradients are final and
/// after every op (see [`StepHook`]).
pub fn run_rank_step_with<S: WireStage, L: Link>(
    schedule: &Schedule,
    stages: &mut RankStages<S>,
    endpoint: &mut Endpoint<L>,
    step: u64,
    options: &ExecOptions,
    hook: &dyn StepHook<S>,
) -> Result<StepOutcome, RuntimeError> {
    let rank = endpoint.rank();
    if endpoint.ranks() != schedule.ranks {
        let err = RuntimeError::Setup(format!(
            "the schedule has {} ranks but the transport connects {} processes; start one \
             process per rank (mpirun -n {})",
            schedule.ranks,
            endpoint.ranks(),
            schedule.ranks
        ));
        return Err(own_failure(endpoint, err));
    }
    if let Err(err) = check_rank_setup(schedule, rank, stages) {
        return Err(own_failure(endpoint, err));
    }
    if let Err(err) = endpoint.begin_step(step) {
        let err = RuntimeError::Transport {
            rank,
            op: format!("start of step {step}"),
            message: err.to_string(),
        };
        return Err(own_failure(endpoint, err));
    }
    let start = Instant::now();
    let transport = RemoteTransport::<L, S> {
        endpoint: &mut *endpoint,
        step,
        _stage: PhantomData,
    };
    let record = Worker::new(rank, schedule, stages, transport, options, start, hook)
        .run()
        .map_err(|err| {
            err.unwrap_or_else(|| RuntimeError::Protocol {
                rank,
                op: "step".into(),
                message: "the rank stopped without a result".into(),
            })
        })?;
    let wall_seconds = start.elapsed().as_secs_f64();

    // Every rank's losses and timeline to every rank.
    let mut timeline = Timeline::new(schedule.ranks);
    let mut losses = Vec::new();
    let mut rank_times = RankTimes {
        ranks: Vec::with_capacity(schedule.ranks),
        threads: 1,
        cores: available_cores(),
    };
    let report = encode_report(
        &record.losses,
        &record.compute,
        &record.messages,
        record.time(),
        record.comm_wait,
    );
    let stamp = |src: usize| Stamp::chunk(step, Class::Losses, 0, src, 0);
    for dst in (0..schedule.ranks).filter(|&d| d != rank) {
        if let Err(err) = endpoint.send(dst, stamp(rank), report.clone()) {
            return Err(collective_error(
                endpoint,
                "loss reduction",
                dst,
                options.recv_timeout,
                err,
            ));
        }
    }
    for src in 0..schedule.ranks {
        let (losses_of, compute, messages, time, comm_wait) = if src == rank {
            (
                record.losses.clone(),
                record.compute.clone(),
                record.messages.clone(),
                record.time(),
                record.comm_wait,
            )
        } else {
            let deadline = Instant::now() + options.recv_timeout;
            let what = format!("the losses and timeline of rank {src} (step {step})");
            let tensors = match endpoint.take(stamp(src), deadline) {
                Ok((_, tensors)) => tensors,
                Err(err) => {
                    return Err(collective_error(
                        endpoint,
                        &what,
                        src,
                        options.recv_timeout,
                        err,
                    ))
                }
            };
            match decode_report(&tensors) {
                Ok(report) => report,
                Err(err) => {
                    let err = RuntimeError::Transport {
                        rank,
                        op: "loss reduction".into(),
                        message: format!("a malformed report from rank {src}: {err}"),
                    };
                    return Err(own_failure(endpoint, err));
                }
            }
        };
        losses.extend(losses_of);
        timeline.compute[src] = compute;
        timeline.messages.extend(messages);
        timeline.comm_wait[src] = comm_wait;
        rank_times.ranks.push(time);
    }
    losses.sort_by_key(|l: &MicroBatchLoss| l.global_mb);
    Ok(StepOutcome {
        losses,
        timeline,
        wall_seconds,
        rank_times,
    })
}

/// Sums the gradients of every DualPipe stage's copies across processes, so that each copy
/// holds the same total as [`sum_stage_copies`](crate::sum_stage_copies) gives in one process
/// (same order of additions, so bit-identical).
///
/// Each copy on this rank sends its gradient snapshot to the rank of every other copy of its
/// stage, then adds the other copies' snapshots in direction order. Stages with one copy are
/// left alone; single-direction schedules exchange nothing. Call it on every rank after
/// [`run_rank_step`] with the same `step`.
pub fn sum_stage_copies_remote<S: WireStage, L: Link>(
    placement: &StagePlacement,
    stages: &mut RankStages<S>,
    endpoint: &mut Endpoint<L>,
    step: u64,
    timeout: Duration,
) -> Result<(), RuntimeError> {
    let rank = endpoint.rank();
    let mine: Vec<(usize, usize)> = stages.iter().map(|(key, _)| key).collect();
    let stamp = |dir: usize, stage: usize| Stamp::chunk(step, Class::Gradients, dir, stage, 0);
    // 1. Snapshot every copy that has a partner, send it where the partners live.
    let mut snapshots: Snapshots<S::Tensor> = Vec::new();
    for &(dir, stage) in &mine {
        let partners: Vec<usize> = (0..placement.dirs())
            .filter(|&d| d != dir)
            .map(|d| placement.rank(d, stage))
            .collect();
        if partners.is_empty() {
            continue;
        }
        let op = format!("gradients (dir {dir}, stage {stage})");
        let copy = stages
            .get(dir, stage)
            .ok_or_else(|| RuntimeError::Setup(format!("rank {rank} lost its stage {op}")))?;
        let snapshot =
            guarded(rank, &op, || Ok(copy.gradients())).map_err(|e| own_failure(endpoint, e))?;
        let remote: Vec<usize> = partners.into_iter().filter(|&r| r != rank).collect();
        if !remote.is_empty() {
            let wire = guarded(rank, &op, || Ok(copy.gradients()))
                .map_err(|e| own_failure(endpoint, e))?
                .into_iter()
                .map(S::tensor_to_wire)
                .collect::<Result<Vec<_>, _>>();
            let wire = match wire {
                Ok(wire) => wire,
                Err(e) => {
                    let err = RuntimeError::Transport {
                        rank,
                        op,
                        message: format!("cannot encode a gradient: {e}"),
                    };
                    return Err(own_failure(endpoint, err));
                }
            };
            for dst in remote {
                if let Err(err) = endpoint.send(dst, stamp(dir, stage), wire.clone()) {
                    return Err(collective_error(endpoint, &op, dst, timeout, err));
                }
            }
        }
        snapshots.push(((dir, stage), snapshot));
    }
    // 2. Add the other copies in direction order (the order sum_stage_copies uses).
    for &(dir, stage) in &mine {
        for other in (0..placement.dirs()).filter(|&d| d != dir) {
            let other_rank = placement.rank(other, stage);
            let what =
                format!("the gradients of (dir {other}, stage {stage}) from rank {other_rank}");
            let received;
            let snapshot: &[S::Tensor] = if other_rank == rank {
                match snapshots.iter().find(|(key, _)| *key == (other, stage)) {
                    Some((_, s)) => s,
                    None => {
                        let err = RuntimeError::Setup(format!(
                            "rank {rank} has no stage for (dir {other}, stage {stage}), which the \
                             placement puts here"
                        ));
                        return Err(own_failure(endpoint, err));
                    }
                }
            } else {
                let deadline = Instant::now() + timeout;
                let tensors = match endpoint.take(stamp(other, stage), deadline) {
                    Ok((_, tensors)) => tensors,
                    Err(err) => {
                        return Err(collective_error(endpoint, &what, other_rank, timeout, err))
                    }
                };
                received = match tensors
                    .into_iter()
                    .map(S::tensor_from_wire)
                    .collect::<Result<Vec<_>, _>>()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let err = RuntimeError::Transport {
                            rank,
                            op: what,
                            message: format!("cannot decode a gradient: {e}"),
                        };
                        return Err(own_failure(endpoint, err));
                    }
                };
                &received
            };
            let op = format!("add_gradients (dir {dir}, stage {stage})");
            let copy = match stages.get_mut(dir, stage) {
                Some(copy) => copy,
                None => {
                    return Err(RuntimeError::Setup(format!(
                        "rank {rank} lost its stage {op}"
                    )))
                }
            };
            if let Err(err) = guarded(rank, &op, || copy.add_gradients(snapshot).map_err(|e| e.0)) {
                return Err(own_failure(endpoint, err));
            }
        }
    }
    Ok(())
}

/// Gradient snapshots of this rank's stage copies, keyed by (dir, stage).
type Snapshots<T> = Vec<((usize, usize), Vec<T>)>;

/// Waits until every rank of the world has called `barrier` for `step` (or one failed).
pub fn barrier<L: Link>(
    endpoint: &mut Endpoint<L>,
    step: u64,
    timeout: Duration,
) -> Result<(), RuntimeError> {
    let rank = endpoint.rank();
    let ranks = endpoint.ranks();
    let stamp = |src: usize| Stamp::chunk(step, Class::Barrier, 0, src, 0);
    for dst in (0..ranks).filter(|&d| d != rank) {
        if let Err(err) = endpoint.send(dst, stamp(rank), Vec::new()) {
            return Err(collective_error(endpoint, "barrier", dst, timeout, err));
        }
    }
    for src in (0..ranks).filter(|&s| s != rank) {
        let deadline = Instant::now() + timeout;
        if let Err(err) = endpoint.take(stamp(src), deadline) {
            let what = format!("rank {src} at the barrier of step {step}");
            return Err(collective_error(endpoint, &what, src, timeout, err));
        }
    }
    match endpoint.flush(Instant::now() + timeout) {
        Ok(_) => Ok(()),
        Err(err) => Err(collective_error(endpoint, "barrier", rank, timeout, err)),
    }
}

/// Every rank's `data` on every rank, in rank order (this rank's own at its place): the
/// all-gather of small values (a gradient norm's parts, a model's weights for evaluation).
/// `round` tells apart several gathers of one step; every rank calls it with the same `step`
/// and `round`.
pub fn all_gather<L: Link>(
    endpoint: &mut Endpoint<L>,
    step: u64,
    round: usize,
    data: Vec<WireData>,
    timeout: Duration,
) -> Result<Vec<Vec<WireData>>, RuntimeError> {
    let rank = endpoint.rank();
    let ranks = endpoint.ranks();
    let stamp = |src: usize| Stamp::chunk(step, Class::Gather, round, src, 0);
    for dst in (0..ranks).filter(|&d| d != rank) {
        if let Err(err) = endpoint.send(dst, stamp(rank), data.clone()) {
            return Err(collective_error(endpoint, "all-gather", dst, timeout, err));
        }
    }
    let mut parts = Vec::with_capacity(ranks);
    for src in 0..ranks {
        if src == rank {
            parts.push(data.clone());
            continue;
        }
        let deadline = Instant::now() + timeout;
        match endpoint.take(stamp(src), deadline) {
            Ok((_, tensors)) => parts.push(tensors),
            Err(err) => {
                let what = format!("rank {src}'s part of all-gather {round} of step {step}");
                return Err(collective_error(endpoint, &what, src, timeout, err));
            }
        }
    }
    Ok(parts)
}

/// Runs a stage call, turning an error or a panic into a [`RuntimeError`].
fn guarded<R>(
    rank: usize,
    op: &str,
    call: impl FnOnce() -> Result<R, String>,
) -> Result<R, RuntimeError> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(cause)) => Err(RuntimeError::StageFailed {
            rank,
            op: op.to_string(),
            cause,
        }),
        Err(payload) => Err(RuntimeError::StagePanicked {
            rank,
            op: op.to_string(),
            message: panic_message(payload.as_ref()),
        }),
    }
}
