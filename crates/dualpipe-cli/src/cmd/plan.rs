//! `dualpipe plan`: search schedule x micro-batches x layer partition x placement for a
//! topology and a cost profile; print the best plans.

use std::path::{Path, PathBuf};

use dualpipe_plan::{
    evaluate, plan_with_progress, PlanError, PlanOptions, PlanReport, PreviousLayers, Profile,
};
use dualpipe_schedule::ScheduleKind;
use dualpipe_sim::svg::{self, SvgOptions};
use dualpipe_sim::Topology;

use super::output::{check_paths, write_together};
use super::simulate::Format;
use super::{parse_kind, progress_bar, UsageError};

/// Flags of `dualpipe plan`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Topology file (JSON: link classes; datacenters of nodes of devices with speed and
    /// memory). See docs/planning.md.
    #[arg(long)]
    pub topology: PathBuf,
    /// Cost profile file (JSON: per-layer F, I, W seconds, activation and parameter bytes).
    #[arg(long)]
    pub profile: PathBuf,
    /// Schedule kinds to try, comma-separated [default: gpipe,1f1b,zb1p,dualpipe,dualpipev].
    #[arg(long, value_delimiter = ',')]
    pub schedules: Vec<String>,
    /// Micro-batch counts to try, comma-separated [default: ranks, 2 x ranks, 4 x ranks].
    #[arg(long, value_delimiter = ',', value_parser = super::count)]
    pub micro_batches: Vec<usize>,
    /// How many plans to print.
    #[arg(long, default_value_t = 5, value_parser = super::count)]
    pub top: usize,
    /// A previous plan (`--format json` output): re-place with the fewest layer moves.
    #[arg(long)]
    pub previous: Option<PathBuf>,
    /// Split the layers evenly and keep the topology's device order (the baseline).
    #[arg(long)]
    pub even: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the table or JSON to FILE instead of stdout.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Draw the best plan's simulated step as an SVG picture.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// No progress bar (it shows only when standard error is a terminal).
    #[arg(long)]
    pub quiet: bool,
}

/// Reads a file the user named ([`super::read_input`]), at most
/// [`dualpipe_io::limits::DOCUMENT`].
fn read_text(path: &Path, flag: &str) -> Result<String, UsageError> {
    super::read_input(path, flag, dualpipe_io::limits::DOCUMENT)
}

/// Runs `dualpipe plan`.
pub fn run(args: Args) -> anyhow::Result<()> {
    check_paths(
        &[
            ("--topology", Some(&args.topology)),
            ("--profile", Some(&args.profile)),
            ("--previous", args.previous.as_deref()),
        ],
        ("--output", args.output.as_deref()),
        &[("--svg", args.svg.as_deref())],
    )?;
    let topology = Topology::from_json(&read_text(&args.topology, "--topology")?)
        .map_err(|e| UsageError(format!("--topology {}: {e}", args.topology.display())))?;
    let profile = Profile::from_json(&read_text(&args.profile, "--profile")?)
        .map_err(|e| UsageError(format!("--profile {}: {e}", args.profile.display())))?;
    let kinds = args
        .schedules
        .iter()
        .map(|s| parse_kind(s.trim()))
        .collect::<Result<Vec<ScheduleKind>, _>>()?;
    if args.micro_batches.contains(&0) {
        return Err(UsageError(
            "--micro-batches: 0 micro-batches cannot make a step; give counts from 1 up".into(),
        )
        .into());
    }
    let previous = match &args.previous {
        None => None,
        Some(path) => Some(
            PreviousLayers::from_json(
                &read_text(path, "--previous")?,
                profile.layers.len(),
                &topology,
            )
            .map_err(|e| UsageError(format!("--previous {}: {e}", path.display())))?,
        ),
    };
    let options = PlanOptions {
        kinds,
        micro_batches: args.micro_batches.clone(),
        even: args.even,
        previous,
    };
    let usage = |e: PlanError| -> anyhow::Error { UsageError(e.to_string()).into() };
    let inputs = format!(
        "--topology {} and --profile {}",
        args.topology.display(),
        args.profile.display()
    );
    let bar = progress_bar(
        args.quiet,
        "planning {pos}/{len} candidates [{elapsed_precise}, about {eta} left] {msg}",
    );
    let searched = plan_with_progress(&topology, &profile, &options, &mut |p| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        bar.set_message(format!(
            "{} with {} micro-batches",
            p.schedule, p.micro_batches
        ));
    });
    bar.finish_and_clear();
    let mut report = searched.map_err(|e| match e {
        PlanError::NoPlan(why) => UsageError(format!("no plan fits {inputs}: {why}")).into(),
        other => usage(other),
    })?;
    if report.plans.is_empty() {
        return Err(UsageError(format!("no plan fits {inputs}: {}", reasons(&report))).into());
    }
    let mut files = Vec::new();
    if let Some(path) = &args.svg {
        let best = &report.plans[0];
        let kind = parse_kind(&best.schedule)?;
        let e = evaluate(&topology, &profile, kind, best.micro_batches, &options).map_err(usage)?;
        let title = format!(
            "{} · {} ranks · {} micro-batches · {} partition",
            dualpipe_sim::report::display_name(kind),
            best.ranks,
            best.micro_batches,
            best.partition
        );
        let m = dualpipe_sim::metrics(&e.timeline, &e.schedule.placement);
        let picture = svg::render_svg(
            &e.timeline,
            &SvgOptions {
                title: Some(title),
                caption: vec![svg::caption(&m), layers_caption(&e.plan)],
            },
        );
        files.push((Some(path.clone()), picture.into_bytes()));
    }
    report.plans.truncate(args.top.max(1));
    let text = match args.format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(&report)?;
            s.push('\n');
            s
        }
        Format::Table => table(&report),
    };
    files.push((args.output.clone(), text.into_bytes()));
    write_together(files)
}

/// The schedule kinds a rejection reason holds for, each with its micro-batch counts.
type KindsRejected<'a> = Vec<(&'a str, Vec<usize>)>;

/// Why no candidate gave a plan: each distinct reason once, with the candidates it holds
/// for (`gpipe x 8, 16; 1f1b x 8`).
fn reasons(report: &PlanReport) -> String {
    let mut causes: Vec<(&str, KindsRejected)> = Vec::new();
    for r in &report.rejected {
        let at = match causes.iter().position(|(reason, _)| *reason == r.reason) {
            Some(i) => i,
            None => {
                causes.push((&r.reason, Vec::new()));
                causes.len() - 1
            }
        };
        let kinds = &mut causes[at].1;
        match kinds.iter_mut().find(|(k, _)| *k == r.schedule) {
            Some((_, counts)) => counts.push(r.micro_batches),
            None => kinds.push((&r.schedule, vec![r.micro_batches])),
        }
    }
    causes
        .iter()
        .map(|(reason, kinds)| {
            let which: Vec<String> = kinds
                .iter()
                .map(|(k, counts)| {
                    let counts: Vec<String> = counts.iter().map(ToString::to_string).collect();
                    format!("{k} x {}", counts.join(", "))
                })
                .collect();
            format!("{reason} ({} micro-batches)", which.join("; "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// "layers per stage 3 6 3" for a picture's caption.
fn layers_caption(plan: &dualpipe_plan::Plan) -> String {
    let sizes: Vec<String> = plan
        .stages
        .iter()
        .map(|s| (s.end_layer - s.first_layer).to_string())
        .collect();
    format!("layers per stage: {}", sizes.join(" "))
}

/// Bytes in GB with one decimal.
fn gb(bytes: f64) -> String {
    format!("{:.1} GB", bytes / 1e9)
}

/// The human table: one line per plan, then the best plan's placement.
pub fn table(report: &PlanReport) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<4} {:<10} {:>6} {:>12} {:>12} {:>7} {:>8} {:>6}  layers per stage\n",
        "#", "schedule", "mbs", "step (s)", "mb/s", "bubble", "memory", "moves"
    ));
    for (i, p) in report.plans.iter().enumerate() {
        let sizes: Vec<String> = p
            .stages
            .iter()
            .map(|s| (s.end_layer - s.first_layer).to_string())
            .collect();
        out.push_str(&format!(
            "{:<4} {:<10} {:>6} {:>12.6} {:>12.3} {:>6.1}% {:>7.1}% {:>6}  {}\n",
            i + 1,
            p.schedule,
            p.micro_batches,
            p.step_time,
            p.throughput,
            100.0 * p.bubble_ratio,
            100.0 * p.peak_memory_share,
            p.layer_moves.map_or("-".to_string(), |m| m.to_string()),
            sizes.join(" ")
        ));
    }
    if let Some(best) = report.plans.first() {
        if best
            .stages
            .iter()
            .any(|s| s.recompute != dualpipe_sim::Recompute::None)
        {
            let modes: Vec<&str> = best.stages.iter().map(|s| s.recompute.name()).collect();
            out.push_str(&format!(
                "recompute per stage (to fit the devices' memory): {}\n",
                modes.join(",")
            ));
        }
        out.push_str(&format!(
            "\nbest: {} with {} micro-batches ({} partition)\n",
            best.schedule, best.micro_batches, best.partition
        ));
        for r in &best.placement {
            let stages: Vec<String> = r.stages.iter().map(|(d, s)| format!("{d}:{s}")).collect();
            let layers = match (r.layers.first(), r.layers.last()) {
                (Some(a), Some(b)) if b - a + 1 == r.layers.len() => format!("{a}-{b}"),
                _ => r
                    .layers
                    .iter()
                    .map(|l| l.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            };
            out.push_str(&format!(
                "  rank {:<3} {:<24} speed {:<5} stages {:<10} layers {:<12} memory {} / {}  busy {:.6} s\n",
                r.rank,
                r.device,
                r.speed,
                stages.join(" "),
                layers,
                gb(r.memory),
                gb(r.memory_capacity),
                r.busy
            ));
        }
    }
    if !report.rejected.is_empty() {
        out.push('\n');
        for r in &report.rejected {
            out.push_str(&format!(
                "not planned: {} with {} micro-batches: {}\n",
                r.schedule, r.micro_batches, r.reason
            ));
        }
    }
    out
}
