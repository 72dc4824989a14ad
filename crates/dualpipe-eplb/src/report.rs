//! Reports of a plan: [`PlanReport`] renders a [`PlanOutcome`] as the JSON document of
//! `dualpipe eplb --format json` and as its human table.

use crate::balance::PlanOutcome;
use crate::improved::Decision;
use crate::matrix::LoadMatrix;
use crate::moves::{Move, MovePlan, Round};
use crate::plan::Policy;
use crate::stats::{BalanceStats, LayerBalance};

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
    phy2log: &'a crate::Matrix<i64>,
    log2phy: &'a crate::Tensor3<i64>,
    logcnt: &'a crate::Matrix<i64>,
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

/// The JSON document and the human table of a [`PlanOutcome`].
#[derive(Clone, Copy, Debug)]
pub struct PlanReport<'a> {
    /// The outcome to report.
    pub outcome: &'a PlanOutcome,
    /// The loads it was planned for (the table's per-GPU bars).
    pub loads: &'a LoadMatrix,
    /// Where the loads came from, for the table's header (a file name).
    pub source: &'a str,
}

impl<'a> PlanReport<'a> {
    /// The plan as JSON: sizes, `phy2log`, `log2phy`, `logcnt` and `stats` (`before`: experts in
    /// order over GPUs without replicas; `after`: with the plan). `imbalance` is the hottest GPU
    /// over the mean, `balancedness` its inverse. The improved policy adds `decisions` (per layer:
    /// fresh, hysteresis, kept, repaired, regrouped, relabelled); a previous placement adds `moves`
    /// (layer, expert, src_gpu, src_slot, dst_gpu, dst_slot, inter_node), `rounds` (indices into
    /// `moves` with transfers and bytes per link class) and `expert_bytes`.
    pub fn to_json(&self) -> String {
        let outcome = self.outcome;
        let stats = &outcome.stats;
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
        let mut text = serde_json::to_string(&out).expect("plans serialise to JSON");
        text.push('\n');
        text
    }

    /// A human summary: per layer and in total, the hottest GPU over the mean and the
    /// balancedness before and after, then a bar chart of each GPU's load over all layers.
    pub fn to_table(&self) -> String {
        use std::fmt::Write;
        let outcome = self.outcome;
        let stats = &outcome.stats;
        let plan = &outcome.plan;
        let mut s = String::new();
        let _ = writeln!(
        s,
        "EPLB plan for {}: {} layers x {} experts -> {} replicas on {} GPUs ({} nodes, {} groups), {} policy ({})",
        self.source,
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
        let before = per_gpu_total(&crate::stats::baseline_gpu_loads(self.loads, plan.num_gpus));
        let after = plan
            .gpu_loads(self.loads)
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
            if outcome.moves.is_some() {
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

fn per_gpu_total(m: &crate::Matrix<f64>) -> Vec<f64> {
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

/// Two lines on a move plan: transfers (of `replicas` in all) by link class and rounds, and,
/// when the expert size is known, the bytes per link class and of the busiest round.
pub fn move_summary(m: &MovePlan, replicas: usize) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "moves: {} of {} replicas ({} intra-node, {} inter-node) in {} rounds",
        m.moves.len(),
        replicas,
        m.intra_node(),
        m.inter_node(),
        m.rounds.len()
    );
    if m.expert_bytes > 0 {
        let busiest = m
            .rounds
            .iter()
            .map(|r| r.intra_node_bytes + r.inter_node_bytes)
            .max()
            .unwrap_or(0);
        let intra = m
            .rounds
            .iter()
            .fold(0u64, |a, r| a.saturating_add(r.intra_node_bytes));
        let inter = m
            .rounds
            .iter()
            .fold(0u64, |a, r| a.saturating_add(r.inter_node_bytes));
        let _ = writeln!(
            s,
            "bytes: {intra} intra-node, {inter} inter-node; busiest round {busiest}"
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale() {
        assert_eq!(hbar(1.0, 1.0, 4), "████");
        assert_eq!(hbar(0.5, 1.0, 4), "██  ");
        assert_eq!(hbar(0.0, 0.0, 2), "  ");
        assert_eq!(sparkline(&[0.0, 0.5, 1.0], 1.0), " ▄█");
    }
}
