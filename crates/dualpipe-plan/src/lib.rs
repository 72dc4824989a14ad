//! Plans a pipeline job for the machines it runs on.
//!
//! Inputs: a [`Topology`](dualpipe_sim::Topology) (devices with speed and memory in nodes and
//! datacenters, and link classes) and a cost [`Profile`] (per-layer `F`, `I`, `W` times,
//! activation and parameter bytes). [`plan()`] searches schedule kind x micro-batch count; for
//! each it cuts the layers into contiguous stages by a min-max dynamic program within each
//! device's memory ([`partition`]), places ranks on devices by a bottleneck assignment solved
//! with Kuhn-Munkres ([`assign`]), simulates the step with every message charged by the link it
//! crosses, and returns the plans best first. With a previous plan ([`PreviousLayers`]),
//! placements keep the most layers where they were.
//!
//! ```
//! use dualpipe_plan::{plan, LayerCost, PlanOptions, Profile};
//! use dualpipe_sim::Topology;
//!
//! let topology = Topology::from_json(r#"{
//!   "links": {"intra_node": {"latency": 0, "bandwidth": 1e11},
//!             "inter_node": {"latency": 1e-5, "bandwidth": 1e10},
//!             "inter_datacenter": {"latency": 0.1, "bandwidth": 1e9}},
//!   "datacenters": [{"name": "dc", "nodes": [{"name": "n", "devices": [
//!     {"name": "fast", "speed": 2, "memory": 1e10},
//!     {"name": "slow", "speed": 1, "memory": 1e10}]}]}]}"#).unwrap();
//! let layer = LayerCost { f: 1e-3, i: 1e-3, w: 1e-3, activation_bytes: 1e6, parameter_bytes: 1e8, w_bytes: None, recompute: None };
//! let profile = Profile::uniform(12, layer, 1_000_000);
//! let report = plan(&topology, &profile, &PlanOptions::default()).unwrap();
//! let best = &report.plans[0];
//! // The fast device gets twice the layers of the slow one.
//! let fast = best.placement.iter().find(|r| r.device.ends_with("fast")).unwrap();
//! assert_eq!(fast.layers.len(), 8);
//! ```

#![warn(missing_docs)]

pub mod assign;
pub mod check;
pub mod error;
pub mod memory;
pub mod partition;
pub mod plan;
pub mod previous;
pub mod profile;
pub mod study;

pub use error::PlanError;
pub use memory::{rank_activation_bytes, LiveChunks};
pub use partition::{min_max, Partition, StageSlot};
pub use plan::{
    evaluate, plan, plan_with_progress, Evaluated, Plan, PlanOptions, PlanReport, Progress,
    RankPlan, Rejected,
};
pub use previous::PreviousLayers;
pub use profile::{LayerCost, Profile, RecomputeCost};
