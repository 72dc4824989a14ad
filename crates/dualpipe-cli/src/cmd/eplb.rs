//! `dualpipe eplb`: balance MoE experts over GPUs with DeepSeek's EPLB policies, index for
//! index (`--policy deepseek`), or the improved, migration-aware planner (`--policy improved`).
//!
//! Three steps, kept apart so new flags and policies slot in: [`parse`] turns flags into a
//! [`Request`] (reading and predicting the loads, and the previous placement), [`plan`] calls
//! the library, and [`render_table`] / [`render_json`] print the result.

use std::path::PathBuf;

use anyhow::Context;
use dualpipe_eplb::improved::{check_previous, Decision, Layout, PlannerOptions};
use dualpipe_eplb::loads::{read_loads, Predictor};
use dualpipe_eplb::moves::{move_plan, Move, MovePlan, Round};
use dualpipe_eplb::planner_io::{move_summary, parse_previous, phy2log_rows, run_planner};
use dualpipe_eplb::{
    rebalance_experts_with_policy, BalanceStats, LayerBalance, LoadMatrix, Plan, PlanStats, Policy,
};

use crate::cmd::output::write_output;
use crate::cmd::UsageError;

/// Flags of `dualpipe eplb`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Expert loads: .json ([layers][experts], or [steps][layers][experts]), .csv (one layer
    /// per line) or .npy (2-D or 3-D; f32, f64, i32, i64).
    #[arg(long, value_name = "FILE")]
    pub loads: PathBuf,
    /// Physical expert slots per layer (replicas), a multiple of --gpus.
    #[arg(long, value_name = "P")]
    pub replicas: usize,
    /// Expert groups (consecutive experts of equal count).
    #[arg(long, value_name = "G")]
    pub groups: usize,
    /// Server nodes; --gpus must be a multiple of it.
    #[arg(long, value_name = "N")]
    pub nodes: usize,
    /// GPUs in total.
    #[arg(long, value_name = "R")]
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
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub expert_bytes: u64,
    /// For a 3-D history: predict with an exponential moving average of weight ALPHA in (0, 1].
    #[arg(long, value_name = "ALPHA", conflicts_with = "window")]
    pub ema: Option<f64>,
    /// For a 3-D history: predict with the mean of the last N steps.
    #[arg(long, value_name = "N")]
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
    /// Replicas per layer.
    pub replicas: usize,
    /// Expert groups.
    pub groups: usize,
    /// Nodes.
    pub nodes: usize,
    /// GPUs.
    pub gpus: usize,
    /// Policy asked for; `None` for the improved policy.
    pub policy: Option<Policy>,
    /// The previous placement (`[layers][replicas]`), if given.
    pub previous: Option<Vec<Vec<usize>>>,
    /// Options of the improved policy.
    pub options: PlannerOptions,
    /// Bytes of one expert (0 if unknown).
    pub expert_bytes: u64,
    /// Output format.
    pub format: Format,
    /// Output file, if any.
    pub output: Option<PathBuf>,
}

/// A plan and, with a previous placement, how to get there.
#[derive(Debug)]
pub struct Outcome {
    /// The placement.
    pub plan: Plan,
    /// `improved` or `deepseek`.
    pub planner: &'static str,
    /// Per layer, how the improved policy got its placement.
    pub decisions: Option<Vec<Decision>>,
    /// The transfers from the previous placement.
    pub moves: Option<MovePlan>,
}

/// Runs `dualpipe eplb`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let request = parse(args)?;
    let outcome = plan(&request)?;
    let stats = outcome
        .plan
        .stats(&request.loads)
        .context("computing balance statistics")?;
    let text = match request.format {
        Format::Table => render_table(&request, &outcome, &stats),
        Format::Json => render_json(&outcome, &stats)?,
    };
    write_output(request.output.as_deref(), &text)
}

/// Reads the loads and checks the flags; every problem is a [`UsageError`].
pub fn parse(args: Args) -> anyhow::Result<Request> {
    let predictor = match (args.ema, args.window) {
        (Some(alpha), _) => Predictor::Ema(alpha),
        (None, Some(n)) => Predictor::Window(n),
        (None, None) => Predictor::Mean,
    };
    let data = read_loads(&args.loads).map_err(|e| UsageError(e.to_string()))?;
    let loads = data
        .predict(predictor)
        .map_err(|e| UsageError(format!("{}: {e}", args.loads.display())))?;
    let policy = match args.policy {
        PolicyArg::Improved => None,
        PolicyArg::Deepseek | PolicyArg::Auto => Some(Policy::Auto),
        PolicyArg::Hierarchical => Some(Policy::Hierarchical),
        PolicyArg::Global => Some(Policy::Global),
    };
    if policy.is_some() && (args.tolerance != 0.0 || args.min_imbalance.is_some()) {
        return Err(UsageError(
            "--tolerance and --min-imbalance apply to the improved policy; drop them or use --policy improved".into(),
        )
        .into());
    }
    let options = PlannerOptions {
        tolerance: args.tolerance,
        min_imbalance: args.min_imbalance,
        ..PlannerOptions::default()
    };
    options.check().map_err(|e| UsageError(e.to_string()))?;
    let previous = match &args.previous {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| UsageError(format!("cannot read {}: {e}", path.display())))?;
            Some(
                parse_previous(&text)
                    .map_err(|e| UsageError(format!("{}: {e}", path.display())))?,
            )
        }
    };
    Ok(Request {
        loads,
        source: args.loads,
        replicas: args.replicas,
        groups: args.groups,
        nodes: args.nodes,
        gpus: args.gpus,
        policy,
        previous,
        options,
        expert_bytes: args.expert_bytes,
        format: args.format,
        output: args.output,
    })
}

/// Computes the plan (and the moves from the previous placement); invalid sizes and a previous
/// placement that does not fit are [`UsageError`]s.
pub fn plan(request: &Request) -> anyhow::Result<Outcome> {
    let usage = |e: &dyn std::fmt::Display| UsageError(e.to_string());
    let layout = Layout {
        experts: request.loads.cols(),
        replicas: request.replicas,
        groups: request.groups,
        nodes: request.nodes,
        gpus: request.gpus,
    };
    let Some(policy) = request.policy else {
        let run = run_planner(
            &request.loads.to_rows(),
            &layout,
            request.previous.as_deref(),
            &request.options,
            request.expert_bytes,
        )
        .map_err(|e| usage(&e))?;
        return Ok(Outcome {
            decisions: Some(run.improved.layers.iter().map(|l| l.decision).collect()),
            plan: run.plan,
            planner: "improved",
            moves: run.moves,
        });
    };
    let plan = rebalance_experts_with_policy(
        &request.loads,
        request.replicas,
        request.groups,
        request.nodes,
        request.gpus,
        policy,
    )
    .map_err(|e| usage(&e))?;
    let moves = match &request.previous {
        None => None,
        Some(prev) => {
            check_previous(prev, request.loads.rows(), &layout).map_err(|e| usage(&e))?;
            let new = phy2log_rows(&plan).context("the plan has a negative index")?;
            Some(move_plan(
                prev,
                &new,
                request.gpus,
                request.nodes,
                request.expert_bytes,
            ))
        }
    };
    Ok(Outcome {
        plan,
        planner: "deepseek",
        decisions: None,
        moves,
    })
}

/// One layer's (or the total's) balance in the JSON output.
#[derive(serde::Serialize)]
struct BalanceOut {
    max_load: f64,
    mean_load: f64,
    imbalance: f64,
    balancedness: f64,
}

impl From<&LayerBalance> for BalanceOut {
    fn from(b: &LayerBalance) -> Self {
        Self {
            max_load: b.max_load,
            mean_load: b.mean_load,
            imbalance: b.imbalance(),
            balancedness: b.balancedness(),
        }
    }
}

#[derive(serde::Serialize)]
struct StatsOut {
    total: BalanceOut,
    layers: Vec<BalanceOut>,
}

impl From<&BalanceStats> for StatsOut {
    fn from(s: &BalanceStats) -> Self {
        Self {
            total: (&s.total).into(),
            layers: s.layers.iter().map(Into::into).collect(),
        }
    }
}

#[derive(serde::Serialize)]
struct BeforeAfter {
    before: StatsOut,
    after: StatsOut,
}

/// The JSON document; serialised straight from the plan, without an intermediate tree.
#[derive(serde::Serialize)]
struct PlanOut<'a> {
    planner: &'static str,
    policy: Policy,
    num_layers: usize,
    num_experts: usize,
    num_replicas: usize,
    num_groups: usize,
    num_nodes: usize,
    num_gpus: usize,
    phy2log: &'a dualpipe_eplb::Matrix<i64>,
    log2phy: &'a dualpipe_eplb::Tensor3<i64>,
    logcnt: &'a dualpipe_eplb::Matrix<i64>,
    stats: BeforeAfter,
    #[serde(skip_serializing_if = "Option::is_none")]
    decisions: Option<&'a [Decision]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    moves: Option<&'a [Move]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rounds: Option<&'a [Round]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expert_bytes: Option<u64>,
}

/// The plan as JSON: sizes, `phy2log`, `log2phy`, `logcnt` and `stats` (`before`: experts in
/// order over GPUs without replicas; `after`: with the plan). `imbalance` is the hottest GPU
/// over the mean, `balancedness` its inverse. The improved policy adds `decisions` (per layer:
/// fresh, hysteresis, kept, repaired, regrouped, relabelled); a previous placement adds `moves`
/// (layer, expert, src_gpu, src_slot, dst_gpu, dst_slot, inter_node), `rounds` (indices into
/// `moves` with transfers and bytes per link class) and `expert_bytes`.
pub fn render_json(outcome: &Outcome, stats: &PlanStats) -> anyhow::Result<String> {
    let plan = &outcome.plan;
    let out = PlanOut {
        planner: outcome.planner,
        policy: plan.policy,
        num_layers: plan.num_layers(),
        num_experts: plan.num_experts(),
        num_replicas: plan.num_replicas(),
        num_groups: plan.num_groups,
        num_nodes: plan.num_nodes,
        num_gpus: plan.num_gpus,
        phy2log: &plan.phy2log,
        log2phy: &plan.log2phy,
        logcnt: &plan.logcnt,
        stats: BeforeAfter {
            before: (&stats.before).into(),
            after: (&stats.after).into(),
        },
        decisions: outcome.decisions.as_deref(),
        moves: outcome.moves.as_ref().map(|m| m.moves.as_slice()),
        rounds: outcome.moves.as_ref().map(|m| m.rounds.as_slice()),
        expert_bytes: outcome.moves.as_ref().map(|m| m.expert_bytes),
    };
    let mut text = serde_json::to_string(&out)?;
    text.push('\n');
    Ok(text)
}

/// A human summary: per layer and in total, the hottest GPU over the mean and the
/// balancedness before and after, then a bar chart of each GPU's load over all layers.
pub fn render_table(request: &Request, outcome: &Outcome, stats: &PlanStats) -> String {
    use std::fmt::Write;
    let plan = &outcome.plan;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "EPLB plan for {}: {} layers x {} experts -> {} replicas on {} GPUs ({} nodes, {} groups), {} policy ({})",
        request.source.display(),
        plan.num_layers(),
        plan.num_experts(),
        plan.num_replicas(),
        plan.num_gpus,
        plan.num_nodes,
        plan.num_groups,
        outcome.planner,
        plan.policy,
    );
    let _ = writeln!(
        s,
        "before: experts in order over GPUs, one copy each; after: this plan (max {} replicas of an expert)",
        plan.max_replicas()
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:>6}  {:>13}  {:>13}  {:>14}  {:>13}",
        "layer", "max/mean bef.", "max/mean aft.", "balanced. bef.", "balanced. aft."
    );
    let row = |s: &mut String, name: &str, b: &LayerBalance, a: &LayerBalance| {
        let _ = writeln!(
            s,
            "{:>6}  {:>12.3}x  {:>12.3}x  {:>14.3}  {:>14.3}",
            name,
            b.imbalance(),
            a.imbalance(),
            b.balancedness(),
            a.balancedness()
        );
    };
    for (l, (b, a)) in stats
        .before
        .layers
        .iter()
        .zip(&stats.after.layers)
        .enumerate()
    {
        row(&mut s, &l.to_string(), b, a);
    }
    row(&mut s, "total", &stats.before.total, &stats.after.total);

    // Per-GPU load summed over layers, before and after, on one scale.
    let before = per_gpu_total(&dualpipe_eplb::stats::baseline_gpu_loads(
        &request.loads,
        plan.num_gpus,
    ));
    let after = plan
        .gpu_loads(&request.loads)
        .map(|m| per_gpu_total(&m))
        .unwrap_or_default();
    let scale = before.iter().chain(&after).copied().fold(0.0, f64::max);
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "load per GPU, all layers added up (full bar = {scale:.1})"
    );
    if plan.num_gpus <= 32 {
        for (g, (b, a)) in before.iter().zip(&after).enumerate() {
            let _ = writeln!(
                s,
                "GPU {g:>3}  before {}  {b:>10.3}\n         after  {}  {a:>10.3}",
                hbar(*b, scale, 30),
                hbar(*a, scale, 30)
            );
        }
    } else {
        let _ = writeln!(s, "before {}", sparkline(&before, scale));
        let _ = writeln!(s, "after  {}", sparkline(&after, scale));
        let _ = writeln!(s, "       (one column per GPU, 0 .. {})", plan.num_gpus - 1);
    }
    if let Some(decisions) = &outcome.decisions {
        if request.previous.is_some() {
            let mut counts: Vec<(Decision, usize)> = Vec::new();
            for &d in decisions {
                match counts.iter_mut().find(|(k, _)| *k == d) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((d, 1)),
                }
            }
            let parts: Vec<String> = counts
                .iter()
                .map(|(d, n)| format!("{n} {}", decision_name(*d)))
                .collect();
            let _ = writeln!(s);
            let _ = writeln!(s, "layers: {}", parts.join(", "));
        }
    }
    if let Some(m) = &outcome.moves {
        if outcome.decisions.is_none() {
            let _ = writeln!(s);
        }
        s += &move_summary(m, plan.num_layers() * plan.num_replicas());
    }
    s
}

fn decision_name(d: Decision) -> &'static str {
    match d {
        Decision::Fresh => "fresh",
        Decision::Hysteresis => "left alone (hysteresis)",
        Decision::Kept => "kept",
        Decision::Repaired => "repaired",
        Decision::Regrouped => "regrouped",
        Decision::Relabelled => "relabelled",
    }
}

fn per_gpu_total(m: &dualpipe_eplb::Matrix<f64>) -> Vec<f64> {
    let mut out = vec![0.0; m.cols()];
    for row in m.iter_rows() {
        for (o, v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
    out
}

/// A horizontal bar of `width` cells with eighth-block resolution.
fn hbar(value: f64, scale: f64, width: usize) -> String {
    const PARTS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
    let eighths = if scale > 0.0 {
        ((value / scale) * (width * 8) as f64).round() as usize
    } else {
        0
    }
    .min(width * 8);
    let mut bar: String = std::iter::repeat_n('█', eighths / 8).collect();
    if eighths % 8 != 0 {
        bar.push(PARTS[eighths % 8]);
    }
    format!("{bar:<width$}")
}

/// One column per value, heights in eighths.
fn sparkline(values: &[f64], scale: f64) -> String {
    const LEVELS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    values
        .iter()
        .map(|&v| {
            let i = if scale > 0.0 {
                ((v / scale) * 8.0).round() as usize
            } else {
                0
            };
            LEVELS[i.min(8)]
        })
        .collect()
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
        let stats = outcome.plan.stats(&request.loads).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&render_json(&outcome, &stats).unwrap()).unwrap();
        assert_eq!(v["policy"], "hierarchical");
        assert_eq!(v["planner"], "deepseek");
        assert_eq!(v["phy2log"][0][0], 5);
        assert_eq!(v["log2phy"][0].as_array().unwrap().len(), 12);
        assert_eq!(v["logcnt"][1].as_array().unwrap().len(), 12);
        let after = v["stats"]["after"]["total"]["imbalance"].as_f64().unwrap();
        let before = v["stats"]["before"]["total"]["imbalance"].as_f64().unwrap();
        assert!(after < before);
        let table = render_table(&request, &outcome, &stats);
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
        let stats = outcome.plan.stats(&request.loads).unwrap();
        let previous = dir.join("previous.json");
        std::fs::write(&previous, render_json(&outcome, &stats).unwrap()).unwrap();
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
        let stats = outcome.plan.stats(&request.loads).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&render_json(&outcome, &stats).unwrap()).unwrap();
        assert_eq!(v["planner"], "improved");
        let moves = v["moves"].as_array().unwrap();
        let rounds = v["rounds"].as_array().unwrap();
        let scheduled: usize = rounds
            .iter()
            .map(|r| r["moves"].as_array().unwrap().len())
            .sum();
        assert_eq!(scheduled, moves.len());
        let table = render_table(&request, &outcome, &stats);
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
    fn bars_scale() {
        assert_eq!(hbar(1.0, 1.0, 4), "████");
        assert_eq!(hbar(0.5, 1.0, 4), "██  ");
        assert_eq!(hbar(0.0, 0.0, 2), "  ");
        assert_eq!(sparkline(&[0.0, 0.5, 1.0], 1.0), " ▄█");
    }
}
