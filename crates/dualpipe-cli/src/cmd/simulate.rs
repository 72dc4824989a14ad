//! `dualpipe simulate`: simulate one schedule on a cost model; print metrics, a timeline,
//! and optionally an SVG picture and a Chrome/Perfetto trace.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use dualpipe_schedule::{Schedule, ScheduleError};
use dualpipe_sim::report::{self, RunError};
use dualpipe_sim::svg::{self, SvgOptions};
use dualpipe_sim::{ascii, trace, CommCost, CostModel, SimError};

use super::output::{check_paths, write_together};
use super::{count, UsageError};

/// Output format of `simulate` and `compare`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Human-readable table (with a coloured timeline on a terminal).
    Table,
    /// One JSON object.
    Json,
}

/// Cost-model flags shared by `simulate` and `compare`.
#[derive(clap::Args, Debug, Clone)]
pub struct CostArgs {
    /// Duration of a forward chunk (F).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub f: f64,
    /// Duration of a full backward chunk (B).
    #[arg(long, default_value_t = 2.0, allow_negative_numbers = true)]
    pub b: f64,
    /// Duration of a weight-gradient chunk (W); the input-gradient part I is B - W.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub w: f64,
    /// Duration of an overlapped forward & backward pair (F&B) [default: F + B].
    #[arg(long, allow_negative_numbers = true)]
    pub fb: Option<f64>,
    /// Latency of every message, in seconds.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub latency: f64,
    /// Link bandwidth in bytes per second [default: infinite].
    #[arg(long, allow_negative_numbers = true)]
    pub bandwidth: Option<f64>,
    /// Bytes per message (activations or gradients of one micro-batch).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = bytes)]
    pub message_bytes: u64,
    /// Make communication blocking: a rank's compute waits for its own sends.
    #[arg(long)]
    pub blocking_comm: bool,
}

/// Parses `--message-bytes`: a whole number of bytes from 0 up (negative numbers reach this
/// check and are refused with a range message).
fn bytes(text: &str) -> Result<u64, String> {
    count(text).and_then(|n| u64::try_from(n).map_err(|_| format!("{n} is too large")))
}

impl CostArgs {
    /// The checked cost model, or a usage error naming the bad flag.
    pub fn cost_model(&self) -> Result<CostModel, UsageError> {
        let fb = self.fb.unwrap_or(self.f + self.b);
        let cost = CostModel::uniform(self.f, self.b, self.w, fb).with_comm(CommCost {
            latency: self.latency,
            bandwidth: self.bandwidth,
            message_bytes: self.message_bytes,
            blocking: self.blocking_comm,
        });
        cost.check().map_err(|e| {
            UsageError(format!(
                "{e} (flags --f --b --w --fb --latency --bandwidth)"
            ))
        })?;
        Ok(cost)
    }
}

/// Flags of `dualpipe simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Schedule kind: gpipe, 1f1b, interleaved, zb1p, dualpipe, dualpipev.
    #[arg(long, required_unless_present = "schedule_file")]
    pub schedule: Option<String>,
    /// Number of ranks (devices).
    #[arg(long, required_unless_present = "schedule_file", allow_negative_numbers = true, value_parser = count)]
    pub ranks: Option<usize>,
    /// Micro-batches per step, over both directions for dualpipe.
    #[arg(long, required_unless_present = "schedule_file", allow_negative_numbers = true, value_parser = count)]
    pub micro_batches: Option<usize>,
    /// Stages per rank (interleaved only) [default: 2 for interleaved, 1 otherwise].
    #[arg(long, allow_negative_numbers = true, value_parser = count)]
    pub virtual_stages: Option<usize>,
    /// Simulate the schedule in FILE instead of generating one: our JSON (`dualpipe schedule
    /// --format json`) or torch's compute-only CSV (`--format csv`), told apart by the
    /// extension or the content, validated on import; `-` reads stdin.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["schedule", "ranks", "micro_batches", "virtual_stages"])]
    pub schedule_file: Option<PathBuf>,
    /// Durations and communication costs.
    #[command(flatten)]
    pub cost: CostArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the table or JSON to FILE instead of stdout.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Also draw the timeline as an SVG picture into FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Also write a Chrome/Perfetto trace (JSON, microseconds) into FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Plain text timeline even on a terminal.
    #[arg(long)]
    pub no_color: bool,
}

/// Printed (on stderr) when a schedule with overlapped pairs runs without `--fb`.
pub const FB_DEFAULT_NOTE: &str =
    "note: --fb not given, so an overlapped F&B pair costs F + B (no overlap gain); pass --fb to model the overlap";

/// Reads, validates and lowers the schedule in `path` (`-`: stdin) with
/// [`crate::parse::read_schedule_file`]; its refusals are usage errors.
pub fn read_schedule_file(path: &Path) -> Result<Schedule, UsageError> {
    crate::parse::read_schedule_file(path).map_err(UsageError)
}

/// Maps a library error to a usage error (bad configuration) or a plain error.
pub fn run_error(err: RunError) -> anyhow::Error {
    match err {
        RunError::Schedule(ScheduleError::InvalidConfig(e)) => {
            UsageError(crate::parse::schedule_flags(&e)).into()
        }
        RunError::Sim(SimError::Cost(msg)) => UsageError(msg).into(),
        RunError::Sim(SimError::Overflow(msg)) => UsageError(format!(
            "{msg} (flags --f --b --w --fb --latency --bandwidth)"
        ))
        .into(),
        other => anyhow::Error::new(other),
    }
}

/// Runs `dualpipe simulate`.
///
/// Every output path is checked before the work; the table or JSON, the SVG and the trace are
/// all rendered, then written together (all or nothing).
pub fn run(args: Args) -> anyhow::Result<()> {
    let generated = match &args.schedule_file {
        Some(_) => None,
        None => Some(super::kind_and_virtual_stages(
            args.schedule.as_deref().unwrap_or_default(),
            args.virtual_stages,
        )?),
    };
    let cost = args.cost.cost_model()?;
    check_paths(
        &[("--schedule-file", args.schedule_file.as_deref())],
        ("--output", args.output.as_deref()),
        &[
            ("--svg", args.svg.as_deref()),
            ("--trace", args.trace.as_deref()),
        ],
    )?;
    let run = match (&args.schedule_file, generated) {
        (Some(path), _) => {
            let schedule = read_schedule_file(path)?;
            report::run_schedule(schedule, &cost).map_err(run_error)?
        }
        (None, Some((kind, virtual_stages))) => {
            let ranks = args.ranks.unwrap_or_default();
            let micro_batches = args.micro_batches.unwrap_or_default();
            report::run(kind, ranks, micro_batches, virtual_stages, &cost).map_err(run_error)?
        }
        (None, None) => {
            return Err(UsageError(
                "give --schedule, --ranks and --micro-batches, or --schedule-file FILE".into(),
            )
            .into())
        }
    };
    let kind = run.schedule.kind;
    let r = &run.report;
    let uses_fb = run
        .schedule
        .programs
        .iter()
        .flatten()
        .any(|op| matches!(op, dualpipe_schedule::Op::FB { .. }));
    if args.cost.fb.is_none() && uses_fb {
        eprintln!("{}", FB_DEFAULT_NOTE);
    }
    let mut files = Vec::new();
    if let Some(path) = &args.svg {
        let c = &cost.compute;
        let title = format!(
            "{} · {} ranks · {} micro-batches · F {} B {} W {} F&B {}",
            report::display_name(kind),
            r.ranks,
            r.micro_batches,
            c.f,
            c.b,
            c.w,
            c.fb
        );
        let picture = svg::render_svg(
            &run.timeline,
            &SvgOptions {
                title: Some(title),
                caption: vec![svg::caption(&r.metrics)],
            },
        );
        files.push((Some(path.clone()), picture.into_bytes()));
    }
    if let Some(path) = &args.trace {
        files.push((
            Some(path.clone()),
            trace::render_trace(&run.timeline).into_bytes(),
        ));
    }
    let text = match args.format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(r)?;
            s.push('\n');
            s
        }
        Format::Table => {
            let color = !args.no_color && args.output.is_none() && std::io::stdout().is_terminal();
            format!(
                "{}\n{}",
                report::report_table(r),
                ascii::render_ascii(&run.timeline, 120, color)
            )
        }
    };
    files.push((args.output.clone(), text.into_bytes()));
    write_together(files)
}
