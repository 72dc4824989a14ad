//! `dualpipe train`: flags → [`TrainConfig`] → [`Trainer::run`] → the summary, printed or
//! written with `--output`. The training loop, its checks and the summary are
//! `dualpipe_train`'s; this module parses, shows progress and prints.

use std::path::PathBuf;

use dualpipe_schedule::Schedule;

use dualpipe_schedule::ScheduleError;
use dualpipe_train::{
    DType, Driver, LocalThreads, Naming, OptimizerKind, RunSummary, TrainConfig, TrainError,
    Trainer,
};

use super::output::{check_outputs, write_together};
use super::{count, UsageError};

#[cfg(feature = "mpi")]
mod mpi;
pub mod observe;

use observe::{Observe, ObserveArgs};

/// The defaults every flag shows and takes.
const D: TrainConfig = TrainConfig::DEFAULT;

/// How the ranks talk to each other.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// One thread per rank in this process, in-process channels.
    Local,
    /// One process per rank, started by mpirun / mpiexec / srun (needs a build with
    /// `--features mpi`).
    Mpi,
}

/// Output format of the end summary.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Human-readable summary.
    Table,
    /// One JSON object.
    Json,
}

/// Flags of `dualpipe train`; every default is `TrainConfig::DEFAULT`'s.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Schedule kind: gpipe, 1f1b, interleaved, zb1p, dualpipe, dualpipev.
    #[arg(long, default_value_t = D.schedule.name().to_string())]
    pub schedule: String,
    /// Train with the schedule in FILE (our JSON or torch's compute-only CSV, validated on
    /// import) instead of a generated one; its kind, ranks, micro-batches and stages per rank
    /// replace --schedule, --ranks, --micro-batches and --virtual-stages.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["schedule", "ranks", "micro_batches", "virtual_stages"])]
    pub schedule_file: Option<PathBuf>,
    /// Pipeline ranks (a thread each locally, a process each with --transport mpi).
    #[arg(long, default_value_t = D.ranks, value_parser = count, allow_negative_numbers = true)]
    pub ranks: usize,
    /// Micro-batches per step, over both directions for dualpipe.
    #[arg(long, default_value_t = D.micro_batches, value_parser = count, allow_negative_numbers = true)]
    pub micro_batches: usize,
    /// Rows per micro-batch.
    #[arg(long, default_value_t = D.micro_batch_size, value_parser = count, allow_negative_numbers = true)]
    pub micro_batch_size: usize,
    /// Stages per rank, for interleaved [default: 2 for interleaved, 1 otherwise].
    #[arg(long, value_parser = count, allow_negative_numbers = true)]
    pub virtual_stages: Option<usize>,
    /// Model width; each block is hidden -> 4 hidden -> hidden.
    #[arg(long, default_value_t = D.hidden, value_parser = count, allow_negative_numbers = true)]
    pub hidden: usize,
    /// Residual MLP blocks per model stage.
    #[arg(long, default_value_t = D.layers_per_stage, value_parser = count, allow_negative_numbers = true)]
    pub layers_per_stage: usize,
    /// Training steps (at most 1000000000).
    #[arg(long, default_value_t = D.steps, value_parser = count, allow_negative_numbers = true)]
    pub steps: usize,
    /// Learning rate.
    #[arg(long, default_value_t = D.lr, allow_negative_numbers = true)]
    pub lr: f64,
    /// Optimizer: sgd (momentum 0.9) or adamw.
    #[arg(long, default_value_t = D.optimizer.name().to_string())]
    pub optimizer: String,
    /// Element type: f32 or f64.
    #[arg(long, default_value_t = D.dtype.name().to_string())]
    pub dtype: String,
    /// Seed of the model, the teacher and the data.
    #[arg(long, default_value_t = D.seed, allow_negative_numbers = true)]
    pub seed: u64,
    /// Output format of the summary.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the summary into FILE instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Write the last step's measured timeline as a Chrome/Perfetto trace into FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Draw the last step's measured timeline as an SVG picture into FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Progress bar, metrics server and run log.
    #[command(flatten)]
    pub observe: ObserveArgs,
    /// local: one thread per rank; mpi: one process per rank, e.g.
    /// `mpirun -n 4 dualpipe train --transport mpi` (rank 0 prints the summary).
    #[arg(long, value_enum, default_value_t = Transport::Local)]
    pub transport: Transport,
    /// Seconds a rank waits for a message from another (a thread locally, a process with
    /// --transport mpi) before the step fails naming both.
    #[arg(long, value_name = "SECONDS", default_value_t = D.recv_timeout, allow_negative_numbers = true)]
    pub recv_timeout: f64,
    /// Testing only: make RANK fail at STEP (1-based), as `RANK:STEP:error` (a clean error
    /// that the other ranks are told of), `RANK:STEP:exit` (the process exits at once with
    /// code 3) or `RANK:STEP:abort` (the process dies of SIGABRT). Needs --transport mpi.
    #[arg(long, value_name = "RANK:STEP:HOW", hide = true)]
    pub inject_failure: Option<String>,
}

/// The configuration the flags ask for (or a usage error naming the bad flag) and, with
/// `--schedule-file`, the schedule read from the file (whose shape the configuration takes).
fn config_and_schedule(args: &Args) -> Result<(TrainConfig, Option<Schedule>), UsageError> {
    let given = args
        .schedule_file
        .as_deref()
        .map(super::simulate::read_schedule_file)
        .transpose()?;
    let schedule = match &given {
        Some(s) => s.kind,
        None => super::parse_kind(&args.schedule)?,
    };
    let optimizer = OptimizerKind::from_name(&args.optimizer).ok_or_else(|| {
        UsageError(format!(
            "unknown optimizer '{}' (--optimizer): use one of {}",
            args.optimizer,
            OptimizerKind::NAMES.join(", ")
        ))
    })?;
    let dtype = DType::from_name(&args.dtype).ok_or_else(|| {
        UsageError(format!(
            "unknown dtype '{}' (--dtype): use one of {}",
            args.dtype,
            DType::NAMES.join(", ")
        ))
    })?;
    let mut config = TrainConfig {
        schedule,
        ranks: args.ranks,
        micro_batches: args.micro_batches,
        micro_batch_size: args.micro_batch_size,
        virtual_stages: args
            .virtual_stages
            .unwrap_or_else(|| schedule.default_virtual_stages()),
        hidden: args.hidden,
        layers_per_stage: args.layers_per_stage,
        steps: args.steps,
        lr: args.lr,
        optimizer,
        dtype,
        seed: args.seed,
        recv_timeout: args.recv_timeout,
    };
    if let Some(s) = &given {
        (config.ranks, config.micro_batches) = (s.ranks, s.micro_batches);
        config.virtual_stages = s.virtual_stages;
    }
    let processes = match args.transport {
        Transport::Local => {
            LocalThreads.check(&config, Naming::Flags).map_err(usage)?;
            1
        }
        Transport::Mpi => config.ranks,
    };
    config.check(Naming::Flags, processes).map_err(usage)?;
    Ok((config, given))
}

/// A configuration error's own words (without the library's prefix), as a usage error.
fn usage(err: TrainError) -> UsageError {
    match err {
        TrainError::Config(msg) => UsageError(msg),
        other => UsageError(other.to_string()),
    }
}

/// Runs `dualpipe train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match execute(&args)? {
        Some(summary) => write(&args, &summary),
        // A rank other than 0 of a multi-process run: rank 0 prints the summary.
        None => Ok(()),
    }
}

/// Trains and returns the summary, or `None` on the ranks of a multi-process run that do not
/// report. Every output path is checked first, so a bad one is found before training.
fn execute(args: &Args) -> anyhow::Result<Option<RunSummary>> {
    let (config, given) = config_and_schedule(args)?;
    check_outputs(
        args.output.as_deref(),
        &[args.trace.as_deref(), args.svg.as_deref()],
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
            let mut trainer = match given {
                Some(schedule) => Trainer::with_schedule(config.clone(), schedule),
                None => Trainer::new(config.clone()),
            }
            .map_err(setup_error)?;
            let mut observe = Observe::start(&args.observe, &config, trainer.schedule(), 0, true)?;
            let summary = trainer
                .run(|event| observe.on_event(event))
                .map_err(|e| run_error(e, &config))?;
            observe.finish();
            Ok(Some(summary))
        }
        Transport::Mpi => execute_mpi(args, config, given),
    }
}

/// Writes the trace and the picture (when asked) and the summary, all or nothing.
fn write(args: &Args, summary: &RunSummary) -> anyhow::Result<()> {
    let mut files = Vec::new();
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
    args: &Args,
    config: TrainConfig,
    given: Option<Schedule>,
) -> anyhow::Result<Option<RunSummary>> {
    mpi::execute(args, config, given)
}

#[cfg(not(feature = "mpi"))]
fn execute_mpi(
    _args: &Args,
    _config: TrainConfig,
    _given: Option<Schedule>,
) -> anyhow::Result<Option<RunSummary>> {
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
             --hidden or fewer --layers-per-stage",
            d.loss,
            config.dtype
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
