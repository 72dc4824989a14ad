//! `dualpipe compare`: simulate every schedule kind that accepts a configuration.

use std::path::PathBuf;

use dualpipe_sim::report;

use dualpipe_schedule::{ScheduleError, ScheduleKind};

use super::output::{check_paths, write_output};
use super::simulate::{CostArgs, Format};
use super::{count, UsageError};

/// Flags of `dualpipe compare`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of ranks (devices).
    #[arg(long, allow_negative_numbers = true, value_parser = count)]
    pub ranks: usize,
    /// Micro-batches per step.
    #[arg(long, allow_negative_numbers = true, value_parser = count)]
    pub micro_batches: usize,
    /// Stages per rank of the interleaved schedule.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true, value_parser = count)]
    pub virtual_stages: usize,
    /// Durations and communication costs.
    #[command(flatten)]
    pub cost: CostArgs,
    /// Read --f/--b/--w/--fb as one rank's share of a fixed model: kinds with more stages
    /// than ranks (dualpipev, interleaved) run chunks of ranks/PP of them. Default: per stage
    /// chunk, the DualPipe README's basis.
    #[arg(long)]
    pub per_rank_costs: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the table or JSON to FILE instead of stdout.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// Runs `dualpipe compare`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let cost = args.cost.cost_model()?;
    check_paths(&[], ("--output", args.output.as_deref()), &[])?;
    // Sizes no kind can hold (even 1F1B, with one stage per rank) are refused once, naming the
    // flag, rather than once per kind.
    dualpipe_schedule::check_size(ScheduleKind::OneFOneB, args.ranks, args.micro_batches, 1)
        .map_err(|e| match e {
            ScheduleError::InvalidConfig(e) => UsageError(crate::parse::schedule_flags(&e)),
            other => UsageError(other.to_string()),
        })?;
    let basis = if args.per_rank_costs {
        report::CostBasis::PerRank
    } else {
        report::CostBasis::PerStage
    };
    let comparison = report::compare(
        args.ranks,
        args.micro_batches,
        args.virtual_stages,
        &cost,
        basis,
    )
    .map_err(|e| UsageError(e.to_string()))?;
    if comparison.schedules.is_empty() {
        let reasons: Vec<String> = comparison
            .rejected
            .iter()
            .map(|r| r.reason.clone())
            .collect();
        return Err(UsageError(format!(
            "no schedule accepts {} ranks and {} micro-batches ({})",
            args.ranks,
            args.micro_batches,
            reasons.join("; ")
        ))
        .into());
    }
    if args.cost.fb.is_none() {
        eprintln!("{}", super::simulate::FB_DEFAULT_NOTE);
    }
    let text = match args.format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(&comparison)?;
            s.push('\n');
            s
        }
        Format::Table => report::comparison_table(&comparison),
    };
    write_output(args.output.as_deref(), &text)
}
