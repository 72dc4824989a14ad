//! A job's checkpoints: the one it resumes ([`JobConfig::resume_point`], and the notes that
//! tell of it), the checks of its settings, and the [`CheckpointOptions`] of its writer. The
//! checkpoints themselves are [`checkpoint`]'s.

use crate::checkpoint::format::file_digest;
use crate::checkpoint::{self, Checkpoint, CheckpointError, CheckpointOptions, Found, RunIdentity};
use crate::job::{Failure, JobConfig, Resume};
use crate::{DType, Field, Restored, TrainConfig, TrainError};

impl JobConfig {
    /// The checkpoint [`CheckpointSection::resume`](crate::job::CheckpointSection::resume) asks
    /// for, with why each damaged newer one was skipped. `None`: a fresh run (no resume,
    /// [`Resume::Latest`] on a directory that holds no checkpoint yet, [`Resume::IfPresent`]
    /// on one that holds none or does not exist). A path that cannot be used is a
    /// [`TrainError::Config`].
    pub fn resume_point(&self) -> Result<Option<Found>, TrainError> {
        let bad = |field: Field, e: CheckpointError| {
            TrainError::Config(format!("{}: {e}", self.name(field)))
        };
        let field = match &self.checkpoint.resume {
            Resume::No => return Ok(None),
            Resume::From(path) => {
                return checkpoint::open(path)
                    .map(Some)
                    .map_err(|e| bad(Field::ResumeFrom, e))
            }
            Resume::Latest => Field::Resume,
            Resume::IfPresent => Field::ResumeIfPresent,
        };
        let Some(dir) = &self.checkpoint.dir else {
            return Err(TrainError::Config(format!(
                "{} needs {}",
                self.name(field),
                self.name(Field::CheckpointDir)
            )));
        };
        let dir_name = self.name(Field::CheckpointDir);
        if dir.exists() && !dir.is_dir() {
            return Err(TrainError::Config(format!(
                "{dir_name} {} is a file, not a directory; give the {dir_name} of an earlier run",
                dir.display()
            )));
        }
        if !dir.exists() && field == Field::ResumeIfPresent {
            return Ok(None);
        }
        if !dir.is_dir() {
            return Err(TrainError::Config(format!(
                "{}: the checkpoint directory {} does not exist; drop {} for a fresh run, or \
                 give the {dir_name} of an earlier one",
                self.name(Field::Resume),
                dir.display(),
                self.name(Field::Resume),
            )));
        }
        checkpoint::find_latest(dir).map_err(|e| bad(field, e))
    }

    /// The writer's options (`None`: no checkpoints written).
    pub fn checkpoint_options(&self) -> Option<CheckpointOptions> {
        Some(CheckpointOptions {
            dir: self.checkpoint.dir.clone()?,
            every: self.checkpoint.every,
            keep: self.checkpoint.keep,
            run: None,
            resuming: false,
        })
    }

    /// A fresh run's identity: a new random id, the seed, the task (`data` with a data
    /// file) and the training file's digest.
    pub fn run_identity(&self) -> Result<RunIdentity, Failure> {
        let config = &self.train;
        let digest = match &config.data.path {
            Some(path) => Some(
                file_digest(path)
                    .map_err(|e| Failure::usage(format!("{e} ({})", self.name(Field::Data))))?,
            ),
            None => None,
        };
        let task = match &config.data.path {
            Some(_) => "data".to_string(),
            None => config.data.task.name().to_string(),
        };
        Ok(RunIdentity::fresh(config.seed, task, digest))
    }

    /// A refusal of the checkpoint writer in the words of the job's user.
    pub fn checkpoint_refusal(&self, err: CheckpointError) -> Failure {
        let dir = self.name(Field::CheckpointDir);
        match &err {
            CheckpointError::Occupied { .. } if self.checkpoint.resuming() => Failure::usage(
                format!("{dir}: {err}, not the run being resumed; give another {dir}"),
            ),
            CheckpointError::Occupied { .. } => Failure::usage(format!(
                "{dir}: {err}; add {} to continue that run, or give another {dir} (a fresh run \
                 never replaces another run's checkpoints)",
                self.name(Field::Resume)
            )),
            CheckpointError::InUse { .. } => Failure::usage(format!(
                "{dir}: {err}; wait until it ends, or give another {dir}"
            )),
            _ => Failure::usage(format!("{dir}: {err}")),
        }
    }

    /// Refuses to resume `checkpoint` when the settings that decide what the run trains on
    /// (the seed, the task, the data, the order, the held-out share) differ from the job's,
    /// naming each one, unless
    /// [`allow_changed_settings`](crate::job::CheckpointSection::allow_changed_settings).
    pub fn check_resumed_settings(&self, checkpoint: &Checkpoint) -> Result<(), Failure> {
        if self.checkpoint.allow_changed_settings {
            return Ok(());
        }
        let config: &TrainConfig = &self.train;
        let saved = &checkpoint.state.config;
        let mut changed = Vec::new();
        // f64 is the exact mode: its runs agree bit for bit across schedules and shapes, so a
        // resume into or out of it would quietly end that promise (docs/precision.md). The
        // f32 / bf16 / f16 checkpoints are the same f32 state and interchange (with a note).
        if let Some((from, to)) = dtype_change(saved, config) {
            if from == DType::F64 || to == DType::F64 {
                changed.push(format!(
                    "{} {to} (the checkpoint's: {from}; f64 is the exact mode)",
                    self.name(Field::DType)
                ));
            }
        }
        if saved.seed != config.seed {
            changed.push(format!(
                "{} {} (the checkpoint's: {})",
                self.name(Field::Seed),
                config.seed,
                saved.seed
            ));
        }
        if saved.data.path.is_none()
            && config.data.path.is_none()
            && saved.data.task != config.data.task
        {
            changed.push(format!(
                "{} {} (the checkpoint's: {})",
                self.name(Field::Task),
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
                "{} {} (the checkpoint's: {}{})",
                self.name(Field::Data),
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
                "{} {} (the checkpoint's: {})",
                self.name(Field::Shuffle),
                config.data.shuffle,
                saved.data.shuffle
            ));
        }
        if saved.data.validation_fraction.to_bits() != config.data.validation_fraction.to_bits() {
            changed.push(format!(
                "{} {} (the checkpoint's: {})",
                self.name(Field::ValidationFraction),
                config.data.validation_fraction,
                saved.data.validation_fraction
            ));
        }
        if changed.is_empty() {
            return Ok(());
        }
        Err(Failure::usage(format!(
            "cannot resume {}: changed {}; a resumed run continues the same training, so give \
             the checkpoint's settings, or add {} to continue from its weights with the new ones",
            checkpoint.path.display(),
            changed.join(", "),
            self.name(Field::AllowChangedSettings)
        )))
    }

    /// The checkpoint to resume from ([`JobConfig::resume_point`]), telling `say` of each
    /// damaged newer one skipped, and that [`Resume::Latest`] (unless quiet) or
    /// [`Resume::IfPresent`] (always: a requeued job's log tells which run it was) found none
    /// yet.
    pub fn resume_checkpoint(
        &self,
        say: &mut dyn FnMut(&str),
    ) -> Result<Option<Checkpoint>, Failure> {
        let found = self
            .resume_point()
            .map_err(|e| Failure::setup(e, self.naming))?;
        let Some(found) = found else {
            match &self.checkpoint.resume {
                Resume::Latest if !self.observe.quiet => say(&format!(
                    "{}: no checkpoint yet; starting at step 1",
                    self.name(Field::Resume)
                )),
                Resume::IfPresent => say(&format!(
                    "{}: no checkpoint in {} yet; a fresh run, starting at step 1",
                    self.name(Field::ResumeIfPresent),
                    self.checkpoint
                        .dir
                        .as_deref()
                        .unwrap_or(std::path::Path::new(""))
                        .display()
                )),
                _ => {}
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

    /// Tells `say` which checkpoint the initial weights came from (a checkpoint directory
    /// given: unless quiet) and, always, why each newer one was skipped, as resuming does.
    pub fn say_init_from(&self, say: &mut dyn FnMut(&str)) {
        let (Some(given), Some(chosen)) = (&self.init_from, &self.train.model.init_from) else {
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
            say(&format!(
                "{}: the weights of {}",
                self.name(Field::InitFrom),
                chosen.display()
            ));
        }
    }

    /// Tells `say` where the run continues from (unless quiet).
    pub fn say_resumed(
        &self,
        checkpoint: &Checkpoint,
        restored: &Restored,
        say: &mut dyn FnMut(&str),
    ) {
        // A changed precision changes what the run computes: said even when quiet.
        if let Some((from, to)) = dtype_change(&checkpoint.state.config, &self.train) {
            say(&format!(
                "note: {}: the checkpoint was trained with {} {from}; this run continues in {to}",
                self.name(Field::Resume),
                self.name(Field::DType)
            ));
        }
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
                self.train.parallelism.data_parallel
            ));
        }
        if restored.feedback_dropped {
            say(
                "note: the grid changed, so the gradient compression's error feedback starts \
                 from zeros",
            );
        }
    }

    /// Tells `say` how 1-bit Adam runs (unless quiet): its warm-up and its variance refresh,
    /// each saying whether it is the default, so a user who asked only for 1-bit compression
    /// knows what the run does.
    pub fn say_compression_warmup(&self, say: &mut dyn FnMut(&str)) {
        if self.observe.quiet {
            return;
        }
        let config = &self.train;
        let Some(warmup) = config.one_bit_adam_from() else {
            return;
        };
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
                "one step in {}, rounded up",
                crate::config::ONE_BIT_ADAM_STEPS_PER_WARMUP_STEP
            ),
        );
        let every = config.variance_refresh_every();
        let refresh = if every == 0 {
            "frozen for the rest of the run".to_string()
        } else {
            let steps = if config.variance_refresh_doubling() {
                let mut at = Vec::new();
                let mut t = every;
                while t <= config.steps as u64 {
                    at.push(t.to_string());
                    t *= 2;
                }
                format!(
                    "on steps {} (the default: twice the warm-up, then doubling)",
                    if at.is_empty() {
                        "none".into()
                    } else {
                        at.join(", ")
                    }
                )
            } else {
                format!("on every step whose number is a multiple of {every} (given)")
            };
            format!(
                "refreshed {steps}: such a step exchanges the gradient in int8 and updates the \
                 variance as AdamW would have over the steps since its last update"
            )
        };
        let warmup_name = self.name(Field::CompressionWarmup);
        say(&format!(
            "1-bit Adam: steps 1-{warmup} of {} exchange the gradient in int8 (the warm-up, \
             {warm}), then the momentum in 1 bit with AdamW's variance {refresh}; {warmup_name} \
             N and {} N set them, {warmup_name} 0 compresses the gradient from the first step",
            config.steps,
            self.name(Field::VarianceRefresh),
        ));
    }
}

/// The checkpoint's dtype and the job's, when they differ.
fn dtype_change(saved: &TrainConfig, config: &TrainConfig) -> Option<(DType, DType)> {
    (saved.model.dtype != config.model.dtype).then_some((saved.model.dtype, config.model.dtype))
}
