//! [`Plan::check`]: a plan read back from a file (`plan --previous`, `train --plan`) is
//! checked whole before anything uses it, each fault named by its field path in the file.

use std::collections::BTreeSet;

use dualpipe_schedule::{ScheduleKind, StagePlacement};

use crate::assign::MAX_SIDE;
use crate::error::PlanError;
use crate::plan::Plan;

/// The most micro-batches per step a plan file may name.
pub const MAX_PLAN_MICRO_BATCHES: usize = 1 << 20;
/// The most stages per rank an interleaved plan may name.
pub const MAX_PLAN_VIRTUAL_STAGES: usize = 64;

impl Plan {
    /// Checks a plan read from a file, whose first fault is named by its field path under
    /// `at` (such as `plans[0]`): a known schedule kind; 1 to [`MAX_SIDE`] ranks; 1 to
    /// [`MAX_PLAN_MICRO_BATCHES`] micro-batches; the stages per rank its kind runs with;
    /// partition `min-max` or `even`; stages numbered from 0 that cover the layers in order
    /// from 0, one per stage of the schedule, each with a layer; one placement entry per
    /// rank, each on its own device named `datacenter/node/device`, holding only layers of
    /// the plan.
    pub fn check(&self, at: &str) -> Result<ScheduleKind, PlanError> {
        let bad = |field: &str, why: String| fault(at, field, why);
        let kind = ScheduleKind::from_name(&self.schedule).ok_or_else(|| {
            let names: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
            bad(
                "schedule",
                format!(
                    "{:?} is not a schedule kind; use one of {}",
                    shorten(&self.schedule),
                    names.join(", ")
                ),
            )
        })?;
        self.check_sizes(at, kind)?;
        let layers = self.check_stages(at, kind)?;
        self.check_placement(at, layers)?;
        Ok(kind)
    }

    /// The ranks, micro-batches, stages per rank (those `kind` runs with) and partition.
    fn check_sizes(&self, at: &str, kind: ScheduleKind) -> Result<(), PlanError> {
        let bad = |field: &str, why: String| fault(at, field, why);
        if !(1..=MAX_SIDE).contains(&self.ranks) {
            return Err(bad(
                "ranks",
                format!("{} is not 1 to {MAX_SIDE}", self.ranks),
            ));
        }
        if !(1..=MAX_PLAN_MICRO_BATCHES).contains(&self.micro_batches) {
            return Err(bad(
                "micro_batches",
                format!(
                    "{} is not 1 to {MAX_PLAN_MICRO_BATCHES}",
                    self.micro_batches
                ),
            ));
        }
        let allowed: Vec<usize> = match kind.fixed_virtual_stages() {
            Some(fixed) => {
                let mut v = vec![kind.default_virtual_stages(), fixed];
                v.dedup();
                v
            }
            None => (1..=MAX_PLAN_VIRTUAL_STAGES).collect(),
        };
        if !allowed.contains(&self.virtual_stages) {
            let expected = if kind.fixed_virtual_stages().is_some() {
                allowed
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" or ")
            } else {
                format!("1 to {MAX_PLAN_VIRTUAL_STAGES}")
            };
            return Err(bad(
                "virtual_stages",
                format!(
                    "{} for a {kind} plan; it must be {expected}",
                    self.virtual_stages
                ),
            ));
        }
        if self.partition != "min-max" && self.partition != "even" {
            return Err(bad(
                "partition",
                format!(
                    "{:?}; it must be \"min-max\" or \"even\"",
                    shorten(&self.partition)
                ),
            ));
        }
        Ok(())
    }

    /// The stages: one per stage of `kind`'s schedule, numbered from 0, covering the layers
    /// in order from 0, each with a layer; returns the layers they cover.
    fn check_stages(&self, at: &str, kind: ScheduleKind) -> Result<usize, PlanError> {
        let bad = |field: &str, why: String| fault(at, field, why);
        let stages = StagePlacement::for_kind(kind, self.ranks, self.virtual_stages).stages();
        if self.stages.len() != stages {
            return Err(bad(
                "stages",
                format!(
                    "{} stages listed; {kind} on {} ranks has {stages}",
                    self.stages.len(),
                    self.ranks
                ),
            ));
        }
        let mut order: Vec<usize> = (0..self.stages.len()).collect();
        order.sort_by_key(|&i| self.stages[i].stage);
        let mut next = 0;
        for (want, &i) in order.iter().enumerate() {
            let s = &self.stages[i];
            if s.stage != want {
                return Err(bad(
                    &format!("stages[{i}].stage"),
                    format!(
                        "{}; the stages must be numbered 0 to {}",
                        s.stage,
                        stages - 1
                    ),
                ));
            }
            if s.first_layer != next || s.end_layer <= s.first_layer {
                return Err(bad(
                    &format!("stages[{i}]"),
                    format!(
                        "layers {}..{}; the stages must cover the layers in order from 0, \
                         each with at least one layer (this one from layer {next})",
                        s.first_layer, s.end_layer
                    ),
                ));
            }
            next = s.end_layer;
        }
        Ok(next)
    }

    /// The placement: one entry per rank, each on its own device named
    /// `datacenter/node/device`, holding only layers below `layers`.
    fn check_placement(&self, at: &str, layers: usize) -> Result<(), PlanError> {
        let bad = |field: &str, why: String| fault(at, field, why);
        if self.placement.len() != self.ranks {
            return Err(bad(
                "placement",
                format!(
                    "{} entries for {} ranks; give one per rank",
                    self.placement.len(),
                    self.ranks
                ),
            ));
        }
        let (mut ranks, mut devices) = (BTreeSet::new(), BTreeSet::new());
        for (i, r) in self.placement.iter().enumerate() {
            if r.rank >= self.ranks || !ranks.insert(r.rank) {
                return Err(bad(
                    &format!("placement[{i}].rank"),
                    format!(
                        "{} is out of range or listed twice; list ranks 0 to {} once each",
                        r.rank,
                        self.ranks - 1
                    ),
                ));
            }
            let parts: Vec<&str> = r.device.split('/').collect();
            if parts.len() != 3
                || parts.iter().any(|p| p.is_empty())
                || r.device.chars().any(char::is_control)
            {
                return Err(bad(
                    &format!("placement[{i}].device"),
                    format!(
                        "{:?} is not a device path datacenter/node/device",
                        shorten(&r.device)
                    ),
                ));
            }
            if !devices.insert(r.device.as_str()) {
                return Err(bad(
                    &format!("placement[{i}].device"),
                    format!(
                        "{:?} holds two ranks; a plan runs one rank per device",
                        shorten(&r.device)
                    ),
                ));
            }
            if let Some(l) = r.layers.iter().find(|&&l| l >= layers) {
                return Err(bad(
                    &format!("placement[{i}].layers"),
                    format!("layer {l}, but the stages cover layers 0..{layers}"),
                ));
            }
        }
        Ok(())
    }
}

/// The fault `why` of the field `field` of the plan at `at`.
fn fault(at: &str, field: &str, why: String) -> PlanError {
    PlanError::Previous(format!("{at}.{field}: {why}"))
}

/// At most 40 characters of a value shown in a message.
fn shorten(s: &str) -> String {
    let short: String = s.chars().take(40).collect();
    if short.len() < s.len() {
        format!("{short}...")
    } else {
        short
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{RankPlan, StagePlan};

    fn good() -> Plan {
        Plan {
            schedule: "1f1b".into(),
            ranks: 2,
            micro_batches: 4,
            virtual_stages: 1,
            partition: "min-max".into(),
            step_time: 1.0,
            throughput: 4.0,
            bubble_ratio: 0.1,
            peak_memory_share: 0.5,
            layer_moves: None,
            stages: vec![
                StagePlan {
                    stage: 0,
                    first_layer: 0,
                    end_layer: 3,
                    recompute: dualpipe_sim::Recompute::None,
                },
                StagePlan {
                    stage: 1,
                    first_layer: 3,
                    end_layer: 4,
                    recompute: dualpipe_sim::Recompute::None,
                },
            ],
            placement: (0..2)
                .map(|r| RankPlan {
                    rank: r,
                    device: format!("dc/n/g{r}"),
                    speed: 1.0,
                    memory_capacity: 1e9,
                    stages: vec![(0, r)],
                    layers: if r == 0 { vec![0, 1, 2] } else { vec![3] },
                    memory: 1.0,
                    busy: 1.0,
                })
                .collect(),
        }
    }

    /// A change that makes a good plan bad.
    type Spoil = Box<dyn Fn(&mut Plan)>;

    #[test]
    fn a_good_plan_passes_and_each_fault_names_its_field() {
        assert_eq!(good().check("plans[0]").unwrap(), ScheduleKind::OneFOneB);
        let cases: Vec<(&str, Spoil)> = vec![
            (
                "plans[0].schedule",
                Box::new(|p| p.schedule = "bogus".into()),
            ),
            (
                "plans[0].stages: 2 stages listed; 1f1b on 3 ranks",
                Box::new(|p| p.ranks = 3),
            ),
            (
                "plans[0].ranks: 1099511627776",
                Box::new(|p| p.ranks = 1 << 40),
            ),
            (
                "plans[0].micro_batches: 0",
                Box::new(|p| p.micro_batches = 0),
            ),
            (
                "plans[0].virtual_stages: 7",
                Box::new(|p| p.virtual_stages = 7),
            ),
            (
                "plans[0].partition",
                Box::new(|p| p.partition = "weird".into()),
            ),
            (
                "plans[0].stages: 1 stages",
                Box::new(|p| {
                    p.stages.pop();
                }),
            ),
            (
                "plans[0].stages[0]: layers 5..2",
                Box::new(|p| {
                    p.stages[0].first_layer = 5;
                    p.stages[0].end_layer = 2;
                }),
            ),
            (
                "plans[0].stages[1]: layers 4..4",
                Box::new(|p| p.stages[1].first_layer = 4),
            ),
            (
                "plans[0].placement[1].device",
                Box::new(|p| p.placement[1].device = "dc/n/g0".into()),
            ),
            (
                "plans[0].placement[0].device",
                Box::new(|p| p.placement[0].device = "a/b".into()),
            ),
            (
                "plans[0].placement[0].layers: layer 4,",
                Box::new(|p| {
                    p.placement[0].layers = (0..100_000).collect();
                }),
            ),
            (
                "plans[0].placement[1].rank",
                Box::new(|p| p.placement[1].rank = 0),
            ),
        ];
        for (want, spoil) in cases {
            let mut p = good();
            spoil(&mut p);
            let err = p.check("plans[0]").unwrap_err().to_string();
            assert!(err.starts_with(want), "{want}: {err}");
        }
        let mut dualpipe = good();
        dualpipe.schedule = "dualpipe".into();
        dualpipe.virtual_stages = 7;
        let err = dualpipe.check("plans[0]").unwrap_err().to_string();
        assert!(err.contains("it must be 1"), "{err}");
    }
}
