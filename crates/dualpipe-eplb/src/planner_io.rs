//! Bridges between the planner's `phy2log` rows and the crate's [`Plan`] type, and the reader of
//! a previous placement (`--previous FILE`).

use crate::improved::{
    rebalance_improved, Decision, ImprovedPlan, Layout, PlannerError, PlannerOptions,
};
use crate::moves::{move_plan, MovePlan};
use crate::plan_check::{check_maps, check_placement, PlanViolation};
use crate::{Matrix, Plan, Policy, Tensor3};

/// Builds a [`Plan`] (with `phyrank`, `log2phy` and `logcnt` in the reference's layout) from a
/// `phy2log` matrix (`[layers][replicas]`). Replica ranks follow the physical order.
pub fn plan_from_phy2log(phy2log: &[Vec<usize>], layout: &Layout) -> Plan {
    let layers = phy2log.len();
    let mut logcnt = vec![vec![0i64; layout.experts]; layers];
    let mut phyrank = vec![vec![0i64; layout.replicas]; layers];
    for (l, row) in phy2log.iter().enumerate() {
        for (p, &e) in row.iter().enumerate() {
            phyrank[l][p] = logcnt[l][e];
            logcnt[l][e] += 1;
        }
    }
    let width = logcnt.iter().flatten().copied().max().unwrap_or(1).max(1) as usize;
    let mut log2phy = Tensor3::filled(layers, layout.experts, width, -1i64);
    let buf = log2phy.as_mut_slice();
    for (l, row) in phy2log.iter().enumerate() {
        for (p, &e) in row.iter().enumerate() {
            buf[(l * layout.experts + e) * width + phyrank[l][p] as usize] = p as i64;
        }
    }
    let to_i64 = |rows: Vec<Vec<i64>>, cols: usize| {
        Matrix::from_rows(rows).unwrap_or_else(|_| Matrix::filled(0, cols, 0))
    };
    Plan {
        policy: if layout.hierarchical() {
            Policy::Hierarchical
        } else {
            Policy::Global
        },
        num_groups: layout.groups,
        num_nodes: layout.nodes,
        num_gpus: layout.gpus,
        phy2log: to_i64(
            phy2log
                .iter()
                .map(|r| r.iter().map(|&e| e as i64).collect())
                .collect(),
            layout.replicas,
        ),
        phyrank: to_i64(phyrank, layout.replicas),
        log2phy,
        logcnt: to_i64(logcnt, layout.experts),
    }
}

impl ImprovedPlan {
    /// The plan in the crate's [`Plan`] form.
    pub fn to_plan(&self, layout: &Layout) -> Plan {
        plan_from_phy2log(&self.phy2log(), layout)
    }
}

/// The `phy2log` matrix of a [`Plan`] as `usize` rows; `None` if an index is negative.
pub fn phy2log_rows(plan: &Plan) -> Option<Vec<Vec<usize>>> {
    plan.phy2log
        .iter_rows()
        .map(|row| row.iter().map(|&e| usize::try_from(e).ok()).collect())
        .collect()
}

/// Validates any [`Plan`]: a placement with equal slots per GPU and every expert present, and
/// `phy2log`, `log2phy` and `logcnt` in agreement.
pub fn check_plan(plan: &Plan) -> Result<(), PlanViolation> {
    let Some(phy2log) = phy2log_rows(plan) else {
        return Err(PlanViolation::UnknownExpert {
            layer: 0,
            slot: 0,
            expert: usize::MAX,
            experts: plan.num_experts(),
        });
    };
    check_placement(&phy2log, plan.num_experts(), plan.num_gpus)?;
    let log2phy = plan.log2phy.to_nested();
    let logcnt: Vec<Vec<usize>> = plan
        .logcnt
        .iter_rows()
        .map(|r| {
            r.iter()
                .map(|&c| usize::try_from(c).unwrap_or(usize::MAX))
                .collect()
        })
        .collect();
    check_maps(&phy2log, &log2phy, &logcnt)
}

/// Reads a previous placement from JSON text: a bare `phy2log` matrix (`[[...], ...]`) or an
/// object with a `phy2log` member (such as the JSON output of `dualpipe eplb`), possibly under
/// `plan`.
pub fn parse_previous(text: &str) -> Result<Vec<Vec<usize>>, PlannerError> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| PlannerError::Previous(format!("not JSON ({e})")))?;
    let matrix = match &value {
        serde_json::Value::Array(_) => &value,
        serde_json::Value::Object(map) => map
            .get("phy2log")
            .or_else(|| map.get("plan").and_then(|p| p.get("phy2log")))
            .ok_or_else(|| {
                PlannerError::Previous("the JSON object has no `phy2log` member".into())
            })?,
        _ => {
            return Err(PlannerError::Previous(
                "expected a matrix or an object with `phy2log`".into(),
            ))
        }
    };
    let rows = matrix
        .as_array()
        .ok_or_else(|| PlannerError::Previous("`phy2log` is not a list of layers".into()))?;
    rows.iter()
        .enumerate()
        .map(|(l, row)| {
            let row = row
                .as_array()
                .ok_or_else(|| PlannerError::Previous(format!("layer {l} is not a list")))?;
            row.iter()
                .enumerate()
                .map(|(p, v)| {
                    v.as_u64().map(|e| e as usize).ok_or_else(|| {
                        PlannerError::Previous(format!(
                            "layer {l}, replica {p} is {v}, not a non-negative integer"
                        ))
                    })
                })
                .collect()
        })
        .collect()
}

/// Everything the CLI prints for the improved policy.
#[derive(Clone, Debug)]
pub struct PlannerRun {
    /// The per-layer results.
    pub improved: ImprovedPlan,
    /// The plan in the crate's [`Plan`] form.
    pub plan: Plan,
    /// The transfers from the previous placement, when one was given.
    pub moves: Option<MovePlan>,
}

/// Runs the improved policy on `load` (`[layers][experts]`), with the previous placement when
/// given, and builds the move plan (`expert_bytes` per transfer, 0 if unknown).
pub fn run_planner(
    load: &[Vec<f64>],
    layout: &Layout,
    previous: Option<&[Vec<usize>]>,
    opts: &PlannerOptions,
    expert_bytes: u64,
) -> Result<PlannerRun, PlannerError> {
    let improved = rebalance_improved(load, layout, previous, opts)?;
    let plan = improved.to_plan(layout);
    let moves = previous.map(|prev| {
        move_plan(
            prev,
            &improved.phy2log(),
            layout.gpus,
            layout.nodes,
            expert_bytes,
        )
    });
    Ok(PlannerRun {
        improved,
        plan,
        moves,
    })
}

impl PlannerRun {
    /// `moves` and `rounds` (plus per-layer decisions) as JSON members to merge into the CLI's
    /// JSON output.
    pub fn json_members(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut map = serde_json::Map::new();
        let decisions: Vec<Decision> = self.improved.layers.iter().map(|l| l.decision).collect();
        map.insert("decisions".into(), serde_json::json!(decisions));
        if let Some(m) = &self.moves {
            map.insert("moves".into(), serde_json::json!(m.moves));
            map.insert("rounds".into(), serde_json::json!(m.rounds));
            map.insert("expert_bytes".into(), serde_json::json!(m.expert_bytes));
        }
        map
    }

    /// A few lines for the table output: what each layer did, and the transfers.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let mut counts: Vec<(Decision, usize)> = Vec::new();
        for l in &self.improved.layers {
            match counts.iter_mut().find(|(d, _)| *d == l.decision) {
                Some((_, n)) => *n += 1,
                None => counts.push((l.decision, 1)),
            }
        }
        let parts: Vec<String> = counts
            .iter()
            .map(|(d, n)| {
                format!(
                    "{n} {}",
                    serde_json::to_value(d)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default()
                )
            })
            .collect();
        let _ = writeln!(s, "layers: {}", parts.join(", "));
        if let Some(m) = &self.moves {
            let replicas: usize = self.improved.layers.iter().map(|l| l.phy2log.len()).sum();
            s += &move_summary(m, replicas);
        }
        s
    }
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
    fn plan_maps_agree() {
        let layout = Layout {
            experts: 3,
            replicas: 4,
            groups: 1,
            nodes: 1,
            gpus: 2,
        };
        let plan = plan_from_phy2log(&[vec![0, 1, 2, 0]], &layout);
        assert_eq!(plan.logcnt.row(0), &[2, 1, 1]);
        assert_eq!(plan.log2phy.vector(0, 0), &[0, 3]);
        assert_eq!(plan.log2phy.vector(0, 1), &[1, -1]);
        assert_eq!(plan.phyrank.row(0), &[0, 0, 0, 1]);
        assert!(check_plan(&plan).is_ok());
        let mut broken = plan.clone();
        broken.logcnt.row_mut(0)[2] = 2;
        assert!(check_plan(&broken).is_err());
    }

    #[test]
    fn run_with_previous_reports_moves() {
        let layout = Layout {
            experts: 4,
            replicas: 6,
            groups: 2,
            nodes: 2,
            gpus: 2,
        };
        let opts = PlannerOptions::default();
        let first = run_planner(&[vec![40.0, 10.0, 30.0, 20.0]], &layout, None, &opts, 8).unwrap();
        assert!(first.moves.is_none());
        let prev = first.improved.phy2log();
        let second = run_planner(
            &[vec![10.0, 40.0, 20.0, 30.0]],
            &layout,
            Some(&prev),
            &opts,
            8,
        )
        .unwrap();
        let moves = second.moves.as_ref().unwrap();
        assert_eq!(moves.moves.len(), second.improved.moved());
        let json = second.json_members();
        assert!(json.contains_key("moves") && json.contains_key("rounds"));
        assert!(second.summary().contains("moves:"));
    }

    #[test]
    fn previous_in_both_forms() {
        assert_eq!(
            parse_previous("[[0,1],[1,0]]").unwrap(),
            vec![vec![0, 1], vec![1, 0]]
        );
        let obj = r#"{"policy":"hierarchical","phy2log":[[2,0,1]]}"#;
        assert_eq!(parse_previous(obj).unwrap(), vec![vec![2, 0, 1]]);
        assert!(parse_previous("[[0,-1]]").is_err());
        assert!(parse_previous(r#"{"x":1}"#).is_err());
        assert!(parse_previous("nope").is_err());
    }
}
