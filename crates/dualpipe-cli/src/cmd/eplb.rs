//! `dualpipe eplb`: balance MoE experts over GPUs with DeepSeek's EPLB policies.
//!
//! Three steps, kept apart so new flags and policies slot in: [`parse`] turns flags into a
//! [`Request`] (reading and predicting the loads), [`plan`] calls the library, and
//! [`render_table`] / [`render_json`] print the result.

use std::path::PathBuf;

use anyhow::Context;
use dualpipe_eplb::loads::{read_loads, Predictor};
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
    /// Placement policy; auto = hierarchical when groups divide over nodes, else global.
    #[arg(long, value_enum, default_value_t = PolicyArg::Auto)]
    pub policy: PolicyArg,
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
    /// The reference's choice.
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
    /// `phy2log`, `log2phy`, `logcnt` and `stats`.
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
    /// Policy asked for.
    pub policy: Policy,
    /// Output format.
    pub format: Format,
    /// Output file, if any.
    pub output: Option<PathBuf>,
}

/// Runs `dualpipe eplb`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let request = parse(args)?;
    let plan = plan(&request)?;
    let stats = plan
        .stats(&request.loads)
        .context("computing balance statistics")?;
    let text = match request.format {
        Format::Table => render_table(&request, &plan, &stats),
        Format::Json => render_json(&plan, &stats)?,
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
        PolicyArg::Auto => Policy::Auto,
        PolicyArg::Hierarchical => Policy::Hierarchical,
        PolicyArg::Global => Policy::Global,
    };
    Ok(Request {
        loads,
        source: args.loads,
        replicas: args.replicas,
        groups: args.groups,
        nodes: args.nodes,
        gpus: args.gpus,
        policy,
        format: args.format,
        output: args.output,
    })
}

/// Computes the plan; invalid sizes are [`UsageError`]s.
pub fn plan(request: &Request) -> anyhow::Result<Plan> {
    rebalance_experts_with_policy(
        &request.loads,
        request.replicas,
        request.groups,
        request.nodes,
        request.gpus,
        request.policy,
    )
    .map_err(|e| UsageError(e.to_string()).into())
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
}

/// The plan as JSON: sizes, `phy2log`, `log2phy`, `logcnt` and `stats` (`before`: experts in
/// order over GPUs without replicas; `after`: with the plan). `imbalance` is the hottest GPU
/// over the mean, `balancedness` its inverse.
pub fn render_json(plan: &Plan, stats: &PlanStats) -> anyhow::Result<String> {
    let out = PlanOut {
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
    };
    let mut text = serde_json::to_string(&out)?;
    text.push('\n');
    Ok(text)
}

/// A human summary: per layer and in total, the hottest GPU over the mean and the
/// balancedness before and after, then a bar chart of each GPU's load over all layers.
pub fn render_table(request: &Request, plan: &Plan, stats: &PlanStats) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "EPLB plan for {}: {} layers x {} experts -> {} replicas on {} GPUs ({} nodes, {} groups), policy {}",
        request.source.display(),
        plan.num_layers(),
        plan.num_experts(),
        plan.num_replicas(),
        plan.num_gpus,
        plan.num_nodes,
        plan.num_groups,
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
    s
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
            policy: PolicyArg::Auto,
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
        let plan = plan(&request).unwrap();
        let stats = plan.stats(&request.loads).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&render_json(&plan, &stats).unwrap()).unwrap();
        assert_eq!(v["policy"], "hierarchical");
        assert_eq!(v["phy2log"][0][0], 5);
        assert_eq!(v["log2phy"][0].as_array().unwrap().len(), 12);
        assert_eq!(v["logcnt"][1].as_array().unwrap().len(), 12);
        let after = v["stats"]["after"]["total"]["imbalance"].as_f64().unwrap();
        let before = v["stats"]["before"]["total"]["imbalance"].as_f64().unwrap();
        assert!(after < before);
        let table = render_table(&request, &plan, &stats);
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
    fn bars_scale() {
        assert_eq!(hbar(1.0, 1.0, 4), "████");
        assert_eq!(hbar(0.5, 1.0, 4), "██  ");
        assert_eq!(hbar(0.0, 0.0, 2), "  ");
        assert_eq!(sparkline(&[0.0, 0.5, 1.0], 1.0), " ▄█");
    }
}
