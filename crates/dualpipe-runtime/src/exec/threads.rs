//! The local executor: one thread per rank in this process, tensors through in-process
//! channels.

use std::time::Instant;

use dualpipe_schedule::Schedule;
use dualpipe_schedule::Timeline;

use super::check::check_setup;
use super::cpu::{available_cores, RankTimes};
use super::hook::{NoHook, StepHook};
use super::types::{ExecOptions, MicroBatchLoss, RankStages, StepOutcome};
use super::worker::{RankRecord, Worker};
use crate::transport::local::{LocalTransport, Shared};
use crate::{RuntimeError, Stage};

/// Runs one step of a lowered schedule: one thread per rank, each interpreting its program
/// against its stages; messages go through in-process channels.
///
/// `ranks[r]` holds rank r's stages (see [`build_ranks`](crate::build_ranks)). Compute ops: `F` runs
/// [`Stage::forward`], `I` [`Stage::backward_input`], `W` [`Stage::backward_weight`], `B` the
/// two in a row, `FB` [`Stage::forward_backward`] (or [`Stage::forward_backward_pair`] when
/// its halves belong to two stages of the rank). `SEND_*` hands a computed tensor to the peer;
/// `RECV_*` and `WAIT` do not block: receives are posted early and a compute op waits only for
/// its own input. Adjacent stages on one rank hand over locally, without messages.
///
/// On failure (a stage error or panic, a missing message past `options.recv_timeout`) every
/// rank stops and the first failure is returned. The stages may then hold partial state of
/// the failed step: rebuild or reset them before the next one.
pub fn run_step<S: Stage>(
    schedule: &Schedule,
    ranks: &mut [RankStages<S>],
    options: &ExecOptions,
) -> Result<StepOutcome, RuntimeError> {
    run_step_with(schedule, ranks, options, &NoHook)
}

/// [`run_step`], telling `hook` on each rank's thread when a stage's gradients are final and
/// after every op (see [`StepHook`]).
pub fn run_step_with<S: Stage>(
    schedule: &Schedule,
    ranks: &mut [RankStages<S>],
    options: &ExecOptions,
    hook: &dyn StepHook<S>,
) -> Result<StepOutcome, RuntimeError> {
    check_setup(schedule, ranks)?;
    let (shared, inboxes) = Shared::<S::Tensor>::new(schedule.ranks);
    let start = Instant::now();
    let records: Vec<Option<RankRecord>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .iter_mut()
            .zip(inboxes)
            .enumerate()
            .map(|(rank, (stages, inbox))| {
                let shared = &shared;
                std::thread::Builder::new()
                    .name(format!("dualpipe-rank-{rank}"))
                    .spawn_scoped(scope, move || {
                        let transport = LocalTransport::new(rank, inbox, shared);
                        Worker::new(rank, schedule, stages, transport, options, start, hook).run()
                    })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, handle)| match handle {
                Ok(handle) => handle.join().ok().and_then(Result::ok),
                Err(err) => {
                    shared.fail(RuntimeError::Setup(format!(
                        "cannot start the thread of rank {rank}: {err}"
                    )));
                    None
                }
            })
            .collect()
    });
    let wall_seconds = start.elapsed().as_secs_f64();
    if let Some(err) = shared.take_error() {
        return Err(err);
    }
    let mut timeline = Timeline::new(schedule.ranks);
    let mut losses = Vec::new();
    let mut rank_times = RankTimes {
        ranks: Vec::with_capacity(schedule.ranks),
        threads: schedule.ranks,
        cores: available_cores(),
    };
    for (rank, record) in records.into_iter().enumerate() {
        // A rank without a record failed, and failures are recorded above.
        let record = record.ok_or_else(|| RuntimeError::Protocol {
            rank,
            op: "step".into(),
            message: "the rank stopped without a result".into(),
        })?;
        rank_times.ranks.push(record.time());
        timeline.compute[rank] = record.compute;
        timeline.messages.extend(record.messages);
        timeline.comm_wait[rank] = record.comm_wait;
        losses.extend(record.losses);
    }
    losses.sort_by_key(|l: &MicroBatchLoss| l.global_mb);
    Ok(StepOutcome {
        losses,
        timeline,
        wall_seconds,
        rank_times,
    })
}
