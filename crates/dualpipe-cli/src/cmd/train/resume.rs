//! `dualpipe train`'s checkpoints: the resume point (damaged ones reported and skipped), the
//! background writer, and its closing note. Which checkpoint and which options the flags ask
//! for is [`TrainArgs::resume_point`] / [`TrainArgs::checkpoint_options`]; the checkpoints
//! themselves are `dualpipe_train::checkpoint`'s.

use dualpipe_train::checkpoint::{Layout, OnSaved};
use dualpipe_train::cli::TrainArgs;
use dualpipe_train::{Checkpoint, CheckpointWriter, Restored};

use crate::cmd::UsageError;

/// The checkpoint `--resume` or `--resume-from` asks for (`None`: a fresh run), each damaged
/// newer checkpoint reported on stderr.
pub fn point(args: &TrainArgs) -> Result<Option<Checkpoint>, UsageError> {
    let Some(found) = args.resume_point()? else {
        if args.resume && !args.observe.quiet {
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
pub fn note(args: &TrainArgs, checkpoint: &Checkpoint, restored: &Restored) {
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
    args: &TrainArgs,
    parts: usize,
    on_saved: Option<OnSaved>,
) -> anyhow::Result<Option<CheckpointWriter>> {
    writer_of(args, Layout::Whole { parts }, on_saved)
}

/// The writer `--checkpoint-dir` asks for, writing `layout`.
fn writer_of(
    args: &TrainArgs,
    layout: Layout,
    on_saved: Option<OnSaved>,
) -> anyhow::Result<Option<CheckpointWriter>> {
    let Some(options) = args.checkpoint_options() else {
        return Ok(None);
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
    args: &TrainArgs,
    world: &dualpipe_runtime::transport::mpi::MpiWorld,
    trainer: &mut dualpipe_train::Trainer<D>,
    on_saved: Option<OnSaved>,
) -> anyhow::Result<Option<CheckpointWriter>> {
    let rank = world.info().rank;
    if args.resume || args.resume_from.is_some() {
        let chosen = match rank {
            0 => point(args).map_err(|e| dualpipe_train::TrainError::Config(e.0)),
            _ => Ok(None),
        };
        let source = args
            .resume_from
            .as_deref()
            .or(args.checkpoint_dir.as_deref());
        let restored = dualpipe_train::mpi::restore_agreed(world, trainer, chosen, source)
            .map_err(super::setup_error)?;
        if let Some((checkpoint, restored)) = restored.filter(|_| rank == 0) {
            note(args, &checkpoint, &restored);
        }
    }
    if args.checkpoint_dir.is_none() {
        return Ok(None);
    }
    let share = dualpipe_train::mpi::checkpoint_share(world);
    let writer = writer_of(args, Layout::Shared(share), on_saved)?;
    if let Some(sink) = writer.as_ref().and_then(CheckpointWriter::sink) {
        trainer.set_checkpoints(sink);
    }
    Ok(writer)
}

/// Waits for the writer's queued checkpoints; a note of what it saved unless `--quiet`.
pub fn finish(args: &TrainArgs, writer: Option<CheckpointWriter>) -> anyhow::Result<()> {
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
