//! `dualpipe train --transport mpi`: this process is one pipeline rank of a run started by
//! `mpirun`, `mpiexec` or `srun`.
//!
//! Rank and world size come from MPI and the launcher's variables; a world that does not
//! match `--ranks`, or a process started without a launcher, is one clear usage error (printed
//! by rank 0 only). Every rank trains its own stages ([`RankTrainer`]); rank 0 prints the
//! summary. A rank that fails tells the others, which stop at once naming it; every failing
//! process exits non-zero, so `mpirun` does too.

use std::time::Duration;

use anyhow::Context;
use dualpipe_runtime::transport::mpi::MpiWorld;
use dualpipe_runtime::RuntimeError;
use dualpipe_schedule::Schedule;
use dualpipe_train::cli::{How, Injection, TrainArgs};
use dualpipe_train::{StepEvent, TrainConfig, TrainError};

use super::observe::Observe;
use super::{finished, run_error, setup_error, Finished};
use crate::cmd::UsageError;

/// Runs this process's rank; `Some(summary)` on rank 0.
/// `given`: the schedule of `--schedule-file`, else the configuration's generated one.
pub(super) fn execute(
    args: &TrainArgs,
    config: TrainConfig,
    given: Option<Schedule>,
) -> anyhow::Result<Option<Finished>> {
    let injection = args
        .inject_failure
        .as_deref()
        .map(Injection::parse)
        .transpose()
        .map_err(UsageError::from)?;
    let mut world = MpiWorld::init().context("cannot start MPI")?;
    let info = world.info().clone();
    let grid = dualpipe_train::mpi::check_grid(&info, &config);
    if let Err(err) = grid {
        // Every process sees the same world; rank 0 says it once, the others leave quietly
        // after it (a launcher ends the job when the first process exits non-zero).
        if info.rank == 0 {
            exit_now(&setup_error(err), Duration::ZERO);
        }
        std::thread::sleep(Duration::from_millis(500));
        std::process::exit(2);
    }
    if !args.observe.quiet {
        // One write: launchers that tag each write with its rank would split the line.
        use std::io::Write;
        // The pid lets a launcher's report of a lost process (MPICH's names its PID) be read
        // as the rank it was.
        let line = format!(
            "dualpipe train: MPI transport, {info}, pid {}\n",
            std::process::id()
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
    let rank = info.rank;
    let built = dualpipe_train::mpi::mpi_trainer(&world, &config, given);
    let mut trainer = match built {
        Ok(trainer) => trainer,
        Err(err) => {
            let err = setup_error(err);
            if rank != 0 && err.downcast_ref::<UsageError>().is_some() {
                // Every rank refuses the same configuration; rank 0 says it once.
                std::mem::forget(world);
                std::thread::sleep(LINGER);
                std::process::exit(2);
            }
            leave_after_failure(world, err)
        }
    };
    let mut observe =
        match Observe::start(&args.observe, &config, trainer.schedule(), rank, rank == 0) {
            Ok(observe) => observe,
            Err(err) => leave_after_failure(world, err),
        };
    let on_saved = observe.on_checkpoint();
    let writer = match super::resume::mpi_setup(args, &world, &mut trainer, on_saved) {
        Ok(writer) => writer,
        Err(err) if rank != 0 && err.downcast_ref::<UsageError>().is_some() => {
            // Process 0 reports the checkpoint's problem once.
            std::mem::forget(world);
            std::thread::sleep(LINGER);
            std::process::exit(2);
        }
        Err(err) => leave_after_failure(world, err),
    };
    // From here a peer on this machine that ends is named at once (MPICH's launcher names
    // only a PID); every process reaches its end through a barrier or `leave_after_failure`.
    world.watch_peers();
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
        observe.on_event(event)
    });
    observe.finish();
    let summary = match result {
        Ok(summary) => summary,
        // Every rank computes the same losses, so every rank sees the divergence.
        Err(err @ TrainError::Diverged(_)) => return Err(run_error(err, &config)),
        Err(err @ TrainError::Stopped(_)) => leave_after_failure(world, err.into()),
        Err(err) => {
            let err = anyhow::Error::new(err).context(format!("rank {rank}: training failed"));
            leave_after_failure(world, err)
        }
    };
    // The last checkpoint is published before the summary (process 0 waits for every part).
    trainer.clear_checkpoints();
    let say = rank == 0 && !args.observe.quiet;
    if let Err(err) = super::resume::finish_saying(writer, say) {
        leave_after_failure(world, err);
    }
    // Every rank takes part in gathering the weights for --save; rank 0 writes them.
    let finished = match finished(args, &mut trainer, summary) {
        Ok(finished) => finished,
        Err(err) => leave_after_failure(world, err),
    };
    drop(trainer);
    drop(world);
    Ok((rank == 0).then_some(finished))
}

/// How long a failing process waits before it exits (see [`leave_after_failure`]).
const LINGER: Duration = Duration::from_millis(500);

/// Leaves the job after a failure: prints the error in one piece (the processes share the
/// terminal) and exits non-zero without `MPI_Finalize`, which could wait for a peer that will
/// never answer. Every rank then lingers a moment before it exits, so that the others read
/// the failure notice and say so before the launcher, seeing a process exit non-zero, ends
/// the whole job.
fn leave_after_failure(world: MpiWorld, err: anyhow::Error) -> ! {
    let peer = err
        .chain()
        .find_map(|cause| match cause.downcast_ref::<TrainError>() {
            Some(TrainError::Runtime(e @ RuntimeError::PeerFailed { .. })) => Some(e.to_string()),
            _ => match cause.downcast_ref::<RuntimeError>() {
                Some(e @ RuntimeError::PeerFailed { .. }) => Some(e.to_string()),
                _ => None,
            },
        });
    // The peers are told of this failure (or told us of theirs): their ending is no news.
    world.stop_watching();
    std::mem::forget(world);
    match peer {
        // "rank 1: stopped because rank 2 failed: <rank 2's error>" says it all.
        Some(text) => exit_now(&anyhow::anyhow!(text), LINGER),
        None => exit_now(&err, LINGER),
    }
}

/// Prints `err` as `main` would, in a single write, waits `linger`, and exits with its code.
fn exit_now(err: &anyhow::Error, linger: Duration) -> ! {
    use std::io::Write;
    let text = format!("error: {err:#}\n");
    let _ = std::io::stderr().write_all(text.as_bytes());
    std::thread::sleep(linger);
    std::process::exit(i32::from(crate::cmd::exit_code(err)))
}
