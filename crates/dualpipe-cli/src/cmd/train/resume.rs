//! `dualpipe train`'s checkpoint flags: the checkpoint to resume from (damaged ones reported
//! and skipped), the background writer, and its closing note. The checkpoints themselves are
//! `dualpipe_train::checkpoint`'s.

use dualpipe_train::checkpoint::{self, CheckpointOptions, DEFAULT_EVERY};
use dualpipe_train::{Checkpoint, CheckpointWriter, Restored, TrainConfig};

use super::{Args, Transport};
use crate::cmd::UsageError;

/// Refuses the checkpoint flags where they are not supported yet.
pub fn check(args: &Args, config: &TrainConfig) -> Result<(), UsageError> {
    let asked = args.checkpoint_dir.is_some() || args.resume || args.resume_from.is_some();
    if asked && config.moe.is_some() {
        // The routers' selection biases are model state outside the parameters; a resume
        // without them would not continue the run bit for bit.
        return Err(UsageError(
            "--checkpoint-dir, --resume and --resume-from do not save the MoE routers' \
             selection biases yet; train the MoE model without them (--save keeps its final \
             weights)"
                .into(),
        ));
    }
    if asked && args.transport == Transport::Mpi {
        return Err(UsageError(
            "--checkpoint-dir, --resume and --resume-from work with --transport local for now; \
             drop them under --transport mpi"
                .into(),
        ));
    }
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

/// The writer `--checkpoint-dir` asks for, expecting `parts` parts per checkpoint.
pub fn writer(args: &Args, parts: usize) -> anyhow::Result<Option<CheckpointWriter>> {
    let Some(dir) = &args.checkpoint_dir else {
        return Ok(None);
    };
    let options = CheckpointOptions {
        dir: dir.clone(),
        every: args.checkpoint_every.unwrap_or(DEFAULT_EVERY),
        keep: args.keep_checkpoints,
    };
    let writer = CheckpointWriter::start(&options, parts).map_err(|e| UsageError(e.to_string()))?;
    Ok(Some(writer))
}

/// Waits for the writer's queued checkpoints; a note of what it saved unless `--quiet`.
pub fn finish(args: &Args, writer: Option<CheckpointWriter>) -> anyhow::Result<()> {
    let Some(writer) = writer else {
        return Ok(());
    };
    let saved = writer.finish()?;
    if let Some(last) = saved.last().filter(|_| !args.observe.quiet) {
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
