//! `dualpipe eplb`: balance MoE experts over GPUs with DeepSeek's EPLB policies, index for
//! index (`--policy deepseek`), or the improved, migration-aware planner (`--policy improved`).
//!
//! Flags -> [`Request`] (loads read and predicted, previous placement read) -> one library
//! call, [`dualpipe_eplb::plan`] -> [`PlanReport`] as a table or JSON.

use std::path::PathBuf;

use dualpipe_eplb::improved::PlannerOptions;
use dualpipe_eplb::loads::{read_loads, Predictor};
use dualpipe_eplb::{
    EplbError, Layout, LoadMatrix, PlanOutcome, PlanReport, Planner, Policy, PreviousPlacement,
    MAX_SLOTS,
};

use crate::cmd::output::{check_paths, write_output};
use crate::cmd::UsageError;

/// Flags of `dualpipe eplb`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Expert loads: .json (`[layers][experts]`, or `[steps][layers][experts]`), .csv (one layer
    /// per line) or .npy (2-D or 3-D; f32, f64, i32, i64).
    #[arg(long, value_name = "FILE")]
    pub loads: PathBuf,
    /// Physical expert slots per layer (replicas), a multiple of --gpus; layers x replicas at
    /// most 16,777,216 (2^24).
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub replicas: usize,
    /// Expert groups (consecutive experts of equal count).
    #[arg(long, value_name = "G", allow_negative_numbers = true)]
    pub groups: usize,
    /// Server nodes; --gpus must be a multiple of it.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub nodes: usize,
    /// GPUs in total.
    #[arg(long, value_name = "R", allow_negative_numbers = true)]
    pub gpus: usize,
    /// Placement policy: improved (the default: duplicate-free, improvement pass, migration-aware with
    /// --previous) or DeepSeek's reference, index for index (deepseek = auto: hierarchical when
    /// groups divide over nodes, else global).
    #[arg(long, value_enum, default_value_t = PolicyArg::Improved)]
    pub policy: PolicyArg,
    /// Previous placement: a JSON output of `dualpipe eplb` or a bare phy2log matrix. The plan
    /// then lists the expert moves (`moves`, `rounds`); the improved policy moves as few as it can.
    #[arg(long, value_name = "FILE")]
    pub previous: Option<PathBuf>,
    /// With --previous (improved policy): how much hotter than a fresh plan a layer's hottest GPU
    /// may be, as a fraction (0.0 = no worse than a fresh plan).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub tolerance: f64,
    /// With --previous (improved policy): leave a layer as it is while its hottest GPU carries at
    /// most X times the mean GPU load.
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub min_imbalance: Option<f64>,
    /// Bytes of one expert's weights; turns move counts into bytes per round and link class.
    #[arg(
        long,
        value_name = "BYTES",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub expert_bytes: u64,
    /// For a 3-D history: predict with an exponential moving average of weight ALPHA in (0, 1].
    #[arg(
        long,
        value_name = "ALPHA",
        conflicts_with = "window",
        allow_negative_numbers = true
    )]
    pub ema: Option<f64>,
    /// For a 3-D history: predict with the mean of the last N steps.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub window: Option<usize>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write to FILE (atomically) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `--policy` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyArg {
    /// Duplicate-free packing, an improvement pass, migration-aware with --previous.
    Improved,
    /// DeepSeek's EPLB, index for index (the reference's own choice of policy).
    Deepseek,
    /// The same as deepseek.
    Auto,
    /// Groups to nodes, replicas within nodes, replicas to GPUs.
    Hierarchical,
    /// Replicate and pack over all GPUs.
    Global,
}

/// `--format` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Balance per layer and a per-GPU bar chart.
    Table,
    /// `phy2log`, `log2phy`, `logcnt`, `stats`, and with --previous `moves` and `rounds`.
    Json,
}

/// Everything `dualpipe eplb` needs, checked and loaded.
#[derive(Debug)]
pub struct Request {
    /// Predicted `[layers][experts]` loads.
    pub loads: LoadMatrix,
    /// Where the loads came from (for headers).
    pub source: PathBuf,
    /// The model and cluster.
    pub layout: Layout,
    /// The balancer and its options.
    pub planner: Planner,
    /// The previous placement and its file, if given.
    pub previous: Option<(PathBuf, PreviousPlacement)>,
    /// Bytes of one expert (0 if unknown).
    pub expert_bytes: u64,
    /// Output format.
    pub format: Format,
    /// Output file, if any.
    pub output: Option<PathBuf>,
}

/// Runs `dualpipe eplb`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let request = parse(args)?;
    let outcome = plan(&request)?;
    let source = request.source.display().to_string();
    let report = PlanReport {
        outcome: &outcome,
        loads: &request.loads,
        source: &source,
    };
    let text = match request.format {
        Format::Table => report.to_table(),
        Format::Json => report.to_json(),
    };
    write_output(request.output.as_deref(), &text)
}

/// Reads the loads and the previous placement and checks the flags; every problem is a
/// [`UsageError`].
pub fn parse(args: Args) -> anyhow::Result<Request> {
    check_paths(
        &[
            ("--loads", Some(&args.loads)),
            ("--previous", args.previous.as_deref()),
        ],
        ("--output", args.output.as_deref()),
        &[],
    )?;
    let predictor = match (args.ema, args.window) {
        (Some(alpha), _) => Predictor::Ema(alpha),
        (None, Some(n)) => Predictor::Window(n),
        (None, None) => Predictor::Mean,
    };
    if args.replicas > MAX_SLOTS {
        return Err(UsageError(format!(
            "--replicas {} is above the cap of {MAX_SLOTS} physical expert slots per plan (layers x replicas); give fewer replicas",
            args.replicas
        ))
        .into());
    }
    let data = read_loads(&args.loads).map_err(|e| UsageError(e.to_string()))?;
    let loads = data
        .predict(predictor)
        .map_err(|e| UsageError(format!("{}: {e}", args.loads.display())))?;
    if loads.rows().saturating_mul(args.replicas) > MAX_SLOTS {
        return Err(UsageError(format!(
            "--replicas {} x {} layers of {} is above the cap of {MAX_SLOTS} physical expert slots per plan; plan fewer layers at a time or give fewer replicas",
            args.replicas,
            loads.rows(),
            args.loads.display()
        ))
        .into());
    }
    let policy = match args.policy {
        PolicyArg::Improved => None,
        PolicyArg::Deepseek | PolicyArg::Auto => Some(Policy::Auto),
        PolicyArg::Hierarchical => Some(Policy::Hierarchical),
        PolicyArg::Global => Some(Policy::Global),
    };
    let planner = match policy {
        Some(_) if args.tolerance != 0.0 || args.min_imbalance.is_some() => {
            return Err(UsageError(
                "--tolerance and --min-imbalance apply to the improved policy; drop them or use --policy improved".into(),
            )
            .into());
        }
        Some(policy) => Planner::Reference(policy),
        None => Planner::Improved(PlannerOptions {
            tolerance: args.tolerance,
            min_imbalance: args.min_imbalance,
            ..PlannerOptions::default()
        }),
    };
    let previous = match args.previous {
        None => None,
        Some(path) => {
            let text = crate::cmd::read_input(&path, "--previous", dualpipe_io::limits::DOCUMENT)?;
            let placement = PreviousPlacement::parse_json(&text)
                .map_err(|e| UsageError(format!("--previous {}: {e}", path.display())))?;
            Some((path, placement))
        }
    };
    Ok(Request {
        layout: Layout::of_loads(&loads, args.replicas, args.groups, args.nodes, args.gpus),
        loads,
        source: args.loads,
        planner,
        previous,
        expert_bytes: args.expert_bytes,
        format: args.format,
        output: args.output,
    })
}

/// Plans with the library; every refusal is a [`UsageError`] naming the flag or file it is
/// about.
pub fn plan(request: &Request) -> anyhow::Result<PlanOutcome> {
    dualpipe_eplb::plan(
        &request.loads,
        &request.layout,
        &request.planner,
        request.previous.as_ref().map(|(_, p)| p),
        request.expert_bytes,
    )
    .map_err(|e| {
        let message = match (&e, &request.previous) {
            (EplbError::Previous(_) | EplbError::PreviousTopology { .. }, Some((path, _))) => {
                format!("--previous {}: {e}", path.display())
            }
            (EplbError::ExpertBytesOverflow { .. }, _) => format!("--expert-bytes: {e}"),
            _ => e.to_string(),
        };
        UsageError(message).into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(loads: PathBuf, replicas: usize, groups: usize) -> Args {
        Args {
            loads,
            replicas,
            groups,
            nodes: 2,
            gpus: 8,
            policy: PolicyArg::Deepseek,
            previous: None,
            tolerance: 0.0,
            min_imbalance: None,
            expert_bytes: 0,
            ema: None,
            window: None,
            format: Format::Json,
            output: None,
        }
    }

    fn readme_file(dir: &std::path::Path) -> PathBuf {
        let path = dir.join("loads.csv");
        std::fs::write(
            &path,
            "90,132,40,61,104,165,39,4,73,56,183,86\n20,107,104,64,19,197,187,157,172,86,16,27\n",
        )
        .unwrap();
        path
    }

    fn report<'a>(request: &'a Request, outcome: &'a PlanOutcome) -> PlanReport<'a> {
        PlanReport {
            outcome,
            loads: &request.loads,
            source: "loads",
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("dualpipe-eplb-cli-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn json_has_the_plan_and_stats() {
        let dir = temp_dir("json");
        let request = parse(args(readme_file(&dir), 16, 4)).unwrap();
        let outcome = plan(&request).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&report(&request, &outcome).to_json()).unwrap();
        assert_eq!(v["policy"], "hierarchical");
        assert_eq!(v["planner"], "deepseek");
        assert_eq!(v["phy2log"][0][0], 5);
        assert_eq!(v["log2phy"][0].as_array().unwrap().len(), 12);
        assert_eq!(v["logcnt"][1].as_array().unwrap().len(), 12);
        let after = v["stats"]["after"]["total"]["imbalance"].as_f64().unwrap();
        let before = v["stats"]["before"]["total"]["imbalance"].as_f64().unwrap();
        assert!(after < before);
        let table = report(&request, &outcome).to_table();
        assert!(
            table.contains("total") && table.contains("GPU   7"),
            "{table}"
        );
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn bad_input_is_a_usage_error() {
        let dir = temp_dir("bad");
        let file = readme_file(&dir);
        let err = plan(&parse(args(file.clone(), 15, 4)).unwrap()).unwrap_err();
        assert_eq!(crate::cmd::exit_code(&err), 2);
        assert!(
            err.to_string().contains("multiple of the number of GPUs"),
            "{err}"
        );
        let err = parse(args(dir.join("missing.json"), 16, 4)).unwrap_err();
        assert_eq!(crate::cmd::exit_code(&err), 2);
        let mut a = args(file, 16, 4);
        a.ema = Some(2.0);
        let err = parse(a).unwrap_err();
        assert_eq!(crate::cmd::exit_code(&err), 2);
        assert!(err.to_string().contains("alpha"), "{err}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn improved_with_previous_lists_moves() {
        let dir = temp_dir("previous");
        let file = readme_file(&dir);
        let mut first = args(file.clone(), 16, 4);
        first.policy = PolicyArg::Improved;
        let request = parse(first).unwrap();
        let outcome = plan(&request).unwrap();
        let previous = dir.join("previous.json");
        std::fs::write(&previous, report(&request, &outcome).to_json()).unwrap();
        // Different loads: reverse every layer.
        let loads = dir.join("loads2.csv");
        std::fs::write(
            &loads,
            "86,183,56,73,4,39,165,104,61,40,132,90\n27,16,86,172,157,187,197,19,64,104,107,20\n",
        )
        .unwrap();
        let mut second = args(loads, 16, 4);
        second.policy = PolicyArg::Improved;
        second.previous = Some(previous.clone());
        second.expert_bytes = 100;
        let request = parse(second).unwrap();
        let outcome = plan(&request).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&report(&request, &outcome).to_json()).unwrap();
        assert_eq!(v["planner"], "improved");
        let moves = v["moves"].as_array().unwrap();
        let rounds = v["rounds"].as_array().unwrap();
        let scheduled: usize = rounds
            .iter()
            .map(|r| r["moves"].as_array().unwrap().len())
            .sum();
        assert_eq!(scheduled, moves.len());
        let table = report(&request, &outcome).to_table();
        assert!(
            table.contains("moves:") && table.contains("layers:"),
            "{table}"
        );
        // The reference policy lists moves too; the improved-only flags are refused with it.
        let mut reference = args(dir.join("loads2.csv"), 16, 4);
        reference.previous = Some(previous.clone());
        assert!(plan(&parse(reference).unwrap()).unwrap().moves.is_some());
        let mut wrong = args(file, 16, 4);
        wrong.tolerance = 0.1;
        assert_eq!(crate::cmd::exit_code(&parse(wrong).unwrap_err()), 2);
        // A previous placement of another shape is a usage error.
        std::fs::write(&previous, "[[0, 1, 2]]").unwrap();
        let mut bad = args(dir.join("loads2.csv"), 16, 4);
        bad.policy = PolicyArg::Improved;
        bad.previous = Some(previous);
        let err = plan(&parse(bad).unwrap()).unwrap_err();
        assert_eq!(crate::cmd::exit_code(&err), 2);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn previous_errors_name_the_file_and_both_shapes() {
        let dir = temp_dir("topology");
        let file = readme_file(&dir);
        let mut first = args(file.clone(), 16, 4);
        first.policy = PolicyArg::Improved;
        let request = parse(first).unwrap();
        let previous = dir.join("previous.json");
        std::fs::write(
            &previous,
            report(&request, &plan(&request).unwrap()).to_json(),
        )
        .unwrap();
        // Made for 8 GPUs on 2 nodes; now 4 GPUs on 1 node, same replicas.
        let mut other = args(file.clone(), 16, 4);
        other.nodes = 1;
        other.gpus = 4;
        other.previous = Some(previous.clone());
        let err = plan(&parse(other).unwrap()).unwrap_err();
        assert_eq!(crate::cmd::exit_code(&err), 2);
        let text = err.to_string();
        assert!(
            text.contains(&format!("--previous {}", previous.display()))
                && text.contains("16 replicas on 8 GPUs in 2 nodes")
                && text.contains("16 replicas on 4 GPUs in 1 nodes"),
            "{text}"
        );
        let mut saturating = args(file.clone(), 16, 4);
        saturating.previous = Some(previous);
        saturating.expert_bytes = u64::MAX;
        let err = plan(&parse(saturating).unwrap()).unwrap_err();
        assert_eq!(crate::cmd::exit_code(&err), 2);
        assert!(err.to_string().starts_with("--expert-bytes:"), "{err}");
        let mut missing = args(file.clone(), 16, 4);
        missing.previous = Some(dir.join("nope.json"));
        let err = parse(missing).unwrap_err();
        assert!(err.to_string().contains("nope.json"), "{err}");
        let mut huge = args(file, 1 << 30, 4);
        huge.policy = PolicyArg::Deepseek;
        let err = parse(huge).unwrap_err();
        assert_eq!(crate::cmd::exit_code(&err), 2);
        assert!(
            err.to_string().starts_with("--replicas 1073741824"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).ok();
    }
}
