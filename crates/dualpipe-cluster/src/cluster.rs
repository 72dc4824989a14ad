//! The shared pool: nodes of devices, the links between them, and each node's metrics.
//!
//! The file is JSON (documented in docs/cluster.md). `links` are the planner's three link
//! classes ([`dualpipe_sim::topology::Links`]); a node group stands for `count` identical
//! nodes, named `name-0`, `name-1`, ... (just `name` when `count` is 1):
//!
//! ```json
//! { "links": { "intra_node":       { "latency": 5e-6, "bandwidth": 150e9 },
//!              "inter_node":       { "latency": 2e-5, "bandwidth": 25e9 },
//!              "inter_datacenter": { "latency": 0.2,  "bandwidth": 1.25e9 } },
//!   "nodes": [ { "name": "n", "count": 64, "devices": 8, "speed": 1.0, "memory": 80e9,
//!                "metrics": { "network_bandwidth": 25e9 } } ] }
//! ```

use std::collections::BTreeMap;

use dualpipe_sim::topology::{check_speed, Datacenter, Device, Links, Node as TopoNode, Topology};
use serde::{Deserialize, Serialize};

use crate::error::ClusterError;

/// The most devices a cluster may hold (checked before anything per device is allocated).
pub const MAX_DEVICES: usize = 65_536;

/// One group of identical nodes as written in the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeGroup {
    /// The node name (a prefix when `count` > 1).
    pub name: String,
    /// How many such nodes (default 1).
    #[serde(default = "one")]
    pub count: usize,
    /// Devices per node.
    pub devices: usize,
    /// Relative compute speed of each device (> 0; 1 is the reference device).
    #[serde(default = "unit")]
    pub speed: f64,
    /// Memory of each device, in bytes.
    pub memory: f64,
    /// The node's monitored figures (GPU memory, compute, network bandwidth, ...), carried to
    /// the scheduler's view; finite and >= 0.
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
}

fn one() -> usize {
    1
}

fn unit() -> f64 {
    1.0
}

/// The cluster file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// The link classes, as in the planner's topology.
    pub links: Links,
    /// The node groups.
    pub nodes: Vec<NodeGroup>,
}

/// One node of the expanded cluster.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Node {
    /// Its unique name.
    pub name: String,
    /// Its devices' indices in [`Cluster::devices`] (contiguous).
    pub first_device: usize,
    /// How many devices it has.
    pub devices: usize,
    /// Relative speed of its devices.
    pub speed: f64,
    /// Memory of each of its devices, in bytes.
    pub memory: f64,
    /// Its monitored figures.
    pub metrics: BTreeMap<String, f64>,
}

/// The expanded cluster: every node, devices numbered node by node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cluster {
    /// The link classes.
    pub links: Links,
    /// The nodes in file order.
    pub nodes: Vec<Node>,
    /// For each device, its node.
    pub node_of: Vec<usize>,
}

impl Cluster {
    /// Parses, checks and expands a cluster file. Errors name the field and the fix.
    pub fn from_json(text: &str) -> Result<Cluster, ClusterError> {
        let file: ClusterFile = serde_json::from_str(text).map_err(|e| {
            ClusterError::Cluster(format!(
                "not a valid cluster file ({e}); see docs/cluster.md for the format"
            ))
        })?;
        Cluster::new(file)
    }

    /// Checks and expands a parsed cluster file.
    pub fn new(file: ClusterFile) -> Result<Cluster, ClusterError> {
        let bad = |field: String, why: &str| ClusterError::Cluster(format!("{field}: {why}"));
        // The planner's rules for links: finite, latency at most an hour, bandwidth at least
        // a byte per second.
        file.links
            .check()
            .map_err(|e| ClusterError::Cluster(e.to_string()))?;
        let mut total = 0usize;
        let mut names = std::collections::BTreeSet::new();
        for (g, group) in file.nodes.iter().enumerate() {
            if let Err(why) = crate::names::check_name(&group.name) {
                return Err(bad(format!("nodes[{g}].name"), &why));
            }
            if group.count == 0 {
                return Err(bad(
                    format!("nodes[{g}].count = 0"),
                    "give at least 1 node or remove the group",
                ));
            }
            if group.devices == 0 {
                return Err(bad(
                    format!("nodes[{g}].devices = 0"),
                    "a node needs at least 1 device",
                ));
            }
            check_speed(&format!("nodes[{g}].speed"), group.speed)
                .map_err(|e| ClusterError::Cluster(e.to_string()))?;
            if !(group.memory.is_finite() && group.memory > 0.0) {
                return Err(bad(
                    format!("nodes[{g}].memory = {}", group.memory),
                    "give a finite number of bytes > 0",
                ));
            }
            for (key, value) in &group.metrics {
                if !(value.is_finite() && *value >= 0.0) {
                    return Err(bad(
                        format!("nodes[{g}].metrics.{key} = {value}"),
                        "give a finite number >= 0",
                    ));
                }
            }
            total = group
                .count
                .checked_mul(group.devices)
                .and_then(|d| d.checked_add(total))
                .filter(|&d| d <= MAX_DEVICES)
                .ok_or_else(|| {
                    bad(
                        format!("nodes[{g}]"),
                        &format!("the cluster would hold more than {MAX_DEVICES} devices"),
                    )
                })?;
        }
        if total == 0 {
            return Err(bad(
                "nodes".into(),
                "the cluster has no devices; list at least one node group",
            ));
        }
        let mut nodes = Vec::new();
        let mut node_of = Vec::with_capacity(total);
        for (g, group) in file.nodes.iter().enumerate() {
            for i in 0..group.count {
                let name = if group.count == 1 {
                    group.name.clone()
                } else {
                    format!("{}-{i}", group.name)
                };
                if !names.insert(name.clone()) {
                    return Err(bad(
                        format!("nodes[{g}].name"),
                        &format!("node name {name} appears twice; give each group its own name"),
                    ));
                }
                node_of.extend(std::iter::repeat_n(nodes.len(), group.devices));
                nodes.push(Node {
                    name,
                    first_device: node_of.len() - group.devices,
                    devices: group.devices,
                    speed: group.speed,
                    memory: group.memory,
                    metrics: group.metrics.clone(),
                });
            }
        }
        Ok(Cluster {
            links: file.links,
            nodes,
            node_of,
        })
    }

    /// A cluster of `nodes` identical nodes of `devices` devices (speed 1, 80 GB), with the
    /// links of a typical GPU cluster (NVLink-class inside a node, 25 GB/s between nodes).
    pub fn uniform(nodes: usize, devices: usize) -> Result<Cluster, ClusterError> {
        Cluster::new(ClusterFile {
            links: default_links(),
            nodes: vec![NodeGroup {
                name: "n".into(),
                count: nodes,
                devices,
                speed: 1.0,
                memory: 80e9,
                metrics: BTreeMap::new(),
            }],
        })
    }

    /// How many devices the cluster holds.
    pub fn devices(&self) -> usize {
        self.node_of.len()
    }

    /// The most devices of one node.
    pub fn largest_node(&self) -> usize {
        self.nodes.iter().map(|n| n.devices).max().unwrap_or(0)
    }

    /// The planner's topology of the given devices (one datacenter; nodes as in the cluster),
    /// in the order given.
    pub fn topology_of(&self, devices: &[usize]) -> Topology {
        let mut nodes: Vec<TopoNode> = Vec::new();
        let mut last = usize::MAX;
        for &d in devices {
            let n = self.node_of[d];
            if n != last {
                nodes.push(TopoNode {
                    name: format!("{}#{}", self.nodes[n].name, nodes.len()),
                    devices: Vec::new(),
                });
                last = n;
            }
            let node = &self.nodes[n];
            nodes.last_mut().expect("pushed").devices.push(Device {
                name: format!("d{}", d - node.first_device),
                speed: node.speed,
                memory: node.memory,
            });
        }
        Topology {
            links: self.links,
            datacenters: vec![Datacenter {
                name: "cluster".into(),
                nodes,
            }],
        }
    }
}

/// Links of a typical GPU cluster: 150 GB/s inside a node, 25 GB/s between nodes.
pub fn default_links() -> Links {
    use dualpipe_sim::topology::Link;
    Links {
        intra_node: Link {
            latency: 5e-6,
            bandwidth: 150e9,
        },
        inter_node: Link {
            latency: 2e-5,
            bandwidth: 25e9,
        },
        inter_datacenter: Link {
            latency: 0.2,
            bandwidth: 1.25e9,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"{"links": {"intra_node": {"latency": 0, "bandwidth": 1e11},
        "inter_node": {"latency": 1e-5, "bandwidth": 1e10},
        "inter_datacenter": {"latency": 0.1, "bandwidth": 1e9}},
        "nodes": [{"name": "a", "count": 2, "devices": 4, "memory": 8e10},
                  {"name": "b", "devices": 8, "speed": 2, "memory": 8e10,
                   "metrics": {"network_bandwidth": 1e10}}]}"#;

    #[test]
    fn expands_groups_into_nodes() {
        let c = Cluster::from_json(OK).unwrap();
        assert_eq!(c.devices(), 16);
        let names: Vec<&str> = c.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a-0", "a-1", "b"]);
        assert_eq!(c.node_of[4], 1);
        assert_eq!(c.nodes[2].first_device, 8);
        assert_eq!(c.largest_node(), 8);
        let t = c.topology_of(&[0, 1, 9]);
        t.check().unwrap();
        assert_eq!(t.devices().len(), 3);
    }

    #[test]
    fn refuses_bad_values_in_one_line() {
        for (from, to, want) in [
            (r#""devices": 4"#, r#""devices": 0"#, "nodes[0].devices = 0"),
            (r#""count": 2"#, r#""count": 0"#, "nodes[0].count = 0"),
            (r#""speed": 2"#, r#""speed": -1"#, "nodes[1].speed = -1"),
            // Speeds and links the planner refuses too: they overflowed the simulated times.
            (
                r#""speed": 2"#,
                r#""speed": 1e-300"#,
                "nodes[1].speed = 1e-300",
            ),
            (r#""speed": 2"#, r#""speed": 1e7"#, "from 1e-6 to 1e6"),
            (
                r#""bandwidth": 1e9"#,
                r#""bandwidth": 1e-300"#,
                "bandwidth = 1e-300",
            ),
            (
                r#""latency": 0.1"#,
                r#""latency": 1e300"#,
                "latency = 1e300",
            ),
            ("1e10}}]}", "-3}}]}", "metrics.network_bandwidth = -3"),
        ] {
            let err = Cluster::from_json(&OK.replace(from, to))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
        let err = Cluster::from_json(
            r#"{"links": {"intra_node": {"latency": 0, "bandwidth": 1},
            "inter_node": {"latency": 0, "bandwidth": 1},
            "inter_datacenter": {"latency": 0, "bandwidth": 1}}, "nodes": []}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("no devices"), "{err}");
    }
}
