//! Re-placement after the topology changed: which layers each device held in the previous
//! plan, so that a new placement keeps the most of them (the fewest layer moves), as the EPLB
//! planner keeps experts where they are.

use std::collections::{BTreeMap, BTreeSet};

use dualpipe_sim::Topology;

use crate::error::PlanError;
use crate::plan::{Plan, PlanReport};

/// The layers each device (by `datacenter/node/device` path) held in a previous plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PreviousLayers {
    /// Device path to the layers whose weights it held.
    pub by_device: BTreeMap<String, BTreeSet<usize>>,
}

impl PreviousLayers {
    /// The layers of `plan`'s placement.
    pub fn from_plan(plan: &Plan) -> PreviousLayers {
        let mut by_device: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
        for rank in &plan.placement {
            by_device
                .entry(rank.device.clone())
                .or_default()
                .extend(rank.layers.iter().copied());
        }
        PreviousLayers { by_device }
    }

    /// Reads a plan written by `dualpipe plan --format json` (the first, best plan of the
    /// report) or a single plan object, checked whole ([`Plan::check`]); its stages must
    /// cover the `layers` layers of the profile, and at least one of its devices must be in
    /// `topology` (a re-placement keeps layers on the devices that remain; a plan sharing no
    /// device with the topology is another job's).
    pub fn from_json(
        text: &str,
        layers: usize,
        topology: &Topology,
    ) -> Result<PreviousLayers, PlanError> {
        let (plan, at) = match serde_json::from_str::<PlanReport>(text) {
            Ok(report) => (
                report.plans.into_iter().next().ok_or_else(|| {
                    PlanError::Previous(
                        "plans: the previous plan file lists no plan; give a file written by \
                         `dualpipe plan --format json`"
                            .into(),
                    )
                })?,
                "plans[0]",
            ),
            Err(_) => (
                serde_json::from_str::<Plan>(text).map_err(|e| {
                    PlanError::Previous(format!(
                        "not a plan ({e}); give a file written by `dualpipe plan --format json`"
                    ))
                })?,
                "plan",
            ),
        };
        plan.check(at)?;
        let covered = plan.stages.iter().map(|s| s.end_layer).max().unwrap_or(0);
        if covered != layers {
            return Err(PlanError::Previous(format!(
                "{at}.stages: the previous plan covers {covered} layers but the profile has \
                 {layers}; plan with the profile the previous plan was made for"
            )));
        }
        let here: BTreeSet<String> = topology.devices().into_iter().map(|d| d.path).collect();
        if !plan.placement.iter().any(|r| here.contains(&r.device)) {
            return Err(PlanError::Previous(format!(
                "{at}.placement: none of the previous plan's devices (such as {}) is in the \
                 topology; give the previous plan of this job, or plan afresh",
                plan.placement.first().map_or("none", |r| r.device.as_str())
            )));
        }
        Ok(PreviousLayers::from_plan(&plan))
    }

    /// How many of `layers` the device at `path` already held.
    pub fn kept(&self, path: &str, layers: &[usize]) -> u32 {
        self.by_device.get(path).map_or(0, |held| {
            layers.iter().filter(|l| held.contains(l)).count() as u32
        })
    }
}
