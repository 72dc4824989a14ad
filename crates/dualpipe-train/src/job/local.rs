//! A job on local threads ([`Job::run`](super::Job::run) with [`Transport::Local`](super::Transport::Local)):
//! the resume point, the watch, the checkpoint writer, the run, the notes that tell of each,
//! and what the run leaves to write ([`Finished`]). The pieces both transports share (the
//! watch, the checkpoint session, the final weights) are here too.

use std::path::PathBuf;

use dualpipe_schedule::Schedule;

use super::{rank_addr, Failure, JobConfig, OutputsSection};
use crate::checkpoint::{Checkpointing, OnSaved, RunIdentity, WriteScope};
use crate::job::watch::{Watch, WatchError, WatchPlan};
use crate::parallel::stages::partition::format_partition;
use crate::parallel::stages::rebalance::Repartition;
use crate::{Driver, Field, LocalRun, RunSummary, TrainError, Trainer};

/// What a finished job leaves to write: the summary and, when asked, the weights.
#[derive(Debug)]
pub struct Finished {
    /// The predicted-vs-measured summary.
    pub summary: RunSummary,
    /// The final weights as safetensors bytes ([`OutputsSection::save`], for the GPT).
    pub weights: Option<Vec<u8>>,
}

impl Finished {
    /// The files `outputs` asks to write, each with its bytes: the weights, the timeline's
    /// trace and its picture, each when asked for and available.
    pub fn files(&self, outputs: &OutputsSection) -> Vec<(PathBuf, Vec<u8>)> {
        let mut files = Vec::new();
        if let Some((path, bytes)) = outputs.save.as_ref().zip(self.weights.as_ref()) {
            files.push((path.clone(), bytes.clone()));
        }
        if let Some((path, text)) = outputs.trace.as_ref().zip(self.summary.trace()) {
            files.push((path.clone(), text.into_bytes()));
        }
        if let Some((path, text)) = outputs.svg.as_ref().zip(self.summary.svg()) {
            files.push((path.clone(), text.into_bytes()));
        }
        files
    }
}

/// Trains `config` with every rank on a thread of this process (see
/// [`Job::run`](super::Job::run)).
pub(super) fn run_local<W: Watch>(
    job: &JobConfig,
    given: Option<Schedule>,
    start: impl FnOnce(WatchPlan<'_>, &mut dyn FnMut(&str)) -> Result<W, WatchError>,
    say: &mut dyn FnMut(&str),
) -> Result<Finished, Failure> {
    let config = &job.train;
    let naming = job.naming;
    job.say_init_from(say);
    let resume_from = job.resume_checkpoint(say)?;
    if let Some(checkpoint) = &resume_from {
        job.check_resumed_settings(checkpoint)?;
    }
    let mut local = LocalRun::new(config.clone(), given).map_err(|e| Failure::setup(e, naming))?;
    job.say_compression_warmup(say);
    if let Some(checkpoint) = &resume_from {
        let restored = local
            .restore(checkpoint)
            .map_err(|e| Failure::setup(e, naming))?;
        job.say_resumed(checkpoint, &restored, say);
    }
    let mut watch = job.start_watch(local.schedule(), 0, true, start, say)?;
    let parts = local.checkpoint_parts();
    let resumed = resume_from.as_ref().map(|c| c.manifest.run.clone());
    let checkpoints = job.checkpointing(
        WriteScope::Whole { parts },
        watch.on_checkpoint(),
        resumed,
        say,
    )?;
    if let Some(writer) = checkpoints.writer() {
        local.set_checkpoints(writer);
    }
    // Ctrl-C and SIGTERM stop the run at the next step boundary (a second one at once).
    dualpipe_io::defer_signals();
    local.set_stop(dualpipe_io::interrupted);
    let outcome = local.run(|event| watch.on_event(event));
    local.clear_checkpoints();
    let saved = job.finish_checkpoints(checkpoints, !job.observe.quiet, say);
    if let Err(TrainError::Interrupted { step, signal }) = outcome {
        watch.finish();
        saved?;
        return Err(job.interrupted(step, signal));
    }
    let summary = outcome.map_err(|e| Failure::training(e, config, naming))?;
    saved?;
    watch.finish();
    if !job.observe.quiet {
        for m in local.repartitions() {
            say(&repartition_note(m));
        }
    }
    job.finished(local.lead(), summary)
        .map_err(|e| job.unsaved(e))
}

impl JobConfig {
    /// Starts the watch of process `rank` (`lead`: the one that reports) with `start`: the
    /// metrics address moved up by the rank, the log on rank 0, the progress on the lead
    /// unless quiet. A bad address or log path is a usage error naming its field.
    pub(super) fn start_watch<W: Watch>(
        &self,
        schedule: &Schedule,
        rank: usize,
        lead: bool,
        start: impl FnOnce(WatchPlan<'_>, &mut dyn FnMut(&str)) -> Result<W, WatchError>,
        say: &mut dyn FnMut(&str),
    ) -> Result<W, Failure> {
        let observe = &self.observe;
        let metrics_addr = match &observe.metrics_addr {
            Some(addr) => Some(
                rank_addr(addr, rank, self.naming).map_err(|e| Failure::setup(e, self.naming))?,
            ),
            None => None,
        };
        let plan = WatchPlan {
            config: &self.train,
            schedule,
            rank,
            metrics_addr,
            log: observe.log.clone().filter(|_| rank == 0),
            keep_log: self.checkpoint.resuming(),
            progress: lead && !observe.quiet,
        };
        start(plan, say).map_err(|e| match e {
            WatchError::Serve(m) => {
                Failure::usage(format!("{}: {m}", self.name(Field::MetricsAddr)))
            }
            WatchError::Log(m) => Failure::usage(format!("{}: {m}", self.name(Field::Log))),
            WatchError::Output(w) if w.is_usage() => Failure::usage(w.to_string()),
            WatchError::Output(w) => Failure::error(None, &w),
        })
    }

    /// The checkpoint writer the job asks for (none without a checkpoint directory), writing
    /// `scope`; `resumed`: the identity of the run the resumed checkpoint holds (`None`: a
    /// fresh run). Tells `say` of dead runs' temp directories it removed.
    pub(super) fn checkpointing(
        &self,
        scope: WriteScope,
        on_saved: Option<OnSaved>,
        resumed: Option<Option<RunIdentity>>,
        say: &mut dyn FnMut(&str),
    ) -> Result<Checkpointing, Failure> {
        let Some(mut options) = self.checkpoint_options() else {
            return Ok(Checkpointing::default());
        };
        options.resuming = resumed.is_some();
        options.run = Some(match resumed.flatten() {
            Some(run) => run,
            None => self.run_identity()?,
        });
        let checkpoints = Checkpointing::start(Some(&options), scope, on_saved)
            .map_err(|e| self.checkpoint_refusal(e))?;
        if let Some(writer) = checkpoints.writer() {
            for removed in writer.removed() {
                if !self.observe.quiet {
                    say(&format!(
                        "removed {}, a checkpoint a killed run left half-written",
                        removed.display()
                    ));
                }
            }
        }
        Ok(checkpoints)
    }

    /// A failure to hand over the final weights, in the words of the job's user.
    pub(super) fn unsaved(&self, err: TrainError) -> Failure {
        match (&err, &self.outputs.save) {
            (TrainError::NonFiniteWeights { .. }, Some(path)) => Failure::run(format!(
                "{err}; {} {} is not written; lower the learning rate (now {} {:e})",
                self.name(Field::Save),
                path.display(),
                self.name(Field::Lr),
                self.train.optimizer.lr
            )),
            _ => Failure::error(None, &err),
        }
    }

    /// The line and exit code of a run a signal stopped at the boundary after `step` steps.
    pub(super) fn interrupted(&self, step: usize, signal: i32) -> Failure {
        let name = match signal {
            2 => "SIGINT (Ctrl-C)".to_string(),
            15 => "SIGTERM".to_string(),
            1 => "SIGHUP".to_string(),
            n => format!("signal {n}"),
        };
        let kept = match &self.checkpoint.dir {
            Some(dir) => match crate::checkpoint::pointer::read(dir) {
                crate::checkpoint::pointer::Pointer::Names(name) => format!(
                    "the last checkpoint is {} (continue with {})",
                    dir.join(name).display(),
                    // A run started with the requeue-safe setting is told that one again.
                    self.name(match self.checkpoint.resume {
                        super::Resume::IfPresent => Field::ResumeIfPresent,
                        _ => Field::Resume,
                    })
                ),
                _ => format!("no checkpoint was published in {}", dir.display()),
            },
            None => format!(
                "no checkpoint (give {} to keep an interrupted run's state)",
                self.name(Field::CheckpointDir)
            ),
        };
        Failure::interrupted(
            format!(
                "interrupted by {name} after step {step} of {}; {kept}",
                self.train.steps
            ),
            signal,
        )
    }

    /// Waits for the writer's queued checkpoints; tells `say` what it saved when `tell`.
    pub(super) fn finish_checkpoints(
        &self,
        checkpoints: Checkpointing,
        tell: bool,
        say: &mut dyn FnMut(&str),
    ) -> Result<(), Failure> {
        let note = checkpoints.finish().map_err(|e| Failure::error(None, &e))?;
        if let Some(note) = note.filter(|_| tell) {
            say(&note);
        }
        Ok(())
    }

    /// The summary and, when asked, the final weights as safetensors bytes (a collective call
    /// under MPI: every rank makes it).
    pub(super) fn finished<D: Driver>(
        &self,
        trainer: &mut Trainer<D>,
        summary: RunSummary,
    ) -> Result<Finished, TrainError> {
        let weights = match &self.outputs.save {
            Some(_) => match trainer.weights()? {
                Some(weights) => {
                    if let Some(tensor) = weights.first_non_finite() {
                        return Err(TrainError::NonFiniteWeights { tensor });
                    }
                    Some(weights.to_safetensors()?)
                }
                None => None,
            },
            None => None,
        };
        Ok(Finished { summary, weights })
    }
}

/// The line that tells of one re-partitioning of a run.
fn repartition_note(m: &Repartition) -> String {
    let seconds: Vec<String> = m.rank_seconds.iter().map(|s| format!("{s:.3}")).collect();
    format!(
        "rebalanced after step {}: blocks {} -> {} (rank compute {} s over the window; slowest \
         predicted {:.3} -> {:.3} s)",
        m.after_steps,
        format_partition(&m.from),
        format_partition(&m.to),
        seconds.join(" "),
        m.predicted.0,
        m.predicted.1
    )
}
