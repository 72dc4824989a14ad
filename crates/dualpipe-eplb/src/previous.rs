//! A previous placement to re-plan from ([`PreviousPlacement`]): read from JSON, checked against the
//! layout of the new plan.

use crate::layout::Layout;
use crate::EplbError;

/// A placement in force: the logical expert of every physical slot, `[layers][replicas]`, and
/// the GPUs and nodes it was made for when the source records them (the JSON output of
/// `dualpipe eplb` does; a bare `phy2log` matrix does not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreviousPlacement {
    /// `[layers][replicas]`: the logical expert held by each physical slot.
    pub phy2log: Vec<Vec<usize>>,
    /// GPUs the placement was made for, when recorded.
    pub gpus: Option<usize>,
    /// Nodes the placement was made for, when recorded.
    pub nodes: Option<usize>,
}

impl PreviousPlacement {
    /// A placement from its `phy2log` rows, topology unrecorded.
    pub fn from_rows(phy2log: Vec<Vec<usize>>) -> Self {
        PreviousPlacement {
            phy2log,
            gpus: None,
            nodes: None,
        }
    }

    /// Reads a placement from JSON text: a bare `phy2log` matrix (`[[...], ...]`) or an object
    /// with a `phy2log` member (such as the JSON output of `dualpipe eplb`, whose `num_gpus`
    /// and `num_nodes` are kept), possibly under `plan`.
    pub fn parse_json(text: &str) -> Result<PreviousPlacement, EplbError> {
        let bad = |m: String| EplbError::Previous(m);
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not JSON ({e})")))?;
        let (object, matrix) = match &value {
            serde_json::Value::Array(_) => (None, &value),
            serde_json::Value::Object(map) => {
                let object = if map.contains_key("phy2log") {
                    Some(map)
                } else {
                    map.get("plan").and_then(|p| p.as_object())
                };
                let matrix = object
                    .and_then(|o| o.get("phy2log"))
                    .ok_or_else(|| bad("the JSON object has no `phy2log` member".into()))?;
                (object, matrix)
            }
            _ => return Err(bad("expected a matrix or an object with `phy2log`".into())),
        };
        let count = |key: &str| -> Result<Option<usize>, EplbError> {
            match object.and_then(|o| o.get(key)) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|&n| n > 0)
                    .map(Some)
                    .ok_or_else(|| bad(format!("`{key}` is {v}, not a positive integer"))),
            }
        };
        let (gpus, nodes) = (count("num_gpus")?, count("num_nodes")?);
        let rows = matrix
            .as_array()
            .ok_or_else(|| bad("`phy2log` is not a list of layers".into()))?;
        let phy2log = rows
            .iter()
            .enumerate()
            .map(|(l, row)| {
                let row = row
                    .as_array()
                    .ok_or_else(|| bad(format!("layer {l} is not a list")))?;
                row.iter()
                    .enumerate()
                    .map(|(p, v)| {
                        v.as_u64()
                            .and_then(|e| usize::try_from(e).ok())
                            .ok_or_else(|| {
                                bad(format!(
                                    "layer {l}, replica {p} is {v}, not a non-negative integer"
                                ))
                            })
                    })
                    .collect()
            })
            .collect::<Result<_, _>>()?;
        Ok(PreviousPlacement {
            phy2log,
            gpus,
            nodes,
        })
    }

    /// Checks that this is a placement for `layout` with `layers` layers: the recorded GPUs and
    /// nodes (when known) are the layout's, every layer has `replicas` slots, and every slot
    /// names one of the experts, each at least once.
    pub fn check(&self, layers: usize, layout: &Layout) -> Result<(), EplbError> {
        let gpus = self.gpus.unwrap_or(layout.gpus);
        let nodes = self.nodes.unwrap_or(layout.nodes);
        if (gpus, nodes) != (layout.gpus, layout.nodes) {
            let replicas = self.phy2log.first().map_or(0, Vec::len);
            return Err(EplbError::PreviousTopology {
                recorded: format!("{replicas} replicas on {gpus} GPUs in {nodes} nodes"),
                layout: format!(
                    "{} replicas on {} GPUs in {} nodes",
                    layout.replicas, layout.gpus, layout.nodes
                ),
            });
        }
        let prev = &self.phy2log;
        if prev.len() != layers {
            return Err(EplbError::Previous(format!(
                "it has {} layers but the loads have {layers}",
                prev.len()
            )));
        }
        let mut seen = vec![false; layout.experts];
        for (l, row) in prev.iter().enumerate() {
            if row.len() != layout.replicas {
                return Err(EplbError::Previous(format!(
                    "layer {l} has {} replicas, expected {}",
                    row.len(),
                    layout.replicas
                )));
            }
            seen.iter_mut().for_each(|s| *s = false);
            for (s, &e) in row.iter().enumerate() {
                if e >= layout.experts {
                    return Err(EplbError::Previous(format!(
                        "layer {l}, replica {s} names expert {e} but there are {} experts",
                        layout.experts
                    )));
                }
                seen[e] = true;
            }
            if let Some(e) = seen.iter().position(|&x| !x) {
                return Err(EplbError::Previous(format!(
                    "layer {l} has no replica of expert {e}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previous_in_both_forms() {
        let p = PreviousPlacement::parse_json("[[0,1],[1,0]]").unwrap();
        assert_eq!(p.phy2log, vec![vec![0, 1], vec![1, 0]]);
        assert_eq!((p.gpus, p.nodes), (None, None));
        let obj = r#"{"policy":"hierarchical","num_gpus":3,"num_nodes":1,"phy2log":[[2,0,1]]}"#;
        let p = PreviousPlacement::parse_json(obj).unwrap();
        assert_eq!(p.phy2log, vec![vec![2, 0, 1]]);
        assert_eq!((p.gpus, p.nodes), (Some(3), Some(1)));
        let nested = r#"{"plan":{"phy2log":[[1,0]],"num_gpus":2}}"#;
        assert_eq!(PreviousPlacement::parse_json(nested).unwrap().gpus, Some(2));
        assert!(PreviousPlacement::parse_json("[[0,-1]]").is_err());
        assert!(PreviousPlacement::parse_json(r#"{"x":1}"#).is_err());
        assert!(PreviousPlacement::parse_json(r#"{"phy2log":[[0]],"num_gpus":-2}"#).is_err());
        assert!(PreviousPlacement::parse_json("nope").is_err());
    }

    #[test]
    fn another_topology_is_refused_naming_both() {
        let p = PreviousPlacement {
            phy2log: vec![vec![0, 1, 0, 1, 2, 3, 2, 3]],
            gpus: Some(4),
            nodes: Some(2),
        };
        let layout = Layout::new(4, 8, 2, 1, 2);
        let e = p.check(1, &layout).unwrap_err().to_string();
        assert!(
            e.contains("8 replicas on 4 GPUs in 2 nodes")
                && e.contains("8 replicas on 2 GPUs in 1 nodes"),
            "{e}"
        );
        assert!(p.check(1, &Layout::new(4, 8, 2, 2, 4)).is_ok());
        // Without a record, only the shape is checked.
        assert!(PreviousPlacement::from_rows(p.phy2log.clone())
            .check(1, &layout)
            .is_ok());
        let e = PreviousPlacement::from_rows(vec![vec![0, 0, 1, 1, 2, 2, 0, 0]])
            .check(1, &layout)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no replica of expert 3"), "{e}");
    }
}
