//! `dualpipe report RUN.jsonl [--svg FILE]`: the summary of a run from its `train --log`, and
//! its pictures (loss and validation loss, throughput, bubble ratio over the steps). Reading
//! the log, the figures and the SVG are `dualpipe_metrics`'s; this module parses and writes.

use std::path::PathBuf;

use dualpipe_metrics::{read_log_checked, RunReport};

use super::output::{check_paths, write_together};
use super::UsageError;

/// Output format of the summary.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Human-readable summary.
    Table,
    /// One JSON object.
    Json,
}

/// Flags of `dualpipe report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The JSONL run log written by `dualpipe train --log` (`-` for standard input).
    #[arg(value_name = "RUN.jsonl")]
    pub log: PathBuf,
    /// Draw loss and validation loss, throughput and bubble ratio over the steps as an SVG
    /// picture into FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Output format of the summary.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the summary into FILE instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs `dualpipe report`.
pub fn run(args: Args) -> anyhow::Result<()> {
    check_paths(
        &[("the run log", Some(&args.log))],
        ("--output", args.output.as_deref()),
        &[("--svg", args.svg.as_deref())],
    )?;
    let read = read_log_checked(&args.log).map_err(|e| UsageError(e.to_string()))?;
    for warning in &read.warnings {
        eprintln!("warning: {}: {warning}", args.log.display());
    }
    let report = RunReport::new(read.records);
    let source = args.log.display().to_string();
    let mut files = Vec::new();
    if let Some(path) = &args.svg {
        let svg = report.svg(&format!("dualpipe run: {source}"));
        files.push((Some(path.clone()), svg.into_bytes()));
    }
    let text = match args.format {
        Format::Table => report.text(&source),
        Format::Json => {
            let mut json = serde_json::to_string_pretty(&report)?;
            json.push('\n');
            json
        }
    };
    files.push((args.output.clone(), text.into_bytes()));
    write_together(files)
}
