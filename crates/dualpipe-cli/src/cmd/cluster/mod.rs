//! `dualpipe cluster ...`: EPLB for the cluster (many jobs on a shared pool). `trace` writes a
//! seeded synthetic trace; `simulate` runs a trace under a policy and reports the metrics of
//! docs/cluster.md; `serve` runs real `train` jobs on local slots ([`serve`]), and `submit`,
//! `list` and `cancel` are its clients ([`client`]).

mod client;
mod manifests;
mod progress;
mod serve;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dualpipe_cluster::{
    parse_trace, run_with_progress, svg, synth_trace, write_trace, Cluster, ClusterError, Curve,
    ElasticParams, MoveCost, Outcome, Policy, SimOptions, SynthOptions,
};
use dualpipe_plan::Profile;
use dualpipe_sim::topology::shown;

use crate::cmd::output::{check_paths, write_together};
use crate::cmd::simulate::Format;
use crate::cmd::UsageError;

/// Flags of `dualpipe cluster`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Write a seeded synthetic trace (CSV): most jobs on 1 device, a tail to 64 and more,
    /// heavy-tailed durations, bursty arrivals.
    Trace(TraceArgs),
    /// Simulate a trace on a cluster under a policy; print utilisation, job completion
    /// times, queueing, fragmentation and migrations.
    Simulate(SimulateArgs),
    /// Run real `dualpipe train` jobs on local slots (one rank each), submitted over
    /// HTTP/JSON; move, resize and recover them by checkpoint, stop and resume.
    Serve(serve::ServeArgs),
    /// Submit a job to `serve`: `train`'s flags after `--`.
    Submit(client::SubmitArgs),
    /// List `serve`'s jobs.
    List(client::ListArgs),
    /// Cancel one of `serve`'s jobs (its checkpoints are kept).
    Cancel(client::CancelArgs),
    /// Kubernetes MPIJobs for a placement: one per job, its workers pinned to its nodes.
    Manifests(manifests::ManifestsArgs),
}

/// Flags of `dualpipe cluster trace`.
#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    /// How many jobs.
    #[arg(long, default_value_t = SynthOptions::default().jobs, value_parser = crate::cmd::count)]
    pub jobs: usize,
    /// The seed (the same seed gives the same trace).
    #[arg(long, default_value_t = SynthOptions::default().seed)]
    pub seed: u64,
    /// Devices of the cluster the trace is meant for (sets the arrival rate).
    #[arg(long, default_value_t = SynthOptions::default().devices, value_parser = crate::cmd::count)]
    pub devices: usize,
    /// Offered load: requested device-seconds per second over the devices.
    #[arg(long, allow_negative_numbers = true, default_value_t = SynthOptions::default().load)]
    pub load: f64,
    /// Share of multi-device jobs that are elastic (min gpus/2, max 2 x gpus).
    #[arg(long, allow_negative_numbers = true, default_value_t = SynthOptions::default().elastic_share)]
    pub elastic_share: f64,
    /// Write the CSV to FILE instead of stdout.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// Flags of `dualpipe cluster simulate`.
#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// Cluster file (JSON: links, node groups of devices with speed and memory, per-node
    /// metrics). See docs/cluster.md.
    #[arg(long)]
    pub cluster: PathBuf,
    /// Trace (CSV: job,arrival_s,gpus,duration_s[,min_gpus,max_gpus,profile]); a profile is
    /// a `dualpipe plan` cost profile file, named relative to the trace's folder.
    #[arg(long)]
    pub trace: PathBuf,
    /// Policy: static (first come first served, rigid, never moved, a job that fits in a node
    /// in one node), fifo (first come first served on the lowest-numbered free devices, no
    /// backfill), elastic (EPLB) or las (least attained service first, as Tiresias).
    #[arg(long)]
    pub policy: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the table or JSON to FILE instead of stdout.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Draw devices over time, coloured by job, as an SVG picture.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Elastic: the largest share of a job's run time spent paused by moves.
    #[arg(long, allow_negative_numbers = true, default_value_t = ElasticParams::default().overhead_budget)]
    pub overhead_budget: f64,
    /// Elastic: never grow jobs beyond their requested devices.
    #[arg(long)]
    pub no_grow: bool,
    /// Elastic: never shrink running jobs to admit waiting ones.
    #[arg(long)]
    pub no_shrink: bool,
    /// Elastic: never migrate a spread job into one node.
    #[arg(long)]
    pub no_consolidate: bool,
    /// Seconds to stop, restart and reload a moved job (besides the checkpoint transfer).
    #[arg(long, allow_negative_numbers = true, default_value_t = MoveCost::default().restart_s)]
    pub restart_s: f64,
    /// Checkpoint bytes per device a moved job holds (sent over the inter-node link).
    #[arg(long, allow_negative_numbers = true, default_value_t = MoveCost::default().checkpoint_bytes_per_device)]
    pub checkpoint_bytes_per_device: f64,
    /// Scaling curve: the serial share sigma of a step (jobs without a profile).
    #[arg(long, allow_negative_numbers = true, default_value_t = Curve::default().serial)]
    pub serial: f64,
    /// Write the placement at --placement-at seconds (JSON, for `cluster manifests`) to FILE.
    #[arg(long, requires = "placement_at")]
    pub placement_out: Option<PathBuf>,
    /// The simulated time of --placement-out's placement, in seconds.
    #[arg(long, requires = "placement_out", allow_negative_numbers = true)]
    pub placement_at: Option<f64>,
    /// Scaling curve: the slowdown per node spanned beyond the fewest (jobs without a profile).
    #[arg(long, allow_negative_numbers = true, default_value_t = Curve::default().locality)]
    pub locality: f64,
    /// Tell no progress on stderr (by default a bar on a terminal, otherwise a line every
    /// few seconds).
    #[arg(long)]
    pub quiet: bool,
}

/// Runs `dualpipe cluster ...`.
pub fn run_cluster(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Trace(a) => trace(a),
        Command::Simulate(a) => simulate(a),
        Command::Serve(a) => serve::run_serve(a),
        Command::Submit(a) => client::run_submit(a),
        Command::List(a) => client::run_list(a),
        Command::Cancel(a) => client::run_cancel(a),
        Command::Manifests(a) => manifests::run_manifests(a),
    }
}

fn usage(e: ClusterError) -> anyhow::Error {
    UsageError(e.to_string()).into()
}

/// Reads a settings file the user named (cluster, placement, profile) through
/// [`crate::cmd::read_input`], at most [`dualpipe_io::limits::DOCUMENT`].
fn read_text(path: &Path, flag: &str) -> Result<String, UsageError> {
    crate::cmd::read_input(path, flag, dualpipe_io::limits::DOCUMENT)
}

fn trace(a: TraceArgs) -> anyhow::Result<()> {
    check_paths(&[], ("--output", a.output.as_deref()), &[])?;
    let jobs = synth_trace(&SynthOptions {
        jobs: a.jobs,
        seed: a.seed,
        devices: a.devices,
        load: a.load,
        elastic_share: a.elastic_share,
    })
    .map_err(usage)?;
    write_together(vec![(a.output, write_trace(&jobs).into_bytes())])?;
    // Bursty arrivals make one trace's load wander around the request: say what it drew.
    eprintln!(
        "cluster trace: {} jobs, offered load {:.3} on {} devices (requested device-seconds over devices x arrival window)",
        jobs.len(),
        dualpipe_cluster::offered_load(&jobs, a.devices),
        a.devices
    );
    Ok(())
}

/// A finite number >= 0 (or > 0 when `positive`), or a usage error naming the flag.
pub(crate) fn check_number(flag: &str, v: f64, positive: bool) -> Result<(), UsageError> {
    if v.is_finite() && (v > 0.0 || (!positive && v == 0.0)) {
        return Ok(());
    }
    let bound = if positive { "> 0" } else { ">= 0" };
    Err(UsageError(format!(
        "{flag} {v}: give a finite number {bound}"
    )))
}

fn simulate(a: SimulateArgs) -> anyhow::Result<()> {
    let outputs = [
        ("--svg", a.svg.as_deref()),
        ("--placement-out", a.placement_out.as_deref()),
    ];
    let main_output = ("--output", a.output.as_deref());
    let given = [
        ("--cluster", Some(a.cluster.as_path())),
        ("--trace", Some(a.trace.as_path())),
    ];
    // Every path checked before a byte is read or written; the profiles the trace names are
    // checked again with them once the trace is read.
    check_paths(&given, main_output, &outputs)?;
    if let Some(t) = a.placement_at {
        check_number("--placement-at", t, false)?;
    }
    let mut policy = Policy::by_name(&a.policy).ok_or_else(|| {
        UsageError(format!(
            "--policy {}: unknown policy; give static, fifo, elastic or las",
            a.policy
        ))
    })?;
    if !(0.0..=1.0).contains(&a.overhead_budget) {
        return Err(UsageError(format!(
            "--overhead-budget {}: give a share in [0, 1] (0.05 is 5%)",
            a.overhead_budget
        ))
        .into());
    }
    check_number("--restart-s", a.restart_s, false)?;
    check_number(
        "--checkpoint-bytes-per-device",
        a.checkpoint_bytes_per_device,
        false,
    )?;
    check_number("--serial", a.serial, false)?;
    check_number("--locality", a.locality, false)?;
    if let Policy::Elastic(p) = &mut policy {
        p.overhead_budget = a.overhead_budget;
        p.grow = !a.no_grow;
        p.shrink = !a.no_shrink;
        p.consolidate = !a.no_consolidate;
    }
    let cluster = Cluster::from_json(&read_text(&a.cluster, "--cluster")?)
        .map_err(|e| UsageError(format!("--cluster {}: {e}", a.cluster.display())))?;
    let jobs = parse_trace(&crate::cmd::read_input(
        &a.trace,
        "--trace",
        dualpipe_io::limits::TABLE,
    )?)
    .map_err(|e| UsageError(format!("--trace {}: {e}", a.trace.display())))?;
    let folder = a.trace.parent().unwrap_or(Path::new("."));
    let mut profiles = BTreeMap::new();
    for name in jobs.iter().filter_map(|j| j.profile.as_ref()) {
        if profiles.contains_key(name) {
            continue;
        }
        let path = folder.join(name);
        let profile = Profile::from_json(&read_text(&path, "profile")?)
            .map_err(|e| UsageError(format!("profile {}: {e}", path.display())))?;
        profiles.insert(name.clone(), profile);
    }
    let profile_paths: Vec<(String, PathBuf)> = profiles
        .keys()
        .map(|name| (format!("profile {name}"), folder.join(name)))
        .collect();
    let mut inputs = given.to_vec();
    inputs.extend(
        profile_paths
            .iter()
            .map(|(n, p)| (n.as_str(), Some(p.as_path()))),
    );
    check_paths(&inputs, main_output, &outputs)?;
    let options = SimOptions {
        curve: Curve {
            serial: a.serial,
            locality: a.locality,
        },
        cost: MoveCost {
            restart_s: a.restart_s,
            checkpoint_bytes_per_device: a.checkpoint_bytes_per_device,
        },
    };
    let mut reporter = progress::Reporter::new(a.quiet, jobs.len());
    let outcome = run_with_progress(
        &cluster,
        &jobs,
        &profiles,
        policy.clone(),
        &options,
        &mut |tick| reporter.tick(tick),
    );
    reporter.finish();
    let outcome = outcome.map_err(|e| UsageError(format!("--trace {}: {e}", a.trace.display())))?;
    let mut files = Vec::new();
    if let Some(path) = &a.svg {
        let title = format!(
            "{} policy · {} jobs · {} devices in {} nodes",
            policy.name(),
            jobs.len(),
            cluster.devices(),
            cluster.nodes.len()
        );
        files.push((
            Some(path.clone()),
            svg::render_svg(&outcome, cluster.devices(), &title).into_bytes(),
        ));
    }
    if let (Some(path), Some(t)) = (&a.placement_out, a.placement_at) {
        let placement = dualpipe_cluster::k8s::placement_at(&outcome, &cluster, &jobs, t)
            .map_err(|e| UsageError(format!("--placement-at {}: {e}", shown(t))))?;
        let mut text = serde_json::to_string_pretty(&placement)?;
        text.push('\n');
        files.push((Some(path.clone()), text.into_bytes()));
    }
    let text = match a.format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(&outcome.metrics)?;
            s.push('\n');
            s
        }
        Format::Table => table(policy.name(), &outcome),
    };
    files.push((a.output.clone(), text.into_bytes()));
    write_together(files)
}

/// The human summary of a simulation.
fn table(policy: &str, outcome: &Outcome) -> String {
    let m = &outcome.metrics;
    let h = |s: f64| format!("{:.2} h", s / 3600.0);
    let rows = [
        ("policy", policy.to_string()),
        ("jobs", m.jobs.to_string()),
        ("devices", m.devices.to_string()),
        ("utilisation", format!("{:.1}%", 100.0 * m.utilization)),
        (
            "  in arrivals",
            format!("{:.1}%", 100.0 * m.window_utilization),
        ),
        ("  useful", format!("{:.1}%", 100.0 * m.useful_utilization)),
        ("mean JCT", h(m.mean_jct_s)),
        ("p95 JCT", h(m.p95_jct_s)),
        ("mean queueing", h(m.mean_queue_s)),
        ("  middle half", h(m.middle_mean_queue_s)),
        ("mean queue length", format!("{:.1}", m.mean_queue_length)),
        ("fragmentation", format!("{:.1}%", 100.0 * m.fragmentation)),
        (
            "  while jobs wait",
            format!("{:.1}%", 100.0 * m.waiting_fragmentation),
        ),
        ("migrations", m.migrations.to_string()),
        ("resizes", m.resizes.to_string()),
        (
            "migration overhead",
            format!(
                "{:.2}% (largest job {:.2}%)",
                100.0 * m.migration_overhead,
                100.0 * m.max_job_overhead
            ),
        ),
        ("makespan", h(m.makespan_s)),
        (
            "  rigid bound",
            format!(
                "{} ({:.1}% of the makespan)",
                h(m.makespan_bound_s),
                100.0 * m.bound_share
            ),
        ),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<20} {v}\n"));
    }
    out
}
