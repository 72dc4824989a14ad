//! `dualpipe train`: flags ([`args`]) → [`TrainConfig`] → [`Trainer::run`] → the summary
//! (and `--save`'s weights), printed or written with `--output`. The training loop, its
//! checks, the validation and the summary are `dualpipe_train`'s; this module parses, shows
//! progress and prints.

use std::io::IsTerminal;

use dualpipe_schedule::{Schedule, ScheduleError};
use dualpipe_train::{
    DataParallel, Driver, RunSummary, StepEvent, TrainConfig, TrainError, Trainer,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::output::{check_outputs, write_together};
use super::UsageError;

#[cfg(feature = "mpi")]
mod mpi;

mod args;

pub use args::{config_and_schedule, Args, Format, Transport};

/// What a finished run leaves to write: the summary and, with `--save`, the weights.
#[derive(Debug)]
pub struct Finished {
    summary: RunSummary,
    weights: Option<Vec<u8>>,
}

/// Runs `dualpipe train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match execute(&args)? {
        Some(finished) => write(&args, &finished),
        // A rank other than 0 of a multi-process run: rank 0 prints the summary.
        None => Ok(()),
    }
}

/// Trains and returns what to write, or `None` on the ranks of a multi-process run that do
/// not report. Every output path is checked first, so a bad one is found before training.
fn execute(args: &Args) -> anyhow::Result<Option<Finished>> {
    let (config, given) = config_and_schedule(args)?;
    check_outputs(
        args.output.as_deref(),
        &[
            args.trace.as_deref(),
            args.svg.as_deref(),
            args.save.as_deref(),
        ],
    )?;
    match args.transport {
        Transport::Local => {
            if args.inject_failure.is_some() {
                return Err(UsageError(
                    "--inject-failure needs --transport mpi (it stops one process of a \
                     multi-process run)"
                        .into(),
                )
                .into());
            }
            if config.data_parallel > 1 {
                return execute_replicas(args, &config, given).map(Some);
            }
            let mut trainer = match given {
                Some(schedule) => Trainer::with_schedule(config.clone(), schedule),
                None => Trainer::new(config.clone()),
            }
            .map_err(setup_error)?;
            let progress = progress_bar(args, config.steps);
            let summary = trainer
                .run(|event| {
                    show(&progress, &config, event);
                    Ok(())
                })
                .map_err(|e| run_error(e, &config))?;
            progress.finish_and_clear();
            finished(args, &mut trainer, summary).map(Some)
        }
        Transport::Mpi => execute_mpi(args, config, given),
    }
}

/// A local run of `--data-parallel` replicas (every replica's ranks on threads).
fn execute_replicas(
    args: &Args,
    config: &TrainConfig,
    given: Option<Schedule>,
) -> anyhow::Result<Finished> {
    let mut replicas = match given {
        Some(schedule) => DataParallel::with_schedule(config.clone(), schedule),
        None => DataParallel::new(config.clone()),
    }
    .map_err(setup_error)?;
    let progress = progress_bar(args, config.steps);
    let summary = replicas
        .run(|event| {
            show(&progress, config, event);
            Ok(())
        })
        .map_err(|e| run_error(e, config))?;
    progress.finish_and_clear();
    finished(args, replicas.replica_mut(0), summary)
}

/// The summary and, with `--save`, the final weights as safetensors bytes (a collective call
/// under MPI: every rank makes it).
fn finished<D: Driver>(
    args: &Args,
    trainer: &mut Trainer<D>,
    summary: RunSummary,
) -> anyhow::Result<Finished> {
    let weights = match &args.save {
        Some(_) => match trainer.weights()? {
            Some(weights) => Some(weights.to_safetensors()?),
            None => None,
        },
        None => None,
    };
    Ok(Finished { summary, weights })
}

/// Writes the weights, the trace and the picture (when asked) and the summary, all or
/// nothing.
fn write(args: &Args, finished: &Finished) -> anyhow::Result<()> {
    let summary = &finished.summary;
    let mut files = Vec::new();
    if let Some((path, bytes)) = args.save.as_ref().zip(finished.weights.as_ref()) {
        files.push((Some(path.clone()), bytes.clone()));
    }
    if let Some((path, text)) = args.trace.as_ref().zip(summary.trace()) {
        files.push((Some(path.clone()), text.into_bytes()));
    }
    if let Some((path, text)) = args.svg.as_ref().zip(summary.svg()) {
        files.push((Some(path.clone()), text.into_bytes()));
    }
    let text = match args.format {
        Format::Json => summary.json(),
        Format::Table => summary.table(args.quiet),
    };
    files.push((args.output.clone(), text.into_bytes()));
    write_together(files)
}

#[cfg(feature = "mpi")]
fn execute_mpi(
    args: &Args,
    config: TrainConfig,
    given: Option<Schedule>,
) -> anyhow::Result<Option<Finished>> {
    mpi::execute(args, config, given)
}

#[cfg(not(feature = "mpi"))]
fn execute_mpi(
    _args: &Args,
    _config: TrainConfig,
    _given: Option<Schedule>,
) -> anyhow::Result<Option<Finished>> {
    Err(UsageError(
        "--transport mpi: this dualpipe was built without MPI; rebuild it with \
         `cargo build --release --features mpi` (needs an MPI such as MPICH with its headers, \
         and libclang), then start it with `mpirun -n RANKS dualpipe train --transport mpi ...`"
            .into(),
    )
    .into())
}

/// Shows a step on the progress bar.
fn show(progress: &ProgressBar, config: &TrainConfig, event: StepEvent<'_>) {
    if let StepEvent::Finished { report, elapsed } = event {
        let rate =
            config.samples_per_step() * (report.step + 1) as f64 / elapsed.as_secs_f64().max(1e-9);
        let unit = match config.model {
            dualpipe_train::ModelKind::Gpt => "tokens",
            dualpipe_train::ModelKind::Mlp => "samples",
        };
        progress.set_message(format!("loss {:.5} · {rate:.0} {unit}/s", report.loss));
        progress.set_position(report.step as u64 + 1);
    }
}

/// A progress bar on stderr, hidden with `--quiet` or when stderr is not a terminal.
fn progress_bar(args: &Args, steps: usize) -> ProgressBar {
    if args.quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("step {pos}/{len} [{bar:20}] {msg} eta {eta}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Maps a set-up error: a configuration the schedule or the model rejects is a usage error.
fn setup_error(err: TrainError) -> anyhow::Error {
    match err {
        TrainError::Config(msg) => UsageError(msg).into(),
        TrainError::Schedule(ScheduleError::InvalidConfig(msg)) => UsageError(msg).into(),
        other => anyhow::Error::new(other).context("cannot set up training"),
    }
}

/// Words a run's failure for the command line (a diverged loss names the flags to change).
fn run_error(err: TrainError, config: &TrainConfig) -> anyhow::Error {
    match err {
        TrainError::Diverged(d) if d.before_any_update() => anyhow::anyhow!(
            "the loss of step 1 is {}, before any update: the inputs or the initial weights \
             overflow {} (the learning rate is not the cause); try --dtype f64, a smaller \
             {} or fewer --layers-per-stage",
            d.loss,
            config.dtype,
            match config.model {
                dualpipe_train::ModelKind::Gpt => "--d-model",
                dualpipe_train::ModelKind::Mlp => "--hidden",
            }
        ),
        TrainError::Diverged(d) => anyhow::anyhow!(
            "training diverged at step {}: the loss is {}; lower the learning rate (now --lr {:e})",
            d.step + 1,
            d.loss,
            d.lr
        ),
        other => anyhow::Error::new(other).context("training failed"),
    }
}

#[cfg(test)]
mod tests;
