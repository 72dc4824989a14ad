//! The policies by name, and the one call the simulator makes at each event.
//!
//! `static` and `fifo`: see [`crate::sim::first_come`]. `elastic`: see [`crate::sim::elastic`]. `las`: see
//! [`crate::sim::las`]. Each policy's module builds on [`crate::sim::place`] and
//! [`crate::sim::state`] only; this module is the one that knows them all.

use serde::Serialize;

use crate::sim::elastic::ElasticParams;
use crate::sim::las::LasParams;
use crate::sim::state::State;

/// A placement policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// First come first served, rigid, never moved; a job that fits in a node in one node.
    Static,
    /// First come first served, rigid, never moved, on the lowest-numbered free devices.
    Fifo,
    /// EPLB: Kuhn-Munkres placement, elastic sizes, migration under an overhead budget.
    Elastic(ElasticParams),
    /// Least attained service first (as Tiresias): rigid, preemptive.
    Las(LasParams),
}

impl Policy {
    /// The policy named `name` (`static`, `fifo`, `elastic` or `las`, with default
    /// parameters).
    pub fn by_name(name: &str) -> Option<Policy> {
        match name {
            "static" => Some(Policy::Static),
            "fifo" => Some(Policy::Fifo),
            "elastic" => Some(Policy::Elastic(ElasticParams::default())),
            "las" => Some(Policy::Las(LasParams::default())),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Static => "static",
            Policy::Fifo => "fifo",
            Policy::Elastic(_) => "elastic",
            Policy::Las(_) => "las",
        }
    }

    /// Acts on the pool at `now`: starts, moves and resizes jobs.
    pub fn schedule(&mut self, state: &mut State<'_>, now: f64) {
        match self {
            Policy::Static => crate::sim::first_come::schedule_static(state, now),
            Policy::Fifo => crate::sim::first_come::schedule_fifo(state, now),
            Policy::Elastic(params) => crate::sim::elastic::schedule(params, state, now),
            Policy::Las(params) => crate::sim::las::schedule(params, state, now),
        }
    }
}
