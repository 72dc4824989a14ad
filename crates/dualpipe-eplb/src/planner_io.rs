//! Bridges between the planner's `phy2log` rows and the crate's [`Plan`] type, and the reader of
//! a previous placement (`--previous FILE`).

use crate::improved::{ImprovedPlan, Layout, PlannerError};
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
