//! `dualpipe train`: flags ([`TrainArgs`]) → [`TrainArgs::config`] → [`Trainer::run`] →
//! the summary (and `--save`'s weights), printed or written with `--output`. The flags, their
//! mapping and validation, the training loop, its checks and the summary are
//! `dualpipe_train`'s; this module and its children call them, show progress and print.

use dualpipe_schedule::{Schedule, ScheduleError};
use dualpipe_train::cli::{Format, TrainArgs, Transport};
use dualpipe_train::{Driver, LocalRun, RunSummary, TrainConfig, TrainError, Trainer};

use super::output::{check_outputs, write_together};
use super::UsageError;

#[cfg(feature = "mpi")]
mod mpi;
mod observe;

use observe::Observe;

mod layout;
mod resume;

/// What a finished run leaves to write: the summary and, with `--save`, the weights.
#[derive(Debug)]
pub struct Finished {
    summary: RunSummary,
    weights: Option<Vec<u8>>,
}

/// Runs `dualpipe train`.
pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    match execute(&args)? {
        Some(finished) => write(&args, &finished),
        // A rank other than 0 of a multi-process run: rank 0 prints the summary.
        None => Ok(()),
    }
}

/// Trains and returns what to write, or `None` on the ranks of a multi-process run that do
/// not report. Every output path is checked first, so a bad one is found before training.
fn execute(args: &TrainArgs) -> anyhow::Result<Option<Finished>> {
    let (config, given) = args.config().map_err(UsageError::from)?;
    if layout::profile_run(args, &config)? {
        return Ok(None);
    }
    check_outputs(
        args.output.as_deref(),
        &[
            args.trace.as_deref(),
            args.svg.as_deref(),
            args.save.as_deref(),
        ],
    )?;
    match args.transport {
        Transport::Local => execute_local(args, config, given).map(Some),
        Transport::Mpi => execute_mpi(args, config, given),
    }
}

/// A local run: every rank of the pipeline, or of its `--data-parallel` replicas, on a thread.
fn execute_local(
    args: &TrainArgs,
    config: TrainConfig,
    given: Option<Schedule>,
) -> anyhow::Result<Finished> {
    let resume_from = resume::point(args)?;
    let mut local = LocalRun::new(config.clone(), given).map_err(setup_error)?;
    if let Some(checkpoint) = &resume_from {
        let restored = local.restore(checkpoint).map_err(setup_error)?;
        resume::note(args, checkpoint, &restored);
    }
    let mut observe = Observe::start(&args.observe, &config, local.schedule(), 0, true)?;
    let writer = resume::writer(args, local.checkpoint_parts(), observe.on_checkpoint())?;
    if let Some(writer) = &writer {
        local.set_checkpoints(writer);
    }
    let outcome = local.run(|event| observe.on_event(event));
    local.clear_checkpoints();
    let saved = resume::finish(args, writer);
    let summary = outcome.map_err(|e| run_error(e, &config))?;
    saved?;
    observe.finish();
    layout::report_moves(local.repartitions(), args.observe.quiet);
    finished(args, local.lead(), summary)
}

/// The summary and, with `--save`, the final weights as safetensors bytes (a collective call
/// under MPI: every rank makes it).
fn finished<D: Driver>(
    args: &TrainArgs,
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
fn write(args: &TrainArgs, finished: &Finished) -> anyhow::Result<()> {
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
        Format::Table => summary.table(args.observe.quiet),
    };
    files.push((args.output.clone(), text.into_bytes()));
    write_together(files)
}

#[cfg(feature = "mpi")]
fn execute_mpi(
    args: &TrainArgs,
    config: TrainConfig,
    given: Option<Schedule>,
) -> anyhow::Result<Option<Finished>> {
    mpi::execute(args, config, given)
}

#[cfg(not(feature = "mpi"))]
fn execute_mpi(
    _args: &TrainArgs,
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

/// Maps a set-up error: a configuration the schedule or the model rejects is a usage error.
fn setup_error(err: TrainError) -> anyhow::Error {
    match err {
        TrainError::Config(msg) => UsageError(msg).into(),
        TrainError::Checkpoint(e) => UsageError(e.to_string()).into(),
        TrainError::Schedule(ScheduleError::InvalidConfig(msg)) => UsageError(msg).into(),
        other => anyhow::Error::new(other).context("cannot set up training"),
    }
}

/// Words a run's failure for the command line (a diverged loss names the flags to change).
fn run_error(err: TrainError, config: &TrainConfig) -> anyhow::Error {
    match err {
        TrainError::Diverged(d) => anyhow::anyhow!(dualpipe_train::cli::divergence(&d, config)),
        other => anyhow::Error::new(other).context("training failed"),
    }
}

#[cfg(test)]
mod tests;
