//! `dualpipe train`'s checkpoint flags: the checkpoint `--resume` or `--resume-from` asks
//! for (and the notes that tell of it), and the [`CheckpointOptions`] of `--checkpoint-dir`.
//! The checkpoints themselves are [`checkpoint`]'s.

use super::{Failure, TrainArgs};
use crate::checkpoint::format::file_digest;
use crate::checkpoint::{
    self, Checkpoint, CheckpointError, CheckpointOptions, Found, RunIdentity, DEFAULT_EVERY,
};
use crate::{Restored, TrainConfig, TrainError};

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
        if dir.exists() && !dir.is_dir() {
            return Err(TrainError::Config(format!(
                "--checkpoint-dir {} is a file, not a directory; give the --checkpoint-dir of \
                 an earlier run",
                dir.display()
            )));
        }
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
            run: None,
            resuming: false,
        })
    }

    /// A fresh run's identity: a new random id, the seed, the task (`data` with `--data`)
    /// and the training file's digest.
    pub fn run_identity(&self, config: &TrainConfig) -> Result<RunIdentity, Failure> {
        let digest = match &config.data.path {
            Some(path) => Some(file_digest(path).map_err(|e| {
                Failure::usage(format!("cannot read --data {}: {e}", path.display()))
            })?),
            None => None,
        };
        let task = match &config.data.path {
            Some(_) => "data".to_string(),
            None => config.data.task.name().to_string(),
        };
        Ok(RunIdentity::fresh(config.seed, task, digest))
    }

    /// A refusal of the checkpoint writer in the words of the command line.
    pub fn checkpoint_refusal(&self, err: CheckpointError) -> Failure {
        match &err {
            CheckpointError::Occupied { .. } if self.resume || self.resume_from.is_some() => {
                Failure::usage(format!(
                    "--checkpoint-dir: {err}, not the run being resumed; give another \
                     --checkpoint-dir"
                ))
            }
            CheckpointError::Occupied { .. } => Failure::usage(format!(
                "--checkpoint-dir: {err}; add --resume to continue that run, or give another \
                 --checkpoint-dir (a fresh run never replaces another run's checkpoints)"
            )),
            CheckpointError::InUse { .. } => Failure::usage(format!(
                "--checkpoint-dir: {err}; wait until it ends, or give another --checkpoint-dir"
            )),
            _ => Failure::usage(format!("--checkpoint-dir: {err}")),
        }
    }

    /// Refuses to resume `checkpoint` when the settings that decide what the run trains on
    /// (the seed, the task, the data, the order, the held-out share) differ from `config`'s,
    /// naming each one, unless `--allow-changed-settings`.
    pub fn check_resumed_settings(
        &self,
        checkpoint: &Checkpoint,
        config: &TrainConfig,
    ) -> Result<(), Failure> {
        if self.allow_changed_settings {
            return Ok(());
        }
        let saved = &checkpoint.state.config;
        let mut changed = Vec::new();
        if saved.seed != config.seed {
            changed.push(format!(
                "--seed {} (the checkpoint's: {})",
                config.seed, saved.seed
            ));
        }
        if saved.data.path.is_none()
            && config.data.path.is_none()
            && saved.data.task != config.data.task
        {
            changed.push(format!(
                "--task {} (the checkpoint's: {})",
                config.data.task.name(),
                saved.data.task.name()
            ));
        }
        let recorded = checkpoint
            .manifest
            .run
            .as_ref()
            .and_then(|r| r.data_digest.clone());
        let data_changed = match (&saved.data.path, &config.data.path) {
            (None, None) => false,
            (Some(_), Some(path)) => match &recorded {
                Some(digest) => file_digest(path).ok().as_ref() != Some(digest),
                None => saved.data.path != config.data.path,
            },
            _ => true,
        };
        if data_changed {
            let show = |d: &Option<std::path::PathBuf>| match d {
                Some(p) => p.display().to_string(),
                None => format!("none, the {} task", saved.data.task.name()),
            };
            changed.push(format!(
                "--data {} (the checkpoint's: {}{})",
                show(&config.data.path),
                show(&saved.data.path),
                if saved.data.path.is_some() && saved.data.path == config.data.path {
                    ", whose contents have changed"
                } else {
                    ""
                }
            ));
        }
        if saved.data.shuffle != config.data.shuffle {
            changed.push(format!(
                "--shuffle {} (the checkpoint's: {})",
                config.data.shuffle, saved.data.shuffle
            ));
        }
        if saved.data.validation_fraction.to_bits() != config.data.validation_fraction.to_bits() {
            changed.push(format!(
                "--validation-fraction {} (the checkpoint's: {})",
                config.data.validation_fraction, saved.data.validation_fraction
            ));
        }
        if changed.is_empty() {
            return Ok(());
        }
        Err(Failure::usage(format!(
            "cannot resume {}: changed {}; a resumed run continues the same training, so give \
             the checkpoint's settings, or add --allow-changed-settings to continue from its \
             weights with the new ones",
            checkpoint.path.display(),
            changed.join(", ")
        )))
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

    /// Tells `say` which checkpoint `--init-from DIR` read (`config.init_from`, unless
    /// `--quiet`) and, always, why each newer one was skipped, as `--resume` does.
    pub fn say_init_from(&self, config: &TrainConfig, say: &mut dyn FnMut(&str)) {
        let (Some(given), Some(chosen)) = (&self.init_from, &config.model.init_from) else {
            return;
        };
        if !given.is_dir() {
            return;
        }
        let chosen_step = chosen
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(checkpoint::writer::parse_dir_name);
        if chosen != given {
            if let (Ok(mut dirs), Some(at)) =
                (checkpoint::writer::checkpoint_dirs(given), chosen_step)
            {
                dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
                for (_, dir) in dirs.into_iter().filter(|d| d.0 > at) {
                    if let Err(e @ CheckpointError::Damaged { .. }) = Checkpoint::read(&dir) {
                        say(&format!("warning: {e}; using the previous checkpoint"));
                    }
                }
            }
        }
        if !self.observe.quiet {
            say(&format!("--init-from: the weights of {}", chosen.display()));
        }
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

    /// Tells `say` how 1-bit Adam runs (unless `--quiet`): its warm-up and its variance
    /// refresh, each saying whether it is the default, so a user who passed only
    /// `--gradient-compression 1bit` knows what the run does.
    pub fn say_compression_warmup(&self, config: &crate::TrainConfig, say: &mut dyn FnMut(&str)) {
        if self.observe.quiet {
            return;
        }
        if let Some(warmup) = config.one_bit_adam_from() {
            let default = |given: bool, what: &str| {
                if given {
                    "given".to_string()
                } else {
                    format!("the default, {what}")
                }
            };
            let warm = default(
                config.parallelism.compression_warmup.is_some(),
                &format!(
                    "{:.0}% of the steps",
                    100.0 * crate::config::ONE_BIT_ADAM_WARMUP_SHARE
                ),
            );
            let every = config.variance_refresh_every();
            let refresh = if every == 0 {
                "frozen for the rest of the run".to_string()
            } else {
                format!(
                    "refreshed on every step whose number is a multiple of {every} ({}): \
                     such a step exchanges the gradient in int8 and updates the variance as \
                     AdamW would have over the steps since its last update",
                    default(
                        config.parallelism.variance_refresh.is_some(),
                        &format!("--steps / {}", crate::config::ONE_BIT_ADAM_REFRESHES)
                    )
                )
            };
            say(&format!(
                "1-bit Adam: steps 1-{warmup} of {} exchange the gradient in int8 (the \
                 warm-up, {warm}), then the momentum in 1 bit with AdamW's variance \
                 {refresh}; --compression-warmup N and --variance-refresh N set them, \
                 --compression-warmup 0 compresses the gradient from the first step",
                config.steps,
            ));
        }
    }
}
