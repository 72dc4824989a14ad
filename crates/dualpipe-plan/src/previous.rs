//! Re-placement after the topology changed: which layers each device held in the previous
//! plan, so that a new placement keeps the most of them (the fewest layer moves), as the EPLB
//! planner keeps experts where they are.

use std::collections::{BTreeMap, BTreeSet};

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
    /// report) or a single plan object, checking its layers exist in a model of `layers`
    /// layers.
    pub fn from_json(text: &str, layers: usize) -> Result<PreviousLayers, PlanError> {
        let plan = match serde_json::from_str::<PlanReport>(text) {
            Ok(report) => report.plans.into_iter().next().ok_or_else(|| {
                PlanError::Previous(
                    "plans: the previous plan file lists no plan; give a file written by `dualpipe plan --format json`".into(),
                )
            })?,
            Err(_) => serde_json::from_str::<Plan>(text).map_err(|e| {
                PlanError::Previous(format!(
                    "not a plan ({e}); give a file written by `dualpipe plan --format json`"
                ))
            })?,
        };
        let previous = PreviousLayers::from_plan(&plan);
        for (device, held) in &previous.by_device {
            if let Some(&l) = held.iter().find(|&&l| l >= layers) {
                return Err(PlanError::Previous(format!(
                    "placement: device {device} held layer {l} but the profile has {layers} layers; plan with the profile the previous plan was made for"
                )));
            }
        }
        Ok(previous)
    }

    /// How many of `layers` the device at `path` already held.
    pub fn kept(&self, path: &str, layers: &[usize]) -> u32 {
        self.by_device.get(path).map_or(0, |held| {
            layers.iter().filter(|l| held.contains(l)).count() as u32
        })
    }
}
