//! `dualpipe train`'s checkpoint flags: the checkpoint to resume from (damaged ones reported
//! and skipped), the background writer, and its closing note. The checkpoints themselves are
//! `dualpipe_train::checkpoint`'s.

use dualpipe_train::checkpoint::{self, CheckpointOptions, Layout, OnSaved, DEFAULT_EVERY};
use dualpipe_train::{Checkpoint, CheckpointWriter, Restored, TrainConfig};

use super::Args;
use crate::cmd::UsageError;

/// Refuses checkpoint flags that make no sense (an interval of 0).
pub fn check(args: &Args, _config: &TrainConfig) -> Result<(), UsageError> {
    if args.checkpoint_every == Some(0) {
        return Err(UsageError(
            "--checkpoint-every 0: give a positive number of steps, such as 500".into(),
        ));
    }
    Ok(())
}

/// The checkpoint `--resume` or `--resume-from` asks for (`None`: a fresh run), each damaged
/// newer checkpoint reported on stderr.
pub fn point(args: &Args) -> Result<Option<Checkpoint>, UsageError> {
    if !args.resume && args.resume_from.is_none() {
        return Ok(None);
    }
    let bad = |flag: &str, e: checkpoint::CheckpointError| UsageError(format!("{flag}: {e}"));
    let found = if let Some(path) = &args.resume_from {
        Some(checkpoint::open(path).map_err(|e| bad("--resume-from", e))?)
    } else {
        let Some(dir) = &args.checkpoint_dir else {
            return Ok(None);
        };
        if !dir.is_dir() {
            return Err(UsageError(format!(
                "--resume: the checkpoint directory {} does not exist; drop --resume for a \
                 fresh run, or give the --checkpoint-dir of an earlier one",
                dir.display()
            )));
        }
        checkpoint::find_latest(dir).map_err(|e| bad("--resume", e))?
    };
    let Some(found) = found else {
        if !args.observe.quiet {
            eprintln!("--resume: no checkpoint yet; starting at step 1");
        }
        return Ok(None);
    };
    for skipped in &found.skipped {
        eprintln!("warning: {skipped}; using the previous checkpoint");
    }
    Ok(Some(found.checkpoint))
}

/// Tells where the run continues from.
pub fn note(args: &Args, checkpoint: &Checkpoint, restored: &Restored) {
    if args.observe.quiet {
        return;
    }
    eprintln!(
        "resuming from {} (step {} done)",
        checkpoint.path.display(),
        restored.step
    );
    if restored.feedback_dropped {
        eprintln!(
            "note: the grid changed, so the gradient compression's error feedback starts from \
             zeros"
        );
    }
}

/// The writer `--checkpoint-dir` asks for, expecting `parts` parts per checkpoint and
/// telling `on_saved` of each it saved.
pub fn writer(
    args: &Args,
    parts: usize,
    on_saved: Option<OnSaved>,
) -> anyhow::Result<Option<CheckpointWriter>> {
    writer_of(args, Layout::Whole { parts }, on_saved)
}

/// The writer `--checkpoint-dir` asks for, writing `layout`.
fn writer_of(
    args: &Args,
    layout: Layout,
    on_saved: Option<OnSaved>,
) -> anyhow::Result<Option<CheckpointWriter>> {
    let Some(dir) = &args.checkpoint_dir else {
        return Ok(None);
    };
    let options = CheckpointOptions {
        dir: dir.clone(),
        every: args.checkpoint_every.unwrap_or(DEFAULT_EVERY),
        keep: args.keep_checkpoints,
    };
    let writer = CheckpointWriter::start_with(&options, layout, on_saved)
        .map_err(|e| UsageError(e.to_string()))?;
    Ok(Some(writer))
}

/// Under `--transport mpi`: restores `trainer` from the checkpoint `--resume` or
/// `--resume-from` asks for (process 0 chooses it, reporting damaged ones; every process
/// reads only its layers) and starts this process's writer of `--checkpoint-dir`'s shares.
/// Collective: every process calls it. A failure on process 0 is its error; the others get
/// a usage error to leave quietly by.
#[cfg(feature = "mpi")]
pub fn mpi_setup<D: dualpipe_train::Driver>(
    args: &Args,
    world: &dualpipe_runtime::transport::mpi::MpiWorld,
    trainer: &mut dualpipe_train::Trainer<D>,
    on_saved: Option<OnSaved>,
) -> anyhow::Result<Option<CheckpointWriter>> {
    use dualpipe_train::mpi::{agree_resume, checkpoint_share, read_share, ResumeChoice};
    let rank = world.info().rank;
    if args.resume || args.resume_from.is_some() {
        let (mine, choice) = if rank == 0 {
            match point(args) {
                Ok(Some(c)) => {
                    let step = c.state.step;
                    (Ok(Some(c)), ResumeChoice::Step(step))
                }
                Ok(None) => (Ok(None), ResumeChoice::Fresh),
                Err(e) => (Err(e), ResumeChoice::Failed),
            }
        } else {
            (Ok(None), ResumeChoice::Fresh)
        };
        let agreed = agree_resume(world, choice);
        let checkpoint = match (mine?, agreed) {
            (Some(c), _) => Some(c),
            (None, ResumeChoice::Step(step)) => {
                let Some(path) = args.resume_from.as_ref().or(args.checkpoint_dir.as_ref()) else {
                    return Ok(None);
                };
                Some(read_share(trainer, path, step).map_err(super::setup_error)?)
            }
            (None, ResumeChoice::Fresh) => None,
            (None, ResumeChoice::Failed) => {
                return Err(UsageError("process 0 could not open the checkpoint".into()).into())
            }
        };
        if let Some(checkpoint) = &checkpoint {
            let restored = trainer.restore(checkpoint).map_err(super::setup_error)?;
            if rank == 0 {
                note(args, checkpoint, &restored);
            }
        }
    }
    if args.checkpoint_dir.is_none() {
        return Ok(None);
    }
    let writer = writer_of(args, Layout::Shared(checkpoint_share(world)), on_saved)?;
    if let Some(sink) = writer.as_ref().and_then(CheckpointWriter::sink) {
        trainer.set_checkpoints(sink);
    }
    Ok(writer)
}

/// Waits for the writer's queued checkpoints; a note of what it saved unless `--quiet`.
pub fn finish(args: &Args, writer: Option<CheckpointWriter>) -> anyhow::Result<()> {
    finish_saying(writer, !args.observe.quiet)
}

/// Waits for the writer's queued checkpoints; a note of what it saved when `say`.
pub fn finish_saying(writer: Option<CheckpointWriter>, say: bool) -> anyhow::Result<()> {
    let Some(writer) = writer else {
        return Ok(());
    };
    let saved = writer.finish()?;
    if let Some(last) = saved.last().filter(|_| say) {
        let seconds: f64 = saved.iter().map(|s| s.seconds).sum();
        eprintln!(
            "saved {} checkpoint(s), the last {} ({} bytes; {:.1} ms each on the writer thread)",
            saved.len(),
            last.path.display(),
            last.bytes,
            1e3 * seconds / saved.len() as f64
        );
    }
    Ok(())
}
