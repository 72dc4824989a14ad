//! `dualpipe schedule`: generate, lower and validate a schedule; print it as a table, JSON (the
//! golden schema, with communication) or torch's compute-only CSV.

use std::fmt::Write as _;
use std::path::PathBuf;

use dualpipe_schedule::format::{csv, json};
use dualpipe_schedule::{build, Chunk, Op, Schedule, ScheduleError};

use super::output::{check_paths, write_output};
use super::UsageError;

/// Output format of `dualpipe schedule`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One line of compute ops per rank, with a header and a legend.
    Table,
    /// The lowered schedule (with SEND/RECV ops) in the golden JSON schema.
    Json,
    /// torch.distributed.pipelining's compute-only action CSV (one row per rank).
    Csv,
}

/// Flags of `dualpipe schedule`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Which schedule, on how many ranks and micro-batches.
    #[command(flatten)]
    pub sched: super::ScheduleArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write to this file (atomically) instead of stdout.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// Runs `dualpipe schedule`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let (kind, virtual_stages) = args.sched.kind_and_virtual_stages()?;
    let (ranks, micro_batches) = (args.sched.ranks, args.sched.micro_batches);
    check_paths(&[], ("--output", args.output.as_deref()), &[])?;
    let schedule = match build(kind, ranks, micro_batches, virtual_stages) {
        Ok(s) => s,
        Err(ScheduleError::InvalidConfig(e)) => {
            return Err(UsageError(crate::parse::schedule_flags(&e)).into())
        }
        Err(e) => return Err(anyhow::Error::new(e).context(format!("{kind} schedule is invalid"))),
    };
    let text = match args.format {
        Format::Table => table(&schedule),
        Format::Json => json::to_string(&schedule) + "\n",
        Format::Csv => csv::to_string(&schedule),
    };
    write_output(args.output.as_deref(), &text)
}

/// Widest table line before a rank's ops wrap onto a continuation line.
const WIDTH: usize = 100;

/// The human table: a header, a legend, then each rank's compute ops (wrapped at [`WIDTH`]).
pub fn table(schedule: &Schedule) -> String {
    let placement = &schedule.placement;
    let dirs = placement.dirs();
    let stages_of: Vec<Vec<(usize, usize)>> = (0..schedule.ranks)
        .map(|r| placement.stages_of(r))
        .collect();
    let multi = stages_of.iter().any(|s| s.len() > 1);
    let mut out = String::new();
    let per_dir = if dirs > 1 {
        format!(" ({} per direction)", schedule.micro_batches_per_dir())
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "schedule {}: {} ranks, {} micro-batches{per_dir}, {} stages{}",
        schedule.kind,
        schedule.ranks,
        schedule.micro_batches,
        placement.stages(),
        if dirs > 1 {
            format!(" in each of {dirs} directions")
        } else {
            String::new()
        }
    );
    let compute: Vec<usize> = schedule
        .programs
        .iter()
        .map(|p| p.iter().filter(|op| op.is_compute()).count())
        .collect();
    let comm: usize = schedule
        .programs
        .iter()
        .flatten()
        .filter(|op| !op.is_compute())
        .count();
    let _ = writeln!(
        out,
        "ops: {} compute, {comm} send/recv (not shown; --format json lists them); validated",
        compute.iter().sum::<usize>()
    );
    out.push_str(
        "legend: F forward, B full backward, I input-gradient backward, W weight gradient,\n",
    );
    out.push_str("        FB(f|b) forward of f overlapped with full backward of b;\n");
    if multi {
        let slot = if dirs > 1 { "dir/stage" } else { "stage" };
        let _ = writeln!(
            out,
            "        x.m = micro-batch m{} at the rank's stage x (from 0; [{slot}] lists them)",
            if dirs > 1 { " of its direction" } else { "" }
        );
    } else {
        out.push_str("        m = micro-batch m at the rank's one stage (rank r runs stage r)\n");
    }
    let label_width = format!("rank {}", schedule.ranks.saturating_sub(1)).len();
    for (rank, program) in schedule.programs.iter().enumerate() {
        let slots = &stages_of[rank];
        let mut label = format!("{:<label_width$}", format!("rank {rank}"));
        if multi {
            let names: Vec<String> = slots
                .iter()
                .map(|&(d, s)| {
                    if dirs > 1 {
                        format!("{d}/{s}")
                    } else {
                        s.to_string()
                    }
                })
                .collect();
            label.push_str(&format!(" [{}]", names.join(" ")));
        }
        let name = |c: Chunk| {
            if multi {
                let slot = slots
                    .iter()
                    .position(|&ds| ds == (c.dir, c.stage))
                    .unwrap_or(0);
                format!("{slot}.{}", c.mb)
            } else {
                c.mb.to_string()
            }
        };
        let cells: Vec<String> = program
            .iter()
            .filter_map(|op| match *op {
                Op::F(c) => Some(format!("F{}", name(c))),
                Op::B(c) => Some(format!("B{}", name(c))),
                Op::I(c) => Some(format!("I{}", name(c))),
                Op::W(c) => Some(format!("W{}", name(c))),
                Op::FB { f, b } => Some(format!("FB({}|{})", name(f), name(b))),
                _ => None,
            })
            .collect();
        wrap_line(&mut out, &label, &cells);
    }
    out
}

/// Writes `label | cell cell ...`, continuing on lines indented to the `|` when too wide.
fn wrap_line(out: &mut String, label: &str, cells: &[String]) {
    let indent = " ".repeat(label.len());
    let mut line = format!("{label} |");
    let mut empty = true;
    for cell in cells {
        if !empty && line.len() + 1 + cell.len() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = format!("{indent} |");
        }
        line.push(' ');
        line.push_str(cell);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualpipe_schedule::ScheduleKind;

    #[test]
    fn table_names_kind_sizes_and_every_compute_op() {
        let s = build(ScheduleKind::OneFOneB, 2, 3, 1).unwrap();
        let t = table(&s);
        assert!(
            t.starts_with("schedule 1f1b: 2 ranks, 3 micro-batches, 2 stages\n"),
            "{t}"
        );
        assert!(t.contains("rank 0 | F0 F1 B0 F2 B1 B2\n"), "{t}");
        assert!(t.contains("rank 1 | F0 B0 F1 B1 F2 B2\n"), "{t}");
    }

    #[test]
    fn table_wraps_and_labels_stages() {
        let s = build(ScheduleKind::Interleaved, 2, 16, 2).unwrap();
        let t = table(&s);
        assert!(t.contains("rank 0 [0 2] | F0.0 F0.1"), "{t}");
        assert!(t.lines().all(|l| l.len() <= WIDTH), "{t}");
        assert!(t.contains("\n             | "), "{t}");
    }
}
