//! `dualpipe train`'s checkpoint flags: the checkpoint `--resume` or `--resume-from` asks
//! for (and the notes that tell of it), and the [`CheckpointOptions`] of `--checkpoint-dir`.
//! The checkpoints themselves are [`checkpoint`]'s.

use super::{Failure, TrainArgs};
use crate::checkpoint::{self, Checkpoint, CheckpointOptions, Found, DEFAULT_EVERY};
use crate::{Restored, TrainError};

impl TrainArgs {
    /// The checkpoint `--resume` or `--resume-from` asks for, with why each damaged newer one
    /// was skipped. `None`: a fresh run (neither flag, or `--resume` on a directory that
    /// holds no checkpoint yet). A path that cannot be used is a [`TrainError::Config`].
    pub fn resume_point(&self) -> Result<Option<Found>, TrainError> {
        let bad =
            |flag: &str, e: checkpoint::CheckpointError| TrainError::Config(format!("{flag}: {e}"));
        if let Some(path) = &self.resume_from {
            return checkpoint::open(path)
                .map(Some)
                .map_err(|e| bad("--resume-from", e));
        }
        let Some(dir) = self.checkpoint_dir.as_ref().filter(|_| self.resume) else {
            return Ok(None);
        };
        if !dir.is_dir() {
            return Err(TrainError::Config(format!(
                "--resume: the checkpoint directory {} does not exist; drop --resume for a \
                 fresh run, or give the --checkpoint-dir of an earlier one",
                dir.display()
            )));
        }
        checkpoint::find_latest(dir).map_err(|e| bad("--resume", e))
    }

    /// What `--checkpoint-dir`, `--checkpoint-every` and `--keep-checkpoints` ask for
    /// (`None`: no checkpoints).
    pub fn checkpoint_options(&self) -> Option<CheckpointOptions> {
        Some(CheckpointOptions {
            dir: self.checkpoint_dir.clone()?,
            every: self.checkpoint_every.unwrap_or(DEFAULT_EVERY),
            keep: self.keep_checkpoints,
        })
    }

    /// The checkpoint to resume from ([`TrainArgs::resume_point`]), telling `say` of each
    /// damaged newer one skipped, and (unless `--quiet`) that `--resume` found none yet.
    pub fn resume_checkpoint(
        &self,
        say: &mut dyn FnMut(&str),
    ) -> Result<Option<Checkpoint>, Failure> {
        let Some(found) = self.resume_point()? else {
            if self.resume && !self.observe.quiet {
                say("--resume: no checkpoint yet; starting at step 1");
            }
            return Ok(None);
        };
        for skipped in &found.skipped {
            say(&format!(
                "warning: {skipped}; using the previous checkpoint"
            ));
        }
        Ok(Some(found.checkpoint))
    }

    /// Tells `say` where the run continues from (unless `--quiet`).
    pub fn say_resumed(
        &self,
        checkpoint: &Checkpoint,
        restored: &Restored,
        say: &mut dyn FnMut(&str),
    ) {
        if self.observe.quiet {
            return;
        }
        say(&format!(
            "resuming from {} (step {} done)",
            checkpoint.path.display(),
            restored.step
        ));
        if let Some(from) = restored.feedback_regrouped_from {
            say(&format!(
                "note: the gradient compression's error feedback of {from} replicas carried \
                 over to {} (worker residuals averaged, the averaged buckets' residuals \
                 re-split)",
                self.data_parallel
            ));
        }
        if restored.feedback_dropped {
            say(
                "note: the grid changed, so the gradient compression's error feedback starts \
                 from zeros",
            );
        }
    }

    /// Tells `say` of 1-bit Adam's warm-up when it is the default one (unless `--quiet`), so
    /// a user who passed only `--gradient-compression 1bit` knows why the first steps send
    /// every byte.
    pub fn say_compression_warmup(&self, config: &crate::TrainConfig, say: &mut dyn FnMut(&str)) {
        if self.observe.quiet || config.compression_warmup.is_some() {
            return;
        }
        if let Some(warmup) = config.one_bit_adam_from() {
            say(&format!(
                "1-bit Adam: steps 1-{warmup} of {} exchange uncompressed gradients (the \
                 default warm-up, {:.0}% of the steps), then the momentum in 1 bit with \
                 AdamW's variance frozen; --compression-warmup N sets it, 0 compresses the \
                 gradient from the first step",
                config.steps,
                100.0 * crate::config::ONE_BIT_ADAM_WARMUP_SHARE
            ));
        }
    }
}
