//! `dualpipe simulate`: simulate one schedule on a cost model; print metrics, a timeline,
//! and optionally an SVG picture and a Chrome/Perfetto trace.

use std::io::IsTerminal;
use std::path::PathBuf;

use dualpipe_schedule::ScheduleError;
use dualpipe_sim::report::{self, RunError};
use dualpipe_sim::svg::{self, SvgOptions};
use dualpipe_sim::{ascii, trace, CommCost, CostModel, SimError};

use super::output::{write_atomic, write_output};
use super::UsageError;

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
    #[arg(long, default_value_t = 0)]
    pub message_bytes: u64,
    /// Make communication blocking: a rank's compute waits for its own sends.
    #[arg(long)]
    pub blocking_comm: bool,
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
    /// Which schedule, on how many ranks and micro-batches.
    #[command(flatten)]
    pub sched: super::ScheduleArgs,
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

/// Parses a schedule kind name, or a usage error listing the valid ones.
/// Maps a library error to a usage error (bad configuration) or a plain error.
pub fn run_error(err: RunError) -> anyhow::Error {
    match err {
        RunError::Schedule(ScheduleError::InvalidConfig(msg)) => UsageError(msg).into(),
        RunError::Sim(SimError::Cost(msg)) => UsageError(msg).into(),
        other => anyhow::Error::new(other),
    }
}

/// Runs `dualpipe simulate`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let (kind, virtual_stages) = args.sched.kind_and_virtual_stages()?;
    let cost = args.cost.cost_model()?;
    let (ranks, micro_batches) = (args.sched.ranks, args.sched.micro_batches);
    let run = report::run(kind, ranks, micro_batches, virtual_stages, &cost).map_err(run_error)?;
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
        write_atomic(path, picture.as_bytes())?;
    }
    if let Some(path) = &args.trace {
        write_atomic(path, trace::render_trace(&run.timeline).as_bytes())?;
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
    write_output(args.output.as_deref(), &text)
}
