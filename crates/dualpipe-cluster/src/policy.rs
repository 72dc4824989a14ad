//! The policies: `static` (the documents' baseline) and `elastic` (EPLB).
//!
//! `static`: first come first served, exactly the requested devices; a job that fits in a node
//! is kept inside one node (the fullest node that still has room), a larger one takes the
//! emptiest nodes; the head of the queue waits until it fits and nobody passes it; nothing is
//! ever moved.
//!
//! `elastic`: see [`crate::elastic`]. `las`: see [`crate::las`].

use serde::Serialize;

use crate::elastic::ElasticParams;
use crate::las::LasParams;
use crate::state::State;

/// A placement policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// First come first served, rigid, never moved.
    Static,
    /// EPLB: Kuhn-Munkres placement, elastic sizes, migration under an overhead budget.
    Elastic(ElasticParams),
    /// Least attained service first (as Tiresias): rigid, preemptive.
    Las(LasParams),
}

impl Policy {
    /// The policy named `name` (`static`, `elastic` or `las`, with default parameters).
    pub fn by_name(name: &str) -> Option<Policy> {
        match name {
            "static" => Some(Policy::Static),
            "elastic" => Some(Policy::Elastic(ElasticParams::default())),
            "las" => Some(Policy::Las(LasParams::default())),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Static => "static",
            Policy::Elastic(_) => "elastic",
            Policy::Las(_) => "las",
        }
    }

    /// Acts on the pool at `now`: starts, moves and resizes jobs.
    pub fn schedule(&mut self, state: &mut State<'_>, now: f64) {
        match self {
            Policy::Static => schedule_static(state, now),
            Policy::Elastic(params) => crate::elastic::schedule(params, state, now),
            Policy::Las(params) => crate::las::schedule(params, state, now),
        }
    }
}

fn schedule_static(state: &mut State<'_>, now: f64) {
    while let Some(j) = state.queue.first() {
        match place_rigid(state, state.jobs[j].gpus) {
            Some(devices) => state.start(j, devices, now),
            None => break,
        }
    }
}

/// `k` free devices by the static rule: inside the fullest node with room when `k` fits in a
/// node; otherwise from the emptiest nodes. `None` when they are not free.
pub fn place_rigid(state: &State<'_>, k: usize) -> Option<Vec<usize>> {
    let nodes = state.cluster.nodes.len();
    if k <= state.cluster.largest_node() {
        let n = (0..nodes)
            .filter(|&n| state.free_per_node[n] >= k)
            .min_by_key(|&n| (state.free_per_node[n], n))?;
        return Some(state.free_devices_of(n)[..k].to_vec());
    }
    spread(state, k, &[])
}

/// `k` free devices from the emptiest nodes first, after the nodes in `prefer` (where a job
/// already runs). `None` when fewer than `k` are free.
pub fn spread(state: &State<'_>, k: usize, prefer: &[usize]) -> Option<Vec<usize>> {
    if state.free() < k {
        return None;
    }
    let mut order: Vec<usize> = (0..state.cluster.nodes.len()).collect();
    order.sort_by_key(|&n| {
        (
            !prefer.contains(&n),
            std::cmp::Reverse(state.free_per_node[n]),
            n,
        )
    });
    let mut devices = Vec::with_capacity(k);
    for n in order {
        for d in state.free_devices_of(n) {
            if devices.len() == k {
                break;
            }
            devices.push(d);
        }
    }
    devices.sort_unstable();
    Some(devices)
}
