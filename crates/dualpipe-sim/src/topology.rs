//! Where the ranks run: devices with a relative speed and a memory, grouped in nodes and
//! datacenters, and the three link classes a message can cross.
//!
//! The file format is JSON (documented in docs/planning.md):
//!
//! ```json
//! {
//!   "links": {
//!     "intra_node":       { "latency": 5e-6, "bandwidth": 150e9 },
//!     "inter_node":       { "latency": 2e-5, "bandwidth": 25e9 },
//!     "inter_datacenter": { "latency": 0.2,  "bandwidth": 1.25e9 }
//!   },
//!   "datacenters": [
//!     { "name": "dc0", "nodes": [
//!       { "name": "n0", "devices": [ { "name": "gpu0", "speed": 1.0, "memory": 80e9 } ] }
//!     ] }
//!   ]
//! }
//! ```
//!
//! Latency is in seconds, bandwidth in bytes per second, memory in bytes; `speed` is relative
//! (a device of speed 2 runs every op in half the time of a device of speed 1). A message
//! between two devices of one node crosses `intra_node`, of two nodes of one datacenter
//! `inter_node`, of two datacenters `inter_datacenter`.

use serde::{Deserialize, Serialize};

use crate::error::SimError;

/// The most devices a topology may hold (checked before anything per device is allocated).
pub const MAX_DEVICES: usize = 4096;

/// One link class: a fixed latency and a bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Time from the end of a send to the arrival, in seconds (the wire's delay; it does not
    /// occupy the sender).
    pub latency: f64,
    /// Bytes per second the sender pushes; a message occupies its sender for
    /// `bytes / bandwidth`.
    pub bandwidth: f64,
}

impl Link {
    /// How long `bytes` occupy the sender: `bytes / bandwidth`.
    pub fn transfer(&self, bytes: u64) -> f64 {
        bytes as f64 / self.bandwidth
    }

    /// When a message of `bytes` arrives after its send starts: transfer plus latency.
    pub fn message_time(&self, bytes: u64) -> f64 {
        self.transfer(bytes) + self.latency
    }
}

/// The three link classes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Links {
    /// Between two devices of one node (NVLink, PCIe, shared memory).
    pub intra_node: Link,
    /// Between two nodes of one datacenter (InfiniBand, Ethernet).
    pub inter_node: Link,
    /// Between two datacenters (a wide-area link).
    pub inter_datacenter: Link,
}

impl Links {
    /// Checks every link: a latency from 0 to [`MAX_LATENCY`] seconds and a bandwidth of at
    /// least [`MIN_BANDWIDTH`] bytes per second, both finite. The error names the field
    /// (`links.inter_node.bandwidth`, ...) and the fix.
    pub fn check(&self) -> Result<(), SimError> {
        let bad = |field: String, why: &str| SimError::Topology(format!("{field}: {why}"));
        for (name, link) in [
            ("intra_node", &self.intra_node),
            ("inter_node", &self.inter_node),
            ("inter_datacenter", &self.inter_datacenter),
        ] {
            if !link.latency.is_finite() || link.latency < 0.0 {
                return Err(bad(
                    format!("links.{name}.latency = {}", link.latency),
                    "give a finite number of seconds >= 0",
                ));
            }
            if link.latency > MAX_LATENCY {
                return Err(bad(
                    format!("links.{name}.latency = {}", shown(link.latency)),
                    &format!(
                        "more than {MAX_LATENCY} seconds; give the latency in seconds, such as \
                         5e-6 within a node"
                    ),
                ));
            }
            if !link.bandwidth.is_finite() || link.bandwidth <= 0.0 {
                return Err(bad(
                    format!("links.{name}.bandwidth = {}", link.bandwidth),
                    "give a finite number of bytes per second > 0",
                ));
            }
            if link.bandwidth < MIN_BANDWIDTH {
                return Err(bad(
                    format!("links.{name}.bandwidth = {}", shown(link.bandwidth)),
                    "less than one byte per second; give the bandwidth in bytes per second, \
                     such as 25e9 for 25 GB/s",
                ));
            }
        }
        Ok(())
    }
}

/// Which link class a message crosses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkClass {
    /// Both devices are the same one (a local hand-over, free).
    Local,
    /// Same node.
    IntraNode,
    /// Same datacenter, other node.
    InterNode,
    /// Other datacenter.
    InterDatacenter,
}

/// One device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Its name, unique within its node.
    pub name: String,
    /// Relative compute speed (> 0): op durations are divided by it.
    pub speed: f64,
    /// Memory for parameters and activations, in bytes.
    pub memory: f64,
}

/// One node: devices that share the intra-node link.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Its name, unique within its datacenter.
    pub name: String,
    /// Its devices.
    pub devices: Vec<Device>,
}

/// One datacenter: nodes that share the inter-node network.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Datacenter {
    /// Its name, unique in the topology.
    pub name: String,
    /// Its nodes.
    pub nodes: Vec<Node>,
}

/// Devices in nodes in datacenters, and the link classes between them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// The link classes.
    pub links: Links,
    /// The datacenters.
    pub datacenters: Vec<Datacenter>,
}

/// A device of a topology with where it sits, in the flat order devices are numbered in
/// (datacenter, then node, then device, as listed in the file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceSlot {
    /// `datacenter/node/device`: the device's unique path.
    pub path: String,
    /// Index of its datacenter.
    pub datacenter: usize,
    /// Index of its node, counted over the whole topology.
    pub node: usize,
    /// Relative speed.
    pub speed: f64,
    /// Memory in bytes.
    pub memory: f64,
}

/// The longest link latency, in seconds (an hour: anything longer is a unit mistake, and
/// would overflow the simulated times).
pub const MAX_LATENCY: f64 = 3600.0;
/// The smallest link bandwidth, in bytes per second.
pub const MIN_BANDWIDTH: f64 = 1.0;
/// The relative device speeds accepted, slowest and fastest.
pub const SPEED_RANGE: (f64, f64) = (1e-6, 1e6);

/// Checks a relative device speed named `field`: within [`SPEED_RANGE`].
pub fn check_speed(field: &str, speed: f64) -> Result<(), SimError> {
    if (SPEED_RANGE.0..=SPEED_RANGE.1).contains(&speed) {
        return Ok(());
    }
    Err(SimError::Topology(format!(
        "{field} = {}: give a relative speed from {:e} to {:e} (1 for the reference device)",
        shown(speed),
        SPEED_RANGE.0,
        SPEED_RANGE.1
    )))
}

/// A number as a user would write it: `1e-308` rather than its 308 zeros.
pub fn shown(x: f64) -> String {
    if x.is_finite() && x != 0.0 && !(1e-4..1e9).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

/// The longest datacenter, node or device name, in characters.
pub const MAX_NAME_CHARS: usize = 128;

/// A datacenter, node or device name is printed in tables and joined into device paths
/// (`dc/node/device`, how `--previous` matches devices): it must be non-empty, without
/// control characters (a terminal would run them) or `/`, and at most
/// [`MAX_NAME_CHARS`] characters. `field` is its path in the file.
fn check_name(field: &str, name: &str) -> Result<(), SimError> {
    let why = if name.trim().is_empty() {
        "is empty; give it a name such as \"gpu0\"".to_string()
    } else if name.chars().any(char::is_control) {
        "holds a control character; use printable characters only".to_string()
    } else if name.contains('/') {
        "holds '/', which separates the parts of a device path (datacenter/node/device); \
         use another character such as '-'"
            .to_string()
    } else if name.chars().count() > MAX_NAME_CHARS {
        format!("is longer than {MAX_NAME_CHARS} characters; give a shorter name")
    } else {
        return Ok(());
    };
    let shown: String = name.chars().take(40).collect();
    let more = if shown.len() < name.len() { "..." } else { "" };
    Err(SimError::Topology(format!(
        "{field} = {shown:?}{more}: {why}"
    )))
}

impl Topology {
    /// Parses and checks a topology from JSON text. Errors name the field and the fix.
    pub fn from_json(text: &str) -> Result<Topology, SimError> {
        let topology: Topology = serde_json::from_str(text).map_err(|e| {
            SimError::Topology(format!(
                "not a valid topology ({e}); see docs/planning.md for the format"
            ))
        })?;
        topology.check()?;
        Ok(topology)
    }

    /// Checks every value: positive speeds, memories, bandwidths; finite latencies >= 0;
    /// at least one device; unique names; at most [`MAX_DEVICES`] devices.
    pub fn check(&self) -> Result<(), SimError> {
        let bad = |field: String, why: &str| SimError::Topology(format!("{field}: {why}"));
        self.links.check()?;
        let mut count = 0usize;
        let mut dc_names = std::collections::BTreeSet::new();
        for (d, dc) in self.datacenters.iter().enumerate() {
            check_name(&format!("datacenters[{d}].name"), &dc.name)?;
            if !dc_names.insert(dc.name.as_str()) {
                return Err(bad(
                    format!("datacenters[{d}].name = {:?}", dc.name),
                    "is used twice; give every datacenter its own name",
                ));
            }
            let mut node_names = std::collections::BTreeSet::new();
            for (n, node) in dc.nodes.iter().enumerate() {
                check_name(&format!("datacenters[{d}].nodes[{n}].name"), &node.name)?;
                if !node_names.insert(node.name.as_str()) {
                    return Err(bad(
                        format!("datacenters[{d}].nodes[{n}].name = {:?}", node.name),
                        "is used twice in its datacenter; give every node its own name",
                    ));
                }
                let mut dev_names = std::collections::BTreeSet::new();
                for (i, dev) in node.devices.iter().enumerate() {
                    let at = format!("datacenters[{d}].nodes[{n}].devices[{i}]");
                    check_name(&format!("{at}.name"), &dev.name)?;
                    if !dev_names.insert(dev.name.as_str()) {
                        return Err(bad(
                            format!("{at}.name = {:?}", dev.name),
                            "is used twice in its node; give every device its own name",
                        ));
                    }
                    check_speed(&format!("{at}.speed"), dev.speed)?;
                    if !dev.memory.is_finite() || dev.memory <= 0.0 {
                        return Err(bad(
                            format!("{at}.memory = {}", dev.memory),
                            "give a finite number of bytes > 0",
                        ));
                    }
                    count += 1;
                    if count > MAX_DEVICES {
                        return Err(bad(
                            "datacenters".into(),
                            &format!("more than {MAX_DEVICES} devices; split the job"),
                        ));
                    }
                }
            }
        }
        if count == 0 {
            return Err(bad(
                "datacenters".into(),
                "no device; list at least one datacenter with a node with a device",
            ));
        }
        Ok(())
    }

    /// Every device, in flat order.
    pub fn devices(&self) -> Vec<DeviceSlot> {
        let mut out = Vec::new();
        let mut node_index = 0;
        for (d, dc) in self.datacenters.iter().enumerate() {
            for node in &dc.nodes {
                for dev in &node.devices {
                    out.push(DeviceSlot {
                        path: format!("{}/{}/{}", dc.name, node.name, dev.name),
                        datacenter: d,
                        node: node_index,
                        speed: dev.speed,
                        memory: dev.memory,
                    });
                }
                node_index += 1;
            }
        }
        out
    }

    /// The link class between two devices.
    pub fn class(a: &DeviceSlot, b: &DeviceSlot) -> LinkClass {
        if a.path == b.path {
            LinkClass::Local
        } else if a.node == b.node {
            LinkClass::IntraNode
        } else if a.datacenter == b.datacenter {
            LinkClass::InterNode
        } else {
            LinkClass::InterDatacenter
        }
    }

    /// The link of a class (`None` for [`LinkClass::Local`]).
    pub fn link(&self, class: LinkClass) -> Option<Link> {
        match class {
            LinkClass::Local => None,
            LinkClass::IntraNode => Some(self.links.intra_node),
            LinkClass::InterNode => Some(self.links.inter_node),
            LinkClass::InterDatacenter => Some(self.links.inter_datacenter),
        }
    }

    /// The network of `ranks` ranks where rank `r` runs on device `device_of_rank[r]` (an
    /// index into [`Topology::devices`]), with per-boundary message sizes.
    pub fn network(
        &self,
        device_of_rank: &[usize],
        boundary_bytes: Vec<u64>,
    ) -> Result<Network, SimError> {
        let devices = self.devices();
        if let Some(&d) = device_of_rank.iter().find(|&&d| d >= devices.len()) {
            return Err(SimError::Topology(format!(
                "device index {d} is outside the topology's {} devices",
                devices.len()
            )));
        }
        let ranks = device_of_rank.len();
        let mut links = Vec::with_capacity(ranks * ranks);
        for &a in device_of_rank {
            for &b in device_of_rank {
                links.push(self.link(Self::class(&devices[a], &devices[b])));
            }
        }
        Ok(Network {
            ranks,
            links,
            boundary_bytes,
        })
    }
}

/// The links between every pair of ranks, for the simulator: messages are charged by the link
/// they cross instead of [`CommCost`](crate::CommCost)'s single latency and bandwidth.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Network {
    /// Number of ranks.
    pub ranks: usize,
    /// `links[src * ranks + dst]`: the link from `src` to `dst` (`None`: same device, free).
    pub links: Vec<Option<Link>>,
    /// `boundary_bytes[s]`: bytes of the activations (and, backwards, the gradients) crossing
    /// between stage `s` and stage `s + 1`; a stage past the end uses the last entry, an empty
    /// list uses [`CommCost::message_bytes`](crate::CommCost::message_bytes).
    pub boundary_bytes: Vec<u64>,
}

impl Network {
    /// `(occupancy of the sender, arrival after the send starts)` of the message from `src` to
    /// `dst` across stage boundary `boundary`, with `default_bytes` when no size is listed.
    pub fn message(
        &self,
        src: usize,
        dst: usize,
        boundary: usize,
        default_bytes: u64,
    ) -> (f64, f64) {
        let bytes = self
            .boundary_bytes
            .get(boundary)
            .or(self.boundary_bytes.last())
            .copied()
            .unwrap_or(default_bytes);
        match self.links.get(src * self.ranks + dst).copied().flatten() {
            None => (0.0, 0.0),
            Some(link) => (link.transfer(bytes), link.message_time(bytes)),
        }
    }

    /// Checks the network covers `ranks` ranks.
    pub fn check(&self, ranks: usize) -> Result<(), SimError> {
        if self.ranks != ranks || self.links.len() != ranks * ranks {
            return Err(SimError::Cost(format!(
                "the network covers {} ranks ({} links) but the schedule has {ranks} ranks; build it for the schedule's ranks",
                self.ranks,
                self.links.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(speed: &str, bw: &str) -> String {
        format!(
            r#"{{"links": {{"intra_node": {{"latency": 0.0, "bandwidth": 100.0}},
                "inter_node": {{"latency": 1.0, "bandwidth": {bw}}},
                "inter_datacenter": {{"latency": 5.0, "bandwidth": 1.0}}}},
              "datacenters": [
                {{"name": "a", "nodes": [
                    {{"name": "n0", "devices": [{{"name": "g0", "speed": {speed}, "memory": 10}},
                                               {{"name": "g1", "speed": 1, "memory": 10}}]}},
                    {{"name": "n1", "devices": [{{"name": "g0", "speed": 1, "memory": 10}}]}}]}},
                {{"name": "b", "nodes": [
                    {{"name": "n0", "devices": [{{"name": "g0", "speed": 1, "memory": 10}}]}}]}}]}}"#
        )
    }

    #[test]
    fn classes_follow_nodes_and_datacenters() {
        let t = Topology::from_json(&text("2", "10.0")).unwrap();
        let d = t.devices();
        assert_eq!(d.len(), 4);
        assert_eq!(d[3].path, "b/n0/g0");
        assert_eq!(Topology::class(&d[0], &d[0]), LinkClass::Local);
        assert_eq!(Topology::class(&d[0], &d[1]), LinkClass::IntraNode);
        assert_eq!(Topology::class(&d[1], &d[2]), LinkClass::InterNode);
        assert_eq!(Topology::class(&d[2], &d[3]), LinkClass::InterDatacenter);
        let net = t.network(&[0, 2, 3], vec![20]).unwrap();
        assert_eq!(net.message(0, 1, 0, 0), (2.0, 3.0));
        assert_eq!(net.message(1, 2, 7, 0), (20.0, 25.0));
        assert_eq!(net.message(1, 1, 0, 0), (0.0, 0.0));
    }

    #[test]
    fn bad_values_name_the_field() {
        let err = Topology::from_json(&text("0", "10.0"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("datacenters[0].nodes[0].devices[0].speed = 0"),
            "{err}"
        );
        let err = Topology::from_json(&text("1", "-1"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("links.inter_node.bandwidth = -1"), "{err}");
        let err = Topology::from_json("{\"links\": 3}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a valid topology"), "{err}");
        let dup = text("1", "1").replace("\"g1\"", "\"g0\"");
        let err = Topology::from_json(&dup).unwrap_err().to_string();
        assert!(err.contains("used twice"), "{err}");
    }

    #[test]
    fn out_of_scale_links_and_speeds_get_the_unit_advice() {
        for (topology, want) in [
            (
                text("1", "1e-308"),
                "links.inter_node.bandwidth = 1e-308: less than one byte",
            ),
            (
                text("1", "5e-324"),
                "links.inter_node.bandwidth = 5e-324: less than one byte",
            ),
            (
                text("1e-300", "1"),
                "devices[0].speed = 1e-300: give a relative speed from",
            ),
            (
                text("1e308", "1"),
                "devices[0].speed = 1e308: give a relative speed from",
            ),
        ] {
            let err = Topology::from_json(&topology).unwrap_err().to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
        let late = text("1", "1").replacen("\"latency\": 1.0", "\"latency\": 1e308", 1);
        let err = Topology::from_json(&late).unwrap_err().to_string();
        assert!(
            err.contains(".latency = 1e308: more than 3600 seconds"),
            "{err}"
        );
    }

    #[test]
    fn names_with_control_characters_slashes_or_nothing_are_refused() {
        for (name, why) in [
            ("\\u001b[31mred\\u001b[0m\\n", "control character"),
            ("a/b", "'/'"),
            ("", "is empty"),
            ("  ", "is empty"),
        ] {
            let bad = text("1", "1").replacen("\"g1\"", &format!("\"{name}\""), 1);
            let err = Topology::from_json(&bad).unwrap_err().to_string();
            assert!(
                err.starts_with("datacenters[0].nodes[0].devices[1].name = ") && err.contains(why),
                "{name}: {err}"
            );
            assert!(!err.contains('\u{1b}'), "{err}");
        }
        let node = text("1", "1").replacen("\"n1\"", "\"x/y\"", 1);
        let err = Topology::from_json(&node).unwrap_err().to_string();
        assert!(err.starts_with("datacenters[0].nodes[1].name"), "{err}");
        let dc = text("1", "1").replacen("\"b\"", &format!("\"{}\"", "b".repeat(200)), 1);
        let err = Topology::from_json(&dc).unwrap_err().to_string();
        assert!(
            err.contains("datacenters[1].name") && err.contains("longer than"),
            "{err}"
        );
        assert!(err.len() < 300, "{err}");
    }
}
