//! `dualpipe train`: train the reference MLP with a pipeline schedule on local ranks (one
//! thread per rank) and report the loss, the throughput and the measured pipeline metrics.
//!
//! The training loop is `dualpipe_nn::Trainer`; this module parses flags, loops over the
//! steps, shows progress and prints the summary. Measured timelines go through the
//! simulator's metrics and renderers, so the measured bubble ratio is computed exactly like a
//! simulated one.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use dualpipe_nn::{
    DType, NnError, OptimizerKind, StepReport, TrainConfig, Trainer, MEMORY_LIMIT_BYTES,
};
use dualpipe_runtime::OpTimes;
use dualpipe_schedule::{Schedule, ScheduleError};
use dualpipe_sim::svg::{self, SvgOptions};
use dualpipe_sim::{metrics, simulate, trace, CostModel, Metrics, Timeline};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use super::output::{write_atomic, write_output};
use super::UsageError;

#[cfg(feature = "mpi")]
mod mpi;

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

/// Flags of `dualpipe train`. Every size defaults to `TrainConfig::default()` (DualPipe on 4
/// ranks, 16 micro-batches of 64 rows, hidden 128, 2 blocks per stage, AdamW, 600 steps).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Schedule kind: gpipe, 1f1b, interleaved, zb1p, dualpipe, dualpipev [default: dualpipe].
    #[arg(long)]
    pub schedule: Option<String>,
    /// Pipeline ranks, one thread each [default: 4].
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Micro-batches per step, over both directions for dualpipe [default: 16].
    #[arg(long)]
    pub micro_batches: Option<usize>,
    /// Rows per micro-batch [default: 64].
    #[arg(long)]
    pub micro_batch_size: Option<usize>,
    /// Stages per rank, for interleaved [default: 2 for interleaved, 1 otherwise].
    #[arg(long)]
    pub virtual_stages: Option<usize>,
    /// Model width; each block is hidden -> 4 hidden -> hidden [default: 128].
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Residual MLP blocks per model stage [default: 2].
    #[arg(long)]
    pub layers_per_stage: Option<usize>,
    /// Training steps [default: 200].
    #[arg(long)]
    pub steps: Option<usize>,
    /// Learning rate [default: 0.001].
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// Optimizer: sgd (momentum 0.9) or adamw [default: adamw].
    #[arg(long)]
    pub optimizer: Option<String>,
    /// Element type: f32 or f64 [default: f32].
    #[arg(long)]
    pub dtype: Option<String>,
    /// Seed of the model, the teacher and the data [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output format of the summary.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the last step's measured timeline as a Chrome/Perfetto trace into FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Draw the last step's measured timeline as an SVG picture into FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// No progress bar and no per-step lines (the summary is still printed).
    #[arg(long)]
    pub quiet: bool,
    /// local: one thread per rank; mpi: one process per rank, e.g.
    /// `mpirun -n 4 dualpipe train --transport mpi` (rank 0 prints the summary).
    #[arg(long, value_enum, default_value_t = Transport::Local)]
    pub transport: Transport,
    /// Seconds a rank waits for a message from another before it gives up and names it.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 60.0,
        allow_negative_numbers = true
    )]
    pub recv_timeout: f64,
    /// Testing only: make RANK fail at STEP (1-based), as `RANK:STEP:error` (a clean error
    /// that the other ranks are told of), `RANK:STEP:exit` (the process exits at once with
    /// code 3) or `RANK:STEP:abort` (the process dies of SIGABRT). Needs --transport mpi.
    #[arg(long, value_name = "RANK:STEP:HOW", hide = true)]
    pub inject_failure: Option<String>,
}

/// The configuration the flags ask for, or a usage error naming the bad flag.
pub fn config(args: &Args) -> Result<TrainConfig, UsageError> {
    let mut config = TrainConfig::default();
    if let Some(name) = &args.schedule {
        config.schedule = super::parse_kind(name)?;
        config.virtual_stages = config.schedule.default_virtual_stages();
    }
    let positive = |flag: &str, value: Option<usize>, default: usize| match value {
        Some(0) => Err(UsageError(format!("--{flag} is 0; it must be at least 1"))),
        Some(v) => Ok(v),
        None => Ok(default),
    };
    config.ranks = positive("ranks", args.ranks, config.ranks)?;
    config.micro_batches = positive("micro-batches", args.micro_batches, config.micro_batches)?;
    config.micro_batch_size = positive(
        "micro-batch-size",
        args.micro_batch_size,
        config.micro_batch_size,
    )?;
    config.virtual_stages = positive("virtual-stages", args.virtual_stages, config.virtual_stages)?;
    config.hidden = positive("hidden", args.hidden, config.hidden)?;
    config.layers_per_stage = positive(
        "layers-per-stage",
        args.layers_per_stage,
        config.layers_per_stage,
    )?;
    config.steps = positive("steps", args.steps, config.steps)?;
    if let Some(lr) = args.lr {
        if !(lr.is_finite() && lr > 0.0) {
            return Err(UsageError(format!(
                "--lr {lr}: the learning rate must be a positive number such as 0.001"
            )));
        }
        config.lr = lr;
    }
    if let Some(name) = &args.optimizer {
        config.optimizer = OptimizerKind::from_name(name).ok_or_else(|| {
            UsageError(format!(
                "unknown optimizer '{name}' (--optimizer): use one of {}",
                OptimizerKind::NAMES.join(", ")
            ))
        })?;
    }
    if let Some(name) = &args.dtype {
        config.dtype = DType::from_name(name).ok_or_else(|| {
            UsageError(format!(
                "unknown dtype '{name}' (--dtype): use one of {}",
                DType::NAMES.join(", ")
            ))
        })?;
    }
    if let Some(seed) = args.seed {
        config.seed = seed;
    }
    check_sizes(&config)?;
    Ok(config)
}

/// Refuses widths and micro-batch sizes whose memory cannot exist, naming the flags (the
/// library's `TrainConfig::validate` refuses the same configurations in its own words).
fn check_sizes(config: &TrainConfig) -> Result<(), UsageError> {
    let memory = config.memory_bytes();
    let gib = MEMORY_LIMIT_BYTES >> 30;
    if memory.parameters > MEMORY_LIMIT_BYTES {
        return Err(UsageError(format!(
            "--hidden {} with --layers-per-stage {} needs more than {gib} GiB of parameters; \
             use a smaller --hidden or --layers-per-stage",
            config.hidden, config.layers_per_stage,
        )));
    }
    if memory.activations > MEMORY_LIMIT_BYTES {
        return Err(UsageError(format!(
            "--micro-batch-size {} with --micro-batches {} and --hidden {} needs more than {gib} \
             GiB of activations per step; use a smaller --micro-batch-size",
            config.micro_batch_size, config.micro_batches, config.hidden,
        )));
    }
    Ok(())
}

/// The end summary (also the JSON output).
#[derive(Serialize, Debug)]
pub struct Summary {
    /// Schedule kind.
    pub schedule: String,
    /// Pipeline ranks.
    pub ranks: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Rows per micro-batch.
    pub micro_batch_size: usize,
    /// Model width.
    pub hidden: usize,
    /// Blocks per model stage.
    pub layers_per_stage: usize,
    /// Model stages along one pipeline.
    pub model_stages: usize,
    /// Optimizer name.
    pub optimizer: String,
    /// Learning rate.
    pub lr: f64,
    /// Element type.
    pub dtype: String,
    /// Seed.
    pub seed: u64,
    /// Steps run.
    pub steps: usize,
    /// The loss of every step (mean over its micro-batches).
    pub losses: Vec<f64>,
    /// The last step's loss.
    pub final_loss: f64,
    /// Training samples (rows) per second over the whole run.
    pub samples_per_second: f64,
    /// Wall-clock seconds of the whole run (steps only, not set-up).
    pub total_seconds: f64,
    /// Median wall-clock time of one step (data, pipeline, gradient sum, optimizer).
    pub step_seconds_median: f64,
    /// Median measured pipeline makespan (first op start to last op end).
    pub pipeline_seconds_median: f64,
    /// Measured bubble ratio (the simulator's metric on the measured timelines; median).
    pub bubble_ratio: f64,
    /// Seconds per step a rank's compute thread waited for messages (mean over ranks,
    /// median over steps).
    pub comm_wait_seconds: f64,
    /// Mean measured duration of each compute op kind, in seconds.
    pub op_seconds: OpSeconds,
    /// The simulator's makespan for this schedule with the measured op durations.
    pub simulated_pipeline_seconds: Option<f64>,
    /// The simulator's bubble ratio with the measured op durations.
    pub simulated_bubble_ratio: Option<f64>,
}

/// Mean measured op durations (seconds; null for a kind the schedule does not use).
#[derive(Serialize, Debug)]
pub struct OpSeconds {
    /// Forward.
    pub f: Option<f64>,
    /// Full backward.
    pub b: Option<f64>,
    /// Input-gradient backward.
    pub i: Option<f64>,
    /// Weight gradient.
    pub w: Option<f64>,
    /// Overlapped forward and backward.
    pub fb: Option<f64>,
}

/// Runs `dualpipe train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match execute(&args)? {
        Some(text) => write_output(None, &text),
        // A rank other than 0 of a multi-process run: rank 0 prints the summary.
        None => Ok(()),
    }
}

/// Trains, writes the trace and SVG files, and returns the summary text (table or JSON), or
/// `None` on the ranks of a multi-process run that do not report.
fn execute(args: &Args) -> anyhow::Result<Option<String>> {
    let config = config(args)?;
    if !(args.recv_timeout.is_finite() && args.recv_timeout > 0.0) {
        return Err(UsageError(format!(
            "--recv-timeout {}: the timeout must be a positive number of seconds such as 60",
            args.recv_timeout
        ))
        .into());
    }
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
            execute_local(args, config).map(Some)
        }
        Transport::Mpi => execute_mpi(args, config),
    }
}

#[cfg(feature = "mpi")]
fn execute_mpi(args: &Args, config: TrainConfig) -> anyhow::Result<Option<String>> {
    mpi::execute(args, config)
}

#[cfg(not(feature = "mpi"))]
fn execute_mpi(_args: &Args, _config: TrainConfig) -> anyhow::Result<Option<String>> {
    Err(UsageError(
        "--transport mpi: this dualpipe was built without MPI; rebuild it with \
         `cargo build --release --features mpi` (needs an MPI such as MPICH with its headers, \
         and libclang), then start it with `mpirun -n RANKS dualpipe train --transport mpi ...`"
            .into(),
    )
    .into())
}

/// Trains on local threads.
fn execute_local(args: &Args, config: TrainConfig) -> anyhow::Result<String> {
    let mut trainer = Trainer::new(config.clone()).map_err(setup_error)?;
    let progress = progress_bar(args, config.steps);
    let samples_per_step = (config.micro_batches * config.micro_batch_size) as f64;
    let mut reports: Vec<StepReport> = Vec::with_capacity(config.steps);
    let began = Instant::now();
    for step in 0..config.steps {
        let report = trainer
            .step()
            .with_context(|| format!("training step {} failed", step + 1))?;
        check_finite_loss(step, report.loss, config.lr)?;
        let elapsed = began.elapsed().as_secs_f64();
        progress.set_message(format!(
            "loss {:.5} · {:.0} samples/s",
            report.loss,
            samples_per_step * (step + 1) as f64 / elapsed.max(1e-9)
        ));
        progress.set_position(step as u64 + 1);
        reports.push(report);
    }
    let total_seconds = began.elapsed().as_secs_f64();
    progress.finish_and_clear();
    summarize(args, &config, trainer.schedule(), &reports, total_seconds)
}

/// Stops a run whose loss is no longer a finite number (it diverged), instead of reporting NaN.
pub(crate) fn check_finite_loss(step: usize, loss: f64, lr: f64) -> anyhow::Result<()> {
    if loss.is_finite() {
        return Ok(());
    }
    anyhow::bail!(
        "training diverged at step {}: the loss is {loss}; lower the learning rate (now --lr {lr:e})",
        step + 1
    )
}

/// The summary of a finished run (and its trace and SVG files).
fn summarize(
    args: &Args,
    config: &TrainConfig,
    schedule: &Schedule,
    reports: &[StepReport],
    total_seconds: f64,
) -> anyhow::Result<String> {
    let samples_per_step = (config.micro_batches * config.micro_batch_size) as f64;
    let timelines: Vec<&Timeline> = reports.iter().filter_map(|r| r.timeline.as_ref()).collect();
    let placement = &schedule.placement;
    let measured: Vec<Metrics> = timelines.iter().map(|t| metrics(t, placement)).collect();
    let times = OpTimes::from_timelines(timelines.iter().copied());
    let simulated = times
        .stage_cost()
        .map(|compute| CostModel {
            compute,
            ..CostModel::default()
        })
        .and_then(|cost| simulate(schedule, &cost).ok())
        .map(|t| metrics(&t, placement));
    let losses: Vec<f64> = reports.iter().map(|r| r.loss).collect();
    let summary = Summary {
        schedule: config.schedule.name().into(),
        ranks: config.ranks,
        micro_batches: config.micro_batches,
        micro_batch_size: config.micro_batch_size,
        hidden: config.hidden,
        layers_per_stage: config.layers_per_stage,
        model_stages: config.model_stages(),
        optimizer: config.optimizer.name().into(),
        lr: config.lr,
        dtype: config.dtype.name().into(),
        seed: config.seed,
        steps: reports.len(),
        final_loss: losses.last().copied().unwrap_or(f64::NAN),
        losses,
        samples_per_second: samples_per_step * reports.len() as f64 / total_seconds.max(1e-9),
        total_seconds,
        step_seconds_median: median(reports.iter().map(|r| r.wall.as_secs_f64())),
        pipeline_seconds_median: median(measured.iter().map(|m| m.makespan)),
        bubble_ratio: median(measured.iter().map(|m| m.bubble_ratio)),
        comm_wait_seconds: median(
            timelines
                .iter()
                .map(|t| t.comm_wait.iter().sum::<f64>() / t.comm_wait.len().max(1) as f64),
        ),
        op_seconds: OpSeconds {
            f: times.f,
            b: times.b,
            i: times.i,
            w: times.w,
            fb: times.fb,
        },
        simulated_pipeline_seconds: simulated.as_ref().map(|m| m.makespan),
        simulated_bubble_ratio: simulated.as_ref().map(|m| m.bubble_ratio),
    };

    if let Some(last) = timelines.last() {
        let title = format!(
            "measured: {} · {} ranks · {} micro-batches · step {}",
            config.schedule,
            config.ranks,
            config.micro_batches,
            timelines.len()
        );
        if let Some(path) = &args.trace {
            write_atomic(path, trace::render_trace(last).as_bytes())?;
        }
        if let Some(path) = &args.svg {
            let options = SvgOptions {
                title: Some(title),
                caption: vec![svg::caption(&metrics(last, placement))],
            };
            write_atomic(path, svg::render_svg(last, &options).as_bytes())?;
        }
    }

    Ok(match args.format {
        Format::Json => format!("{}\n", serde_json::to_string_pretty(&summary)?),
        Format::Table => table(&summary, args.quiet),
    })
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
fn setup_error(err: NnError) -> anyhow::Error {
    match err {
        NnError::Config(msg) => UsageError(msg).into(),
        NnError::Schedule(ScheduleError::InvalidConfig(msg)) => UsageError(msg).into(),
        other => anyhow::Error::new(other).context("cannot set up training"),
    }
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn ms(seconds: Option<f64>) -> String {
    seconds.map_or("-".into(), |s| format!("{:.3}", s * 1e3))
}

/// The human summary: a few loss lines (unless quiet), then the figures.
fn table(s: &Summary, quiet: bool) -> String {
    let mut out = format!(
        "dualpipe train: {} on {} ranks ({} model stages), {} micro-batches x {} rows, hidden {}, \
         {} blocks/stage, {} lr {}, {}, seed {}\n",
        s.schedule,
        s.ranks,
        s.model_stages,
        s.micro_batches,
        s.micro_batch_size,
        s.hidden,
        s.layers_per_stage,
        s.optimizer,
        s.lr,
        s.dtype,
        s.seed
    );
    if !quiet && !s.losses.is_empty() {
        out.push_str("\n  step  loss\n");
        let n = s.losses.len();
        let every = n.div_ceil(10).max(1);
        for (i, loss) in s.losses.iter().enumerate() {
            if i % every == 0 || i + 1 == n {
                out.push_str(&format!("  {:>4}  {loss:.6}\n", i + 1));
            }
        }
    }
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    let rows = [
        ("final loss", format!("{:.6}", s.final_loss)),
        (
            "throughput",
            format!("{:.0} samples/s", s.samples_per_second),
        ),
        (
            "step time (median)",
            format!("{:.2} ms", 1e3 * s.step_seconds_median),
        ),
        (
            "pipeline time (median)",
            format!(
                "{:.2} ms measured, {} simulated from measured op times",
                1e3 * s.pipeline_seconds_median,
                s.simulated_pipeline_seconds
                    .map_or("-".into(), |x| format!("{:.2} ms", 1e3 * x))
            ),
        ),
        (
            "bubble ratio",
            format!(
                "{} measured, {} simulated",
                pct(s.bubble_ratio),
                s.simulated_bubble_ratio.map_or("-".into(), pct)
            ),
        ),
        (
            "comm wait",
            format!("{:.2} ms per rank per step", 1e3 * s.comm_wait_seconds),
        ),
        (
            "op times (ms)",
            format!(
                "F {} · B {} · I {} · W {} · FB {}",
                ms(s.op_seconds.f),
                ms(s.op_seconds.b),
                ms(s.op_seconds.i),
                ms(s.op_seconds.w),
                ms(s.op_seconds.fb)
            ),
        ),
        (
            "total",
            format!("{} steps in {:.2} s", s.steps, s.total_seconds),
        ),
    ];
    out.push('\n');
    for (name, value) in rows {
        out.push_str(&format!("  {name:<24}{value}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use dualpipe_schedule::ScheduleKind;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(flags: &[&str]) -> Args {
        let mut argv = vec!["train"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).expect("flags parse").args
    }

    #[test]
    fn defaults_come_from_the_train_config() {
        assert_eq!(config(&parse(&[])).unwrap(), TrainConfig::default());
    }

    #[test]
    fn flags_override_defaults() {
        let c = config(&parse(&[
            "--schedule",
            "1F1B",
            "--ranks",
            "2",
            "--micro-batches",
            "6",
            "--micro-batch-size",
            "8",
            "--hidden",
            "16",
            "--layers-per-stage",
            "1",
            "--steps",
            "3",
            "--lr",
            "0.01",
            "--optimizer",
            "sgd",
            "--dtype",
            "f64",
            "--seed",
            "7",
        ]))
        .unwrap();
        assert_eq!(c.schedule, ScheduleKind::OneFOneB);
        assert_eq!(
            (c.ranks, c.micro_batches, c.micro_batch_size, c.hidden),
            (2, 6, 8, 16)
        );
        assert_eq!((c.layers_per_stage, c.steps, c.seed), (1, 3, 7));
        assert_eq!(c.lr, 0.01);
        assert_eq!(c.optimizer, OptimizerKind::sgd());
        assert_eq!(c.dtype, DType::F64);
    }

    #[test]
    fn interleaved_defaults_to_two_virtual_stages() {
        let c = config(&parse(&["--schedule", "interleaved"])).unwrap();
        assert_eq!(c.virtual_stages, 2);
    }

    #[test]
    fn bad_flags_are_usage_errors_naming_the_flag() {
        let cases: [(&[&str], &str); 7] = [
            (&["--schedule", "zigzag"], "--schedule"),
            (&["--optimizer", "lion"], "--optimizer"),
            (&["--dtype", "f16"], "--dtype"),
            (&["--ranks", "0"], "--ranks"),
            (&["--lr", "-1"], "--lr"),
            (&["--hidden", "18446744073709551615"], "--hidden"),
            (
                &["--micro-batch-size", "18446744073709551615"],
                "--micro-batch-size",
            ),
        ];
        for (flags, flag) in cases {
            let err = config(&parse(flags)).unwrap_err();
            assert!(err.0.contains(flag), "{flags:?}: {}", err.0);
        }
    }

    #[test]
    fn a_tiny_run_prints_json_and_writes_its_files() {
        let dir = std::env::temp_dir().join(format!("dualpipe-train-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (trace_path, svg_path) = (dir.join("t.json"), dir.join("t.svg"));
        let mut args = parse(&[
            "--ranks",
            "2",
            "--micro-batches",
            "4",
            "--micro-batch-size",
            "4",
            "--hidden",
            "8",
            "--layers-per-stage",
            "1",
            "--steps",
            "3",
            "--format",
            "json",
            "--quiet",
        ]);
        args.trace = Some(trace_path.clone());
        args.svg = Some(svg_path.clone());
        let text = execute(&args).unwrap().expect("local runs always report");
        let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(summary["losses"].as_array().unwrap().len(), 3);
        assert_eq!(summary["final_loss"], summary["losses"][2]);
        for key in [
            "samples_per_second",
            "step_seconds_median",
            "bubble_ratio",
            "comm_wait_seconds",
        ] {
            assert!(summary[key].as_f64().unwrap() >= 0.0, "{key}");
        }
        let trace: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
        assert!(trace.is_object() || trace.is_array());
        assert!(std::fs::read_to_string(&svg_path)
            .unwrap()
            .starts_with("<svg"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_configuration_the_schedule_rejects_is_a_usage_error() {
        let err = execute(&parse(&["--ranks", "3", "--quiet"])).unwrap_err();
        assert!(err.downcast_ref::<UsageError>().is_some(), "{err:#}");
    }

    #[test]
    fn transport_flags_parse_and_bad_combinations_are_usage_errors() {
        assert_eq!(parse(&[]).transport, Transport::Local);
        assert_eq!(parse(&["--transport", "mpi"]).transport, Transport::Mpi);
        let cases: [(&[&str], &str); 3] = [
            (&["--inject-failure", "1:1:error"], "--inject-failure"),
            (&["--recv-timeout", "0"], "--recv-timeout"),
            (&["--recv-timeout", "nan"], "--recv-timeout"),
        ];
        for (flags, flag) in cases {
            let err = execute(&parse(flags)).unwrap_err();
            let usage = err.downcast_ref::<UsageError>().expect("a usage error");
            assert!(usage.0.contains(flag), "{flags:?}: {}", usage.0);
        }
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn mpi_without_the_feature_says_how_to_build_it() {
        let err = execute(&parse(&["--transport", "mpi"])).unwrap_err();
        let usage = err.downcast_ref::<UsageError>().expect("a usage error");
        assert!(usage.0.contains("--features mpi"), "{}", usage.0);
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0].into_iter()), 2.5);
        assert!(median(std::iter::empty()).is_nan());
    }
}
