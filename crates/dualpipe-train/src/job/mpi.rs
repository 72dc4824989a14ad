//! One process of a job under an MPI launcher (`mpirun`, `mpiexec`, `srun`): this module
//! decides its life: which process reports, and how a failing one leaves the job.
//!
//! Rank and world size come from MPI and the launcher's variables; a world that does not
//! match the grid, or a process started without a launcher, is one clear usage error (said by
//! rank 0 only). Every process trains its own stages; rank 0 reports. A process that fails
//! tells the others, which stop at once naming it; every failing process exits non-zero
//! ([`Failure::exit_code`]) without `MPI_Finalize`, after [`LINGER`], so `mpirun` does too.

use std::time::Duration;

use dualpipe_runtime::transport::mpi::MpiWorld;
use dualpipe_runtime::RuntimeError;
use dualpipe_schedule::Schedule;

use super::{Failure, Finished, How, JobConfig};
use crate::checkpoint::{Checkpointing, WriteScope};
use crate::job::process_grid::{
    check_checkpoints, check_grid, checkpoint_share, mpi_trainer, restore_agreed,
};
use crate::job::watch::{Watch, WatchError, WatchPlan};
use crate::{Driver, StepEvent, TrainError, Trainer};

/// How long a failing process waits before it exits, so that the others read the failure
/// notice and say so before the launcher, seeing a process exit non-zero, ends the whole job.
pub const LINGER: Duration = Duration::from_millis(500);

/// Runs this process's part of the job's grid (on `given`, a schedule read from a file, when
/// set), as the local job runs them all: `Some` on rank 0, which reports. A failure after MPI
/// started ends the process here (it says its error through `say` unless another process
/// says it); an `Err` is a failure every process meets alike (a bad configuration, no MPI, a
/// diverged loss), to report as usual.
pub(super) fn run_rank<W: Watch>(
    job: &JobConfig,
    given: Option<Schedule>,
    start: impl FnOnce(WatchPlan<'_>, &mut dyn FnMut(&str)) -> Result<W, WatchError>,
    say: &mut dyn FnMut(&str),
) -> Result<Option<Finished>, Failure> {
    let config = &job.train;
    let naming = job.naming;
    let injection = job.inject_failure;
    let mut world = MpiWorld::init().map_err(|e| Failure::error(Some("cannot start MPI"), &e))?;
    let info = world.info().clone();
    let checkpointing = job.checkpoint.dir.is_some() || job.checkpoint.resuming();
    let checked = check_grid(&info, config).and_then(|()| check_checkpoints(config, checkpointing));
    if let Err(err) = checked {
        // Every process sees the same world; rank 0 says it once, the others leave quietly
        // after it (a launcher ends the job when the first process exits non-zero).
        if info.rank == 0 {
            exit_now(&Failure::setup(err, naming), Duration::ZERO, say);
        }
        std::thread::sleep(LINGER);
        std::process::exit(2);
    }
    if !job.observe.quiet {
        // The pid lets a launcher's report of a lost process (MPICH's names its PID) be read
        // as the rank it was.
        say(&format!(
            "dualpipe train: MPI transport, {info}, pid {}",
            std::process::id()
        ));
    }
    let rank = info.rank;
    if rank == 0 {
        job.say_compression_warmup(say);
    }
    let mut trainer = match mpi_trainer(&world, config, given) {
        Ok(trainer) => trainer,
        Err(err) => refuse(world, rank, told(err, |e| Failure::setup(e, naming)), say),
    };
    let mut watch = match job.start_watch(trainer.schedule(), rank, rank == 0, start, say) {
        Ok(watch) => watch,
        Err(failure) => leave(world, failure, say),
    };
    let on_saved = watch.on_checkpoint();
    let checkpoints = match mpi_checkpoints(job, &world, &mut trainer, on_saved, say) {
        Ok(checkpoints) => checkpoints,
        Err(failure) => refuse(world, rank, failure, say),
    };
    // From here a peer on this machine that ends is named at once (MPICH's launcher
    // names only a PID); every process reaches its end through a barrier or `leave`.
    world.watch_peers();
    // SIGTERM (Slurm's warning before preemption or the time limit, `scancel`), SIGINT and
    // SIGHUP stop every process at one step boundary, agreed before each step, with a final
    // checkpoint; a second signal ends the process at once.
    dualpipe_io::defer_signals();
    trainer.set_stop(crate::StopRequest::new(dualpipe_io::interrupted, false));
    let result = trainer.run(|event| {
        if let (StepEvent::Starting { step }, Some(at)) = (event, injection) {
            if at.rank == rank && at.step == step + 1 {
                let s = at.step;
                match at.how {
                    How::Error => return Err(format!("rank {rank}: injected failure at step {s}")),
                    How::Exit => std::process::exit(3),
                    How::Abort => std::process::abort(),
                }
            }
        }
        watch.on_event(event)
    });
    watch.finish();
    let summary = match result {
        Ok(summary) => summary,
        // Every rank computes the same losses, so every rank sees the divergence.
        Err(err @ TrainError::Diverged(_)) => return Err(Failure::training(err, config, naming)),
        Err(TrainError::Interrupted { step, signal }) => {
            interrupted(job, world, trainer, checkpoints, (step, signal), say)
        }
        Err(err @ TrainError::Stopped(_)) => {
            leave(world, told(err, |e| Failure::error(None, &e)), say)
        }
        Err(err) => {
            let context = format!("rank {rank}: training failed");
            leave(
                world,
                told(err, |e| Failure::error(Some(&context), &e)),
                say,
            )
        }
    };
    // The last checkpoint is published before the summary (process 0 waits for every
    // part).
    trainer.clear_checkpoints();
    let tell = rank == 0 && !job.observe.quiet;
    if let Err(failure) = job.finish_checkpoints(checkpoints, tell, say) {
        leave(world, failure, say);
    }
    // Every rank takes part in gathering the weights to save; rank 0 writes them.
    let finished = match job.finished(&mut trainer, summary) {
        Ok(finished) => finished,
        Err(err) => leave(world, told(err, |e| job.unsaved(e)), say),
    };
    drop(trainer);
    drop(world);
    Ok((rank == 0).then_some(finished))
}

/// Restores `trainer` from the checkpoint the job resumes (process 0 chooses it, saying which
/// damaged ones it skipped; every process reads only its layers) and starts this process's
/// writer of the checkpoint directory's shares. Collective: every process calls it. A failure
/// on process 0 is its error; the others get a usage error to leave quietly by.
fn mpi_checkpoints<D: Driver>(
    job: &JobConfig,
    world: &MpiWorld,
    trainer: &mut Trainer<D>,
    on_saved: Option<crate::checkpoint::OnSaved>,
    say: &mut dyn FnMut(&str),
) -> Result<Checkpointing, Failure> {
    let rank = world.info().rank;
    let mut resumed = None;
    if job.checkpoint.resuming() {
        let chosen = match rank {
            0 => job
                .resume_checkpoint(say)
                .and_then(|c| {
                    if let Some(c) = &c {
                        job.check_resumed_settings(c)?;
                    }
                    Ok(c)
                })
                .map_err(|f| TrainError::Config(f.message)),
            _ => Ok(None),
        };
        let source = match &job.checkpoint.resume {
            super::Resume::From(path) => Some(path.as_path()),
            _ => job.checkpoint.dir.as_deref(),
        };
        let restored = restore_agreed(world, trainer, chosen, source)
            .map_err(|e| told(e, |e| Failure::setup(e, job.naming)))?;
        if let Some((checkpoint, restored)) = restored.filter(|_| rank == 0) {
            resumed = Some(checkpoint.manifest.run.clone());
            job.say_resumed(&checkpoint, &restored, say);
        }
    }
    if job.checkpoint.dir.is_none() {
        return Ok(Checkpointing::default());
    }
    let share = checkpoint_share(world);
    let checkpoints = job.checkpointing(WriteScope::Shared(share), on_saved, resumed, say)?;
    if let Some(sink) = checkpoints.writer().and_then(|w| w.sink()) {
        trainer.set_checkpoints(sink);
    }
    Ok(checkpoints)
}

/// Ends every process of a run a signal stopped at the boundary after `at.0` steps (the same
/// on every process), signal `at.1`: the final checkpoint published (process 0 waits for every
/// share), the peers lined up (no process ends while another still watches it), then process
/// 0 says where the run stopped and every process exits `128 + signal`, as a process that
/// signal ended would (Slurm requeues a preempted job whatever its code).
fn interrupted<D: Driver>(
    job: &JobConfig,
    world: MpiWorld,
    mut trainer: Trainer<D>,
    checkpoints: Checkpointing,
    at: (usize, i32),
    say: &mut dyn FnMut(&str),
) -> ! {
    let rank = world.info().rank;
    trainer.clear_checkpoints();
    if let Err(failure) = job.finish_checkpoints(checkpoints, rank == 0 && !job.observe.quiet, say)
    {
        leave(world, failure, say);
    }
    drop(trainer);
    // Disarms the peer watch, waits at a barrier, finalises MPI.
    drop(world);
    let failure = job.interrupted(at.0, at.1);
    if rank == 0 {
        say(&format!("error: {}", failure.message));
    }
    std::process::exit(i32::from(failure.exit_code()))
}

/// `failure(err)`, or, when `err` tells of another process's failure, that process's words
/// alone ("rank 1: stopped because rank 2 failed: <rank 2's error>" says it all).
fn told(err: TrainError, failure: impl FnOnce(TrainError) -> Failure) -> Failure {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(c) = cause {
        let peer = match c.downcast_ref::<TrainError>() {
            Some(TrainError::Runtime(e @ RuntimeError::PeerFailed { .. })) => Some(e),
            _ => c
                .downcast_ref::<RuntimeError>()
                .filter(|e| matches!(e, RuntimeError::PeerFailed { .. })),
        };
        if let Some(peer) = peer {
            return Failure::run(peer.to_string());
        }
        cause = c.source();
    }
    failure(err)
}

/// Leaves after a refusal every process meets alike (a configuration, a checkpoint): rank 0
/// says it, the others leave quietly after it; any other failure is [`leave`]'s.
fn refuse(world: MpiWorld, rank: usize, failure: Failure, say: &mut dyn FnMut(&str)) -> ! {
    if rank != 0 && failure.usage {
        std::mem::forget(world);
        std::thread::sleep(LINGER);
        std::process::exit(2);
    }
    leave(world, failure, say)
}

/// Leaves the job after a failure: says the error in one piece (the processes share the
/// terminal) and exits non-zero without `MPI_Finalize`, which could wait for a peer that will
/// never answer, after [`LINGER`].
fn leave(world: MpiWorld, failure: Failure, say: &mut dyn FnMut(&str)) -> ! {
    // The peers are told of this failure (or told us of theirs): their ending is no news.
    world.stop_watching();
    std::mem::forget(world);
    exit_now(&failure, LINGER, say)
}

/// Says `failure` as `main` would, waits `linger`, and exits with its code.
fn exit_now(failure: &Failure, linger: Duration, say: &mut dyn FnMut(&str)) -> ! {
    say(&format!("error: {}", failure.message));
    std::thread::sleep(linger);
    std::process::exit(i32::from(failure.exit_code()))
}
