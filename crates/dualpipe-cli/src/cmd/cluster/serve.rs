//! `dualpipe cluster serve`: the real mode's scheduler, running `dualpipe train` processes
//! on local slots ([`TrainLauncher`] knows `train`'s flags; `dualpipe_cluster::serve` does
//! the rest).

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::train_args::TrainArgs;
use dualpipe_cluster::serve::{
    serve, JobPaths, JobRecord, Launch, Launcher, PolicyParams, ServeOptions,
};
use dualpipe_sim::topology::shown;

use super::check_number;
use crate::cmd::UsageError;

/// The default address of the scheduler's API (and of the clients).
pub const DEFAULT_ADDR: &str = "127.0.0.1:7070";

/// Flags of `dualpipe cluster serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Slots to run jobs on; a slot holds one rank.
    #[arg(long, value_parser = crate::cmd::count)]
    pub slots: usize,
    /// State directory: the journal, and each job's checkpoints, run log and output.
    #[arg(long)]
    pub state: PathBuf,
    /// Address of the HTTP/JSON API and of the scheduler's metrics (`/metrics`); loopback
    /// only unless --allow-remote.
    #[arg(long, default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// Let --addr be an address beyond loopback: anyone who reaches it and holds the token
    /// (DIR/token) runs jobs as this user, over unencrypted HTTP (docs/cluster.md, "Trust
    /// model").
    #[arg(long)]
    pub allow_remote: bool,
    /// A folder jobs may read from (--data, --plan); repeatable. Without one, a job reads
    /// nothing but what it writes in its own folder.
    #[arg(long, value_name = "DIR")]
    pub data_root: Vec<PathBuf>,
    /// Seconds between two scrapes of each job's metrics.
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
    pub scrape_interval: f64,
    /// Seconds between two decisions of the policy.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub tick: f64,
    /// Slots per node: a job that fits in a node is placed in one (default: all slots).
    #[arg(long, value_parser = crate::cmd::count)]
    pub node_size: Option<usize>,
    /// The largest share of a job's expected run time spent paused by moves.
    #[arg(long, default_value_t = PolicyParams::default().overhead_budget, allow_negative_numbers = true)]
    pub overhead_budget: f64,
    /// A move's expected pause (seconds) until one of the job's moves was measured.
    #[arg(long, default_value_t = PolicyParams::default().move_cost_s, allow_negative_numbers = true)]
    pub move_cost_s: f64,
    /// Crashes of one job resumed from its checkpoint before it is given up.
    #[arg(long, default_value_t = 3)]
    pub max_restarts: u32,
    /// Seconds the jobs get to write their final checkpoints when the scheduler stops.
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true)]
    pub stop_grace: f64,
    /// Never grow running jobs into free slots.
    #[arg(long)]
    pub no_grow: bool,
    /// Never shrink running jobs to admit queued ones.
    #[arg(long)]
    pub no_shrink: bool,
    /// Never migrate a running job (a job spread over nodes is not consolidated into one).
    #[arg(long)]
    pub no_migrate: bool,
}

/// `train`'s flags the scheduler sets itself; a job may not give them.
const SET_BY_SCHEDULER: [&str; 11] = [
    "--ranks",
    "--checkpoint-dir",
    "--resume",
    "--resume-from",
    "--metrics-addr",
    "--log",
    "--transport",
    "--schedule-file",
    "--init-from",
    "--data-parallel",
    "--inject-failure",
];

/// Runs jobs as `dualpipe train` processes (this very program).
///
/// A job's flags describe its model on `min_ranks` ranks; on another rank count the
/// scheduler keeps the model (its blocks) and sets `--layers-per-stage` to the blocks over
/// that count's model stages, so a resize resumes the same model from the same checkpoint.
pub struct TrainLauncher {
    program: PathBuf,
    /// The folders a job may read from (canonical).
    data_roots: Vec<PathBuf>,
}

/// The most chunks (ranks x micro-batches) of one rank count's schedule built to check a
/// submission; a larger shape is refused there.
const MAX_CHECK_CHUNKS: usize = 1 << 18;
/// The most chunks built in all to check one submission; rank counts beyond are not allowed.
const MAX_CHECK_TOTAL: usize = 1 << 21;

/// `train`'s flags parsed, or the one-line reason.
fn parse(flags: &[String]) -> Result<TrainArgs, String> {
    // The scheduler gives every job a checkpoint directory (flags such as
    // --checkpoint-every require one); resolving the flags does not touch it.
    let mut flags = flags.to_vec();
    flags.extend(["--checkpoint-dir".to_string(), "checkpoints".to_string()]);
    TrainArgs::try_parse_flags(&flags).map_err(|e| {
        let text = e.render().to_string();
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
            .filter(|l| !l.is_empty())
            .collect();
        let line = lines.join(" ");
        line.strip_prefix("error: ").unwrap_or(&line).to_string()
    })
}

/// `train`'s flags parsed and resolved, or the one-line reason; the schedule built (its
/// chunks taken from `budget`) when it is within the check's bounds.
fn resolve(flags: &[String], budget: &mut usize) -> Result<dualpipe_train::TrainConfig, String> {
    let parsed = parse(flags)?;
    let (config, given) = parsed.config().map_err(crate::parse::message)?;
    // The schedule's own rules (dualpipe folds over an even number of ranks, for example)
    // are checked when it is built: build it, so that a rank count it refuses is refused
    // here, not by the job's process once it is placed.
    if given.is_none() {
        let s = &config.schedule;
        let chunks = s.ranks.saturating_mul(s.micro_batches);
        if chunks > MAX_CHECK_CHUNKS.min(*budget) {
            return Err(format!(
                "{} ranks x {} micro-batches: more than the scheduler checks at submission \
                 ({MAX_CHECK_CHUNKS} chunks per rank count, {MAX_CHECK_TOTAL} in all); give \
                 fewer micro-batches or a narrower rank range",
                s.ranks, s.micro_batches
            ));
        }
        *budget -= chunks;
        config.build_schedule().map_err(crate::parse::message)?;
    }
    Ok(config)
}

/// Where a job's paths may point: `train`'s file flags, checked before anything is read.
/// Outputs (`-o`, `--trace`, `--svg`, `--save`, `--profile`) are relative paths without
/// `..`, so they land in the job's own folder (its processes' working directory); inputs
/// (`--data`, `--plan`) are absolute paths that resolve, symbolic links followed, inside one
/// of `roots`.
fn confine(args: &TrainArgs, roots: &[PathBuf]) -> Result<(), String> {
    let outputs = [
        ("--output", &args.output),
        ("--trace", &args.trace),
        ("--svg", &args.svg),
        ("--save", &args.save),
        ("--profile", &args.layout.profile),
    ];
    for (flag, path) in outputs {
        let Some(path) = path else { continue };
        let inside = path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
            && path.file_name().is_some();
        if !inside {
            return Err(format!(
                "{flag} {}: a job writes only in its own folder; give a relative path without \
                 `..` (it lands in DIR/jobs/ID/files)",
                path.display()
            ));
        }
    }
    let inputs = [
        ("--data", &args.data),
        ("--plan", &args.layout.plan),
        ("--schedule-file", &args.schedule_file),
        ("--init-from", &args.init_from),
        ("--resume-from", &args.resume_from),
    ];
    for (flag, path) in inputs {
        let Some(path) = path else { continue };
        readable(flag, path, roots)?;
    }
    Ok(())
}

/// Whether a job may read `path`: absolute, and inside a data root once resolved.
fn readable(flag: &str, path: &Path, roots: &[PathBuf]) -> Result<(), String> {
    let outside = || {
        let allowed = if roots.is_empty() {
            "the scheduler allows no data root (serve --data-root DIR)".to_string()
        } else {
            let list: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
            format!("the data roots are {}", list.join(", "))
        };
        format!(
            "{flag} {}: a job reads only under the scheduler's data roots; {allowed}",
            path.display()
        )
    };
    if !path.is_absolute() {
        return Err(format!(
            "{flag} {}: give an absolute path under a data root (a job's own folder starts \
             empty)",
            path.display()
        ));
    }
    let real =
        std::fs::canonicalize(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if roots.iter().any(|r| real.starts_with(r)) {
        Ok(())
    } else {
        Err(outside())
    }
}

/// `args` without any `--layers-per-stage` (the scheduler sets it per rank count).
fn without_layers(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
        } else if a == "--layers-per-stage" {
            skip = true;
        } else if !a.starts_with("--layers-per-stage=") {
            out.push(a.clone());
        }
    }
    out
}

impl TrainLauncher {
    /// The flags of `args` on `ranks` ranks with the model of `min_ranks`, and its steps.
    fn flags(
        &self,
        args: &[String],
        min_ranks: usize,
        ranks: usize,
        budget: &mut usize,
    ) -> Result<(Vec<String>, usize), String> {
        for a in args {
            let flag = a.split('=').next().unwrap_or(a);
            if SET_BY_SCHEDULER.contains(&flag) {
                return Err(format!(
                    "{flag}: the scheduler sets it (ranks from the slots, checkpoints, log and metrics in --state); leave it out"
                ));
            }
        }
        let with = |args: &[String], k: usize, layers: Option<usize>| {
            let mut f = args.to_vec();
            f.extend(["--ranks".to_string(), k.to_string()]);
            if let Some(l) = layers {
                f.extend(["--layers-per-stage".to_string(), l.to_string()]);
            }
            f
        };
        confine(&parse(args)?, &self.data_roots)?;
        let base = resolve(&with(args, min_ranks, None), budget)?;
        if ranks == min_ranks {
            return Ok((with(args, ranks, None), base.steps));
        }
        if args
            .iter()
            .any(|a| a.starts_with("--partition") || a.starts_with("--plan"))
        {
            return Err("--partition and --plan fix the stages of one rank count; give min_ranks = max_ranks".into());
        }
        let blocks = base.model_stages() * base.model.layers_per_stage;
        let rest = without_layers(args);
        let stages = parse(&with(&rest, ranks, Some(1)))?
            .config()
            .map_err(crate::parse::message)?
            .0
            .model_stages();
        if stages == 0 || blocks % stages != 0 {
            return Err(format!(
                "the model's {blocks} blocks do not split evenly over {stages} model stages"
            ));
        }
        let flags = with(&rest, ranks, Some(blocks / stages));
        let config = resolve(&flags, budget)?;
        Ok((flags, config.steps))
    }
}

impl Launcher for TrainLauncher {
    fn check(
        &self,
        args: &[String],
        min_ranks: usize,
        max_ranks: usize,
    ) -> Result<(Vec<usize>, usize), String> {
        let mut budget = MAX_CHECK_TOTAL;
        let (_, steps) = self
            .flags(args, min_ranks, min_ranks, &mut budget)
            .map_err(|e| format!("on {min_ranks} ranks: {e}"))?;
        let mut allowed = vec![min_ranks];
        for k in min_ranks + 1..=max_ranks {
            if budget == 0 {
                break;
            }
            if self.flags(args, min_ranks, k, &mut budget).is_ok() {
                allowed.push(k);
            }
        }
        Ok((allowed, steps))
    }

    fn command(
        &self,
        job: &JobRecord,
        ranks: usize,
        paths: &JobPaths,
        metrics_addr: &str,
    ) -> Result<Launch, String> {
        // Checked at submission within the bounds: no budget here.
        let mut unbounded = usize::MAX;
        let (flags, _) = self.flags(&job.args, job.min_ranks, ranks, &mut unbounded)?;
        let mut args = vec!["train".to_string()];
        args.extend(flags);
        for (flag, value) in [
            ("--checkpoint-dir", paths.checkpoints.display().to_string()),
            ("--metrics-addr", metrics_addr.to_string()),
            ("--log", paths.log.display().to_string()),
        ] {
            args.push(flag.to_string());
            args.push(value);
        }
        args.push("--resume".to_string());
        Ok(Launch {
            program: self.program.clone(),
            args,
            cwd: paths.files.clone(),
        })
    }
}

/// The longest interval a flag of `serve` takes, in seconds (about 31 years).
const MAX_SECONDS: f64 = 1e9;

/// Seconds as a duration, or a usage error naming the flag.
fn seconds(flag: &str, v: f64) -> Result<Duration, UsageError> {
    check_number(flag, v, true)?;
    if v > MAX_SECONDS {
        return Err(UsageError(format!(
            "{flag} {}: too long; give at most {MAX_SECONDS:e} seconds",
            shown(v)
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Runs `dualpipe cluster serve`.
pub fn run_serve(a: ServeArgs) -> anyhow::Result<()> {
    if a.node_size == Some(0) {
        return Err(UsageError("--node-size 0: give at least 1 slot per node".into()).into());
    }
    let tick = seconds("--tick", a.tick)?;
    let scrape_interval = seconds("--scrape-interval", a.scrape_interval)?;
    let stop_grace = seconds("--stop-grace", a.stop_grace)?;
    check_number("--move-cost-s", a.move_cost_s, false)?;
    if !(0.0..=1.0).contains(&a.overhead_budget) {
        return Err(UsageError(format!(
            "--overhead-budget {}: give a share in [0, 1] (0.05 is 5%)",
            a.overhead_budget
        ))
        .into());
    }
    if a.state.exists() && !a.state.is_dir() {
        return Err(UsageError(format!(
            "--state {}: is not a directory; give a directory (created when missing)",
            a.state.display()
        ))
        .into());
    }
    let program = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find this program to run `train` with: {e}"))?;
    let mut data_roots = Vec::new();
    for root in &a.data_root {
        let real = std::fs::canonicalize(root)
            .ok()
            .filter(|r| r.is_dir())
            .ok_or_else(|| {
                UsageError(format!(
                    "--data-root {}: not a folder; give an existing folder jobs may read from",
                    root.display()
                ))
            })?;
        data_roots.push(real);
    }
    let options = ServeOptions {
        slots: a.slots,
        state: a.state,
        addr: a.addr,
        tick,
        scrape_interval,
        policy: PolicyParams {
            node_size: a.node_size.unwrap_or(a.slots),
            overhead_budget: a.overhead_budget,
            move_cost_s: a.move_cost_s,
            grow: !a.no_grow,
            shrink: !a.no_shrink,
            migrate: !a.no_migrate,
            ..PolicyParams::default()
        },
        max_restarts: a.max_restarts,
        stop_grace,
        allow_remote: a.allow_remote,
    };
    dualpipe_io::defer_signals();
    // The session log goes to stdout; a closed stdout must not end (or panic) the scheduler.
    let mut say = |line: &str| {
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), "{line}");
    };
    serve(
        options,
        Arc::new(TrainLauncher {
            program,
            data_roots,
        }),
        dualpipe_io::interrupted,
        &mut say,
    )
    .map_err(|e| UsageError(e.to_string()).into())
}
