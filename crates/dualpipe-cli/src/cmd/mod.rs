//! One module per subcommand; each parses its flags, calls the library crates and prints.

pub mod checkpoint;
pub mod cluster;
pub mod compare;
pub mod eplb;
pub mod eval;
pub mod generate;
pub mod output;
pub mod plan;
pub mod report;
pub mod schedule;
pub mod simulate;
pub mod train;

use std::io::IsTerminal;

use dualpipe_schedule::ScheduleKind;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar drawn with `template` on standard error when it is a terminal and the run
/// is not `quiet`; hidden otherwise (the caller sets its length and position either way).
pub(crate) fn progress_bar(quiet: bool, template: &str) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

/// The flags that name one schedule, shared by `dualpipe schedule` and `dualpipe simulate`.
#[derive(clap::Args, Debug)]
pub struct ScheduleArgs {
    /// Schedule kind: gpipe, 1f1b, interleaved, zb1p, dualpipe, dualpipev.
    #[arg(long)]
    pub schedule: String,
    /// Number of ranks (devices).
    #[arg(long, allow_negative_numbers = true, value_parser = count)]
    pub ranks: usize,
    /// Micro-batches per step, over both directions for dualpipe.
    #[arg(long, allow_negative_numbers = true, value_parser = count)]
    pub micro_batches: usize,
    /// Stages per rank (interleaved only) [default: 2 for interleaved, 1 otherwise].
    #[arg(long, allow_negative_numbers = true, value_parser = count)]
    pub virtual_stages: Option<usize>,
}

impl ScheduleArgs {
    /// The schedule kind and the virtual stages to generate with.
    pub fn kind_and_virtual_stages(&self) -> Result<(ScheduleKind, usize), UsageError> {
        kind_and_virtual_stages(&self.schedule, self.virtual_stages)
    }
}

/// The schedule kind named by `--schedule` and the virtual stages to generate with: the given
/// `--virtual-stages`, or the kind's default. A kind that fixes its stages per rank (all but
/// interleaved) accepts 1 (the plain pipeline meaning) or its own value, and otherwise says
/// what it has: DualPipeV's V always puts 2 stages on every rank.
pub fn kind_and_virtual_stages(
    name: &str,
    virtual_stages: Option<usize>,
) -> Result<(ScheduleKind, usize), UsageError> {
    let kind = parse_kind(name)?;
    if let (Some(fixed), Some(v)) = (kind.fixed_virtual_stages(), virtual_stages) {
        if v != 1 && v != fixed {
            let what = if fixed == 1 {
                "1 stage per rank".to_string()
            } else {
                format!(
                    "{fixed} stages per rank (its V folds {fixed} x ranks stages over the ranks)"
                )
            };
            let fix = if fixed == 1 {
                "leave --virtual-stages out, or use --schedule interleaved to choose it".to_string()
            } else {
                format!("use --virtual-stages {fixed} or leave it out")
            };
            return Err(UsageError(format!(
                "{kind} always has {what}, got --virtual-stages {v}: {fix}"
            )));
        }
    }
    Ok((
        kind,
        virtual_stages.unwrap_or_else(|| kind.default_virtual_stages()),
    ))
}

pub use crate::parse::{count, seed};

/// Parses a `--schedule` value, naming the valid kinds when it is unknown.
pub fn parse_kind(name: &str) -> Result<ScheduleKind, UsageError> {
    crate::parse::parse_kind(name).map_err(UsageError)
}

/// A user error: bad flags or input. Exits with code 2 (as clap does for usage errors).
#[derive(Debug)]
pub struct UsageError(pub String);

/// Reads a text input the user named through the one input path ([`dualpipe_io::read_text`]):
/// a regular file only, so a FIFO or a device never blocks the command, at most `limit` (one
/// of [`dualpipe_io::limits`]). `flag` names it in messages; every refusal is a usage error.
pub fn read_input(
    path: &std::path::Path,
    flag: &str,
    limit: dualpipe_io::limits::Limit,
) -> Result<String, UsageError> {
    dualpipe_io::read_text(path, limit, flag).map_err(|e| UsageError(e.to_string()))
}

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

impl From<dualpipe_train::TrainError> for UsageError {
    /// A library refusal in its own words (a configuration error without its prefix).
    fn from(err: dualpipe_train::TrainError) -> Self {
        UsageError(crate::parse::message(err))
    }
}

/// A run a signal stopped at a step boundary: its line, and the exit code `128 + signal`.
#[derive(Debug)]
pub struct Interrupted {
    /// What happened, and what was kept.
    pub message: String,
    /// The exit code.
    pub code: u8,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Interrupted {}

/// The process exit code for an error: 2 for usage errors, `128 + signal` for a run a signal
/// stopped, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.downcast_ref::<UsageError>().is_some() {
        2
    } else if let Some(stopped) = err.downcast_ref::<Interrupted>() {
        stopped.code
    } else {
        1
    }
}
