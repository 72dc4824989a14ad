//! `dualpipe train`'s run of its flags on local threads ([`TrainArgs::run_local`]): the resume
//! point, the watch, the checkpoint writer, the run, the notes that tell of each, and what the
//! run leaves to write ([`Finished`]). What goes to the terminal goes through a `say`
//! callback (one line at a time), so the caller chooses where it goes; the caller writes the
//! outputs. The run under MPI is `TrainArgs::run_rank` (module `mpi`, feature `mpi`).

use std::path::PathBuf;

use dualpipe_schedule::Schedule;

use super::{rank_addr, Failure, TrainArgs};
use crate::checkpoint::{Checkpointing, Layout, OnSaved, RunIdentity};
use crate::partition::format_partition;
use crate::rebalance::Repartition;
use crate::watch::{Watch, WatchError, WatchPlan};
use crate::{Driver, LocalRun, RunSummary, TrainConfig, Trainer};

/// What a finished run leaves to write: the summary and, with `--save`, the weights.
#[derive(Debug)]
pub struct Finished {
    /// The predicted-vs-measured summary.
    pub summary: RunSummary,
    /// The final weights as safetensors bytes (with `--save`, for the GPT).
    pub weights: Option<Vec<u8>>,
}

impl Finished {
    /// The files the run asks to write, each with its bytes: `--save`'s weights, `--trace`'s
    /// timeline and `--svg`'s picture, each when asked for and available.
    pub fn files(&self, args: &TrainArgs) -> Vec<(PathBuf, Vec<u8>)> {
        let mut files = Vec::new();
        if let Some((path, bytes)) = args.save.as_ref().zip(self.weights.as_ref()) {
            files.push((path.clone(), bytes.clone()));
        }
        if let Some((path, text)) = args.trace.as_ref().zip(self.summary.trace()) {
            files.push((path.clone(), text.into_bytes()));
        }
        if let Some((path, text)) = args.svg.as_ref().zip(self.summary.svg()) {
            files.push((path.clone(), text.into_bytes()));
        }
        files
    }

    /// The summary as `--format` asks (the table without its loss lines with `--quiet`).
    pub fn text(&self, args: &TrainArgs) -> String {
        match args.format {
            super::Format::Json => self.summary.json(),
            super::Format::Table => self.summary.table(args.observe.quiet),
        }
    }
}

impl TrainArgs {
    /// Trains `config` (on `given`, `--schedule-file`'s schedule, when set) with every rank
    /// on a thread of this process: resumes as `--resume` / `--resume-from` ask, watches the
    /// run with the watch `start` makes, saves `--checkpoint-dir`'s checkpoints, and tells
    /// `say` what a user of the command line is told on the way (`start` is given the plan
    /// and `say`). Check the output paths first: training can be long.
    pub fn run_local<W: Watch>(
        &self,
        config: TrainConfig,
        given: Option<Schedule>,
        start: impl FnOnce(WatchPlan<'_>, &mut dyn FnMut(&str)) -> Result<W, WatchError>,
        say: &mut dyn FnMut(&str),
    ) -> Result<Finished, Failure> {
        self.say_init_from(&config, say);
        let resume_from = self.resume_checkpoint(say)?;
        if let Some(checkpoint) = &resume_from {
            self.check_resumed_settings(checkpoint, &config)?;
        }
        let mut local = LocalRun::new(config.clone(), given).map_err(Failure::setup)?;
        self.say_compression_warmup(&config, say);
        if let Some(checkpoint) = &resume_from {
            let restored = local.restore(checkpoint).map_err(Failure::setup)?;
            self.say_resumed(checkpoint, &restored, say);
        }
        let mut watch = self.start_watch(&config, local.schedule(), 0, true, start, say)?;
        let parts = local.checkpoint_parts();
        let resumed = resume_from.as_ref().map(|c| c.manifest.run.clone());
        let checkpoints = self.checkpointing(
            Layout::Whole { parts },
            watch.on_checkpoint(),
            &config,
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
        let saved = self.finish_checkpoints(checkpoints, !self.observe.quiet, say);
        if let Err(crate::TrainError::Interrupted { step, signal }) = outcome {
            watch.finish();
            saved?;
            return Err(self.interrupted(step, signal, config.steps));
        }
        let summary = outcome.map_err(|e| Failure::training(e, &config))?;
        saved?;
        watch.finish();
        if !self.observe.quiet {
            for m in local.repartitions() {
                say(&repartition_note(m));
            }
        }
        self.finished(local.lead(), summary)
            .map_err(|e| self.unsaved(e, &config))
    }

    /// Starts the watch of process `rank` (`lead`: the one that reports) with `start`: the
    /// metrics address moved up by the rank, the log on rank 0, the progress on the lead
    /// unless `--quiet`. A bad address or log path is a usage error naming its flag.
    pub(crate) fn start_watch<W: Watch>(
        &self,
        config: &TrainConfig,
        schedule: &Schedule,
        rank: usize,
        lead: bool,
        start: impl FnOnce(WatchPlan<'_>, &mut dyn FnMut(&str)) -> Result<W, WatchError>,
        say: &mut dyn FnMut(&str),
    ) -> Result<W, Failure> {
        let observe = &self.observe;
        let metrics_addr = match &observe.metrics_addr {
            Some(addr) => Some(rank_addr(addr, rank)?),
            None => None,
        };
        let plan = WatchPlan {
            config,
            schedule,
            rank,
            metrics_addr,
            log: observe.log.clone().filter(|_| rank == 0),
            keep_log: self.resume || self.resume_from.is_some(),
            progress: lead && !observe.quiet,
        };
        start(plan, say).map_err(|e| match e {
            WatchError::Serve(m) => Failure::usage(format!("--metrics-addr: {m}")),
            WatchError::Log(m) => Failure::usage(format!("--log: {m}")),
            WatchError::Output(w) if w.is_usage() => Failure::usage(w.to_string()),
            WatchError::Output(w) => Failure::error(None, &w),
        })
    }

    /// The writer `--checkpoint-dir` asks for (none without it), writing `layout` for the run
    /// of `config`; `resumed`: the identity of the run the resumed checkpoint holds (`None`:
    /// a fresh run). Tells `say` of dead runs' temp directories it removed.
    pub(crate) fn checkpointing(
        &self,
        layout: Layout,
        on_saved: Option<OnSaved>,
        config: &TrainConfig,
        resumed: Option<Option<RunIdentity>>,
        say: &mut dyn FnMut(&str),
    ) -> Result<Checkpointing, Failure> {
        let Some(mut options) = self.checkpoint_options() else {
            return Ok(Checkpointing::default());
        };
        options.resuming = resumed.is_some();
        options.run = Some(match resumed.flatten() {
            Some(run) => run,
            None => self.run_identity(config)?,
        });
        let checkpoints = Checkpointing::start(Some(&options), layout, on_saved)
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

    /// A failure to hand over the final weights, in the words of the command line.
    pub(crate) fn unsaved(&self, err: crate::TrainError, config: &TrainConfig) -> Failure {
        match (&err, &self.save) {
            (crate::TrainError::NonFiniteWeights { .. }, Some(path)) => Failure::run(format!(
                "{err}; --save {} is not written; lower the learning rate (now --lr {:e})",
                path.display(),
                config.optimizer.lr
            )),
            _ => Failure::error(None, &err),
        }
    }

    /// The line and exit code of a run a signal stopped at the boundary after `step` steps.
    fn interrupted(&self, step: usize, signal: i32, steps: usize) -> Failure {
        let name = match signal {
            2 => "SIGINT (Ctrl-C)".to_string(),
            15 => "SIGTERM".to_string(),
            1 => "SIGHUP".to_string(),
            n => format!("signal {n}"),
        };
        let kept = match &self.checkpoint_dir {
            Some(dir) => match crate::checkpoint::pointer::read(dir) {
                crate::checkpoint::pointer::Pointer::Names(name) => format!(
                    "the last checkpoint is {} (continue with --resume)",
                    dir.join(name).display()
                ),
                _ => format!("no checkpoint was published in {}", dir.display()),
            },
            None => {
                "no checkpoint (give --checkpoint-dir to keep an interrupted run's state)".into()
            }
        };
        Failure::interrupted(
            format!("interrupted by {name} after step {step} of {steps}; {kept}"),
            signal,
        )
    }

    /// Waits for the writer's queued checkpoints; tells `say` what it saved when `tell`.
    pub(crate) fn finish_checkpoints(
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

    /// The summary and, with `--save`, the final weights as safetensors bytes (a collective
    /// call under MPI: every rank makes it).
    pub(crate) fn finished<D: Driver>(
        &self,
        trainer: &mut Trainer<D>,
        summary: RunSummary,
    ) -> Result<Finished, crate::TrainError> {
        let weights = match &self.save {
            Some(_) => match trainer.weights()? {
                Some(weights) => {
                    if let Some(tensor) = weights.first_non_finite() {
                        return Err(crate::TrainError::NonFiniteWeights { tensor });
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
