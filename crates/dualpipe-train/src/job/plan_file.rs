//! `dualpipe train --plan FILE`: training with the best plan of `dualpipe plan --format json`
//! (its schedule kind, ranks, micro-batches, stages per rank and layer partition).
//!
//! The plan's rank-to-device map is kept for the report ([`PlanChoice::placement`]): local
//! threads and MPI processes run where they are started, so the map says where to start them.

use dualpipe_plan::{Plan, PlanReport};
use dualpipe_schedule::ScheduleKind;

use crate::config::{Field, Naming, TrainConfig};
use crate::error::TrainError;
use crate::parallel::stages::partition::format_partition;

/// What training takes from a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanChoice {
    /// The schedule kind.
    pub schedule: ScheduleKind,
    /// Pipeline ranks.
    pub ranks: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Stages per rank (interleaved).
    pub virtual_stages: usize,
    /// Blocks per model stage, input to output.
    pub partition: Vec<usize>,
    /// `(rank, device path)` of every rank, in rank order.
    pub placement: Vec<(usize, String)>,
    /// What each model stage recomputes to fit its devices' memory (all none: the plan
    /// needs no recomputation).
    pub recompute: Vec<dualpipe_nn::Recompute>,
}

impl PlanChoice {
    /// The best (first) plan of `dualpipe plan --format json` output; `source` names the
    /// file in errors.
    pub fn from_json(text: &str, source: &str) -> Result<PlanChoice, TrainError> {
        let report: PlanReport = serde_json::from_str(text).map_err(|e| {
            TrainError::Config(format!(
                "{source}: not the JSON of `dualpipe plan --format json` ({e})"
            ))
        })?;
        let Some(plan) = report.plans.first() else {
            return Err(TrainError::Config(format!(
                "{source}: the plan file holds no plan (every candidate was rejected); plan \
                 again with other schedules or micro-batch counts"
            )));
        };
        Self::from_plan(plan, source)
    }

    /// What training takes from `plan`, the first plan of the file `source`, checked whole
    /// first ([`Plan::check`]: its schedule, ranks, micro-batches, stages per rank,
    /// partition, stages and placement, each fault named by its field in the file).
    pub fn from_plan(plan: &Plan, source: &str) -> Result<PlanChoice, TrainError> {
        let schedule = plan
            .check("plans[0]")
            .map_err(|e| TrainError::Config(format!("{source}: {e}")))?;
        let mut stages = plan.stages.clone();
        stages.sort_by_key(|s| s.stage);
        let partition = stages.iter().map(|s| s.end_layer - s.first_layer).collect();
        let recompute = stages.iter().map(|s| s.recompute).collect();
        let mut placement: Vec<(usize, String)> = plan
            .placement
            .iter()
            .map(|r| (r.rank, r.device.clone()))
            .collect();
        placement.sort();
        Ok(PlanChoice {
            schedule,
            ranks: plan.ranks,
            micro_batches: plan.micro_batches,
            virtual_stages: plan.virtual_stages.max(1),
            partition,
            placement,
            recompute,
        })
    }

    /// Sets `config`'s schedule, ranks, micro-batches, stages per rank, partition and (when
    /// the plan needs one) recomputation from the plan. A value of `config` that differs from
    /// `defaults` (so the user set it) and from the plan is an error naming both; so is a
    /// recomputation that differs from one the plan needs.
    pub fn apply(
        &self,
        config: &mut TrainConfig,
        defaults: &TrainConfig,
        naming: Naming,
    ) -> Result<(), TrainError> {
        let clash = |what: String, given: String, planned: String| {
            TrainError::Config(format!(
                "{what} {given} disagrees with the plan's {planned}; drop the flag or plan again"
            ))
        };
        if config.schedule.kind != defaults.schedule.kind && config.schedule.kind != self.schedule {
            return Err(clash(
                Field::Schedule.name(naming),
                config.schedule.kind.to_string(),
                self.schedule.to_string(),
            ));
        }
        for (field, given, default, planned) in [
            (
                Field::Ranks,
                config.schedule.ranks,
                defaults.schedule.ranks,
                self.ranks,
            ),
            (
                Field::MicroBatches,
                config.schedule.micro_batches,
                defaults.schedule.micro_batches,
                self.micro_batches,
            ),
        ] {
            if given != default && given != planned {
                return Err(clash(
                    field.name(naming),
                    given.to_string(),
                    planned.to_string(),
                ));
            }
        }
        if self.schedule == ScheduleKind::Interleaved
            && config.schedule.virtual_stages != config.schedule.kind.default_virtual_stages()
            && config.schedule.virtual_stages != self.virtual_stages
        {
            return Err(clash(
                Field::VirtualStages.name(naming),
                config.schedule.virtual_stages.to_string(),
                self.virtual_stages.to_string(),
            ));
        }
        if let Some(p) = &config.model.partition {
            if *p != self.partition {
                return Err(clash(
                    Field::Partition.name(naming),
                    format_partition(p),
                    format_partition(&self.partition),
                ));
            }
        }
        let blocks: usize = self.partition.iter().sum();
        if config.model.layers_per_stage != defaults.model.layers_per_stage
            && config
                .model
                .layers_per_stage
                .saturating_mul(self.partition.len())
                != blocks
        {
            return Err(clash(
                Field::LayersPerStage.name(naming),
                config.model.layers_per_stage.to_string(),
                format!(
                    "{blocks} blocks over {} stages ({})",
                    self.partition.len(),
                    format_partition(&self.partition)
                ),
            ));
        }
        config.schedule.kind = self.schedule;
        config.schedule.ranks = self.ranks;
        config.schedule.micro_batches = self.micro_batches;
        config.schedule.virtual_stages = if self.schedule == ScheduleKind::Interleaved {
            self.virtual_stages
        } else {
            self.schedule.default_virtual_stages()
        };
        if config.model_stages() != self.partition.len() {
            return Err(TrainError::Config(format!(
                "the plan's {} on {} ranks has {} model stages but lists {} stages; plan again",
                self.schedule,
                self.ranks,
                config.model_stages(),
                self.partition.len()
            )));
        }
        config.model.partition = Some(self.partition.clone());
        // The plan's recomputation, when it needs one, is part of its memory fit: a given one
        // that differs stage by stage is refused like any other flag that disagrees (one that
        // recomputes where the plan needs none only spends time, and is kept).
        let needed = self
            .recompute
            .iter()
            .any(|&r| r != dualpipe_nn::Recompute::None);
        match &config.model.recompute {
            Some(given) if needed => {
                let stage = |s: usize| match given.as_slice() {
                    [] => dualpipe_nn::Recompute::None,
                    [one] => *one,
                    many => many.get(s).copied().unwrap_or_default(),
                };
                if (0..self.recompute.len()).any(|s| stage(s) != self.recompute[s]) {
                    return Err(clash(
                        Field::Recompute.name(naming),
                        crate::config::recompute::format_recompute(given),
                        crate::config::recompute::format_recompute(&self.recompute),
                    ));
                }
            }
            None if needed => config.model.recompute = Some(self.recompute.clone()),
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScheduleSection;

    fn plan_json(schedule: &str, stages: &[(usize, usize)]) -> String {
        let stages: Vec<String> = stages
            .iter()
            .enumerate()
            .map(|(i, (a, b))| format!(r#"{{"stage": {i}, "first_layer": {a}, "end_layer": {b}}}"#))
            .collect();
        format!(
            r#"{{"plans": [{{"schedule": "{schedule}", "ranks": 4, "micro_batches": 8,
            "virtual_stages": 1, "partition": "min-max", "step_time": 1, "throughput": 8,
            "bubble_ratio": 0.1, "peak_memory_share": 0.5, "stages": [{}], "placement": [{}]}}],
            "rejected": []}}"#,
            stages.join(","),
            (0..4)
                .map(|r| format!(
                    r#"{{"rank": {r}, "device": "dc/n/g{r}", "speed": 1, "memory_capacity": 1,
                    "stages": [[0, {r}]], "layers": [], "memory": 1, "busy": 1}}"#
                ))
                .collect::<Vec<_>>()
                .join(",")
        )
    }

    #[test]
    fn takes_the_best_plan_and_refuses_flags_that_disagree() {
        let text = plan_json("1f1b", &[(0, 3), (3, 5), (5, 7), (7, 8)]);
        let choice = PlanChoice::from_json(&text, "p.json").unwrap();
        assert_eq!(choice.partition, vec![3, 2, 2, 1]);
        let mut c = TrainConfig::DEFAULT;
        choice
            .apply(&mut c, &TrainConfig::DEFAULT, Naming::Flags)
            .unwrap();
        assert_eq!(
            (c.schedule.kind, c.schedule.micro_batches),
            (ScheduleKind::OneFOneB, 8)
        );
        assert_eq!(c.model.partition.as_deref(), Some(&[3, 2, 2, 1][..]));
        let mut c = TrainConfig {
            schedule: ScheduleSection {
                micro_batches: 32,
                ..TrainConfig::DEFAULT.schedule
            },
            ..TrainConfig::DEFAULT
        };
        let err = choice
            .apply(&mut c, &TrainConfig::DEFAULT, Naming::Flags)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--micro-batches 32 disagrees with the plan's 8"),
            "{err}"
        );
        let mut c = TrainConfig {
            schedule: ScheduleSection {
                kind: ScheduleKind::GPipe,
                ..TrainConfig::DEFAULT.schedule
            },
            ..TrainConfig::DEFAULT
        };
        let err = choice
            .apply(&mut c, &TrainConfig::DEFAULT, Naming::Flags)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--schedule gpipe disagrees with the plan's 1f1b"),
            "{err}"
        );
    }

    #[test]
    fn a_recomputation_that_disagrees_with_the_plans_is_refused() {
        use dualpipe_nn::Recompute;
        let text = plan_json("1f1b", &[(0, 3), (3, 5), (5, 7), (7, 8)]);
        let mut choice = PlanChoice::from_json(&text, "p.json").unwrap();
        choice.recompute = vec![Recompute::Full; 4];
        for given in [vec![Recompute::None], vec![Recompute::Selective; 4]] {
            let mut c = TrainConfig::DEFAULT;
            c.model.recompute = Some(given);
            let err = choice
                .apply(&mut c, &TrainConfig::DEFAULT, Naming::Flags)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("disagrees with the plan's full,full,full,full"),
                "{err}"
            );
        }
        // The same recomputation, once or per stage, and none given: the plan's.
        for given in [
            Some(vec![Recompute::Full]),
            Some(vec![Recompute::Full; 4]),
            None,
        ] {
            let mut c = TrainConfig::DEFAULT;
            c.model.recompute = given;
            choice
                .apply(&mut c, &TrainConfig::DEFAULT, Naming::Flags)
                .unwrap();
            assert!(c.recomputes());
        }
        // Recomputing where the plan needs none only spends time: kept.
        choice.recompute = vec![Recompute::None; 4];
        let mut c = TrainConfig::DEFAULT;
        c.model.recompute = Some(vec![Recompute::Full]);
        choice
            .apply(&mut c, &TrainConfig::DEFAULT, Naming::Flags)
            .unwrap();
        assert_eq!(c.model.recompute, Some(vec![Recompute::Full]));
    }

    #[test]
    fn bad_plan_files_are_one_clear_line() {
        let err = PlanChoice::from_json("{", "p.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("p.json: not the JSON of `dualpipe plan"),
            "{err}"
        );
        let gap = plan_json("1f1b", &[(0, 3), (4, 5), (5, 7), (7, 8)]);
        let err = PlanChoice::from_json(&gap, "p.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(": p.json: plans[0].stages[1]: layers 4..5"),
            "{err}"
        );
        for (field, value, want) in [
            (
                "\"micro_batches\": 8",
                "\"micro_batches\": 0",
                "plans[0].micro_batches: 0",
            ),
            (
                "\"schedule\": \"1f1b\"",
                "\"schedule\": \"dualpipev\"",
                "plans[0].stages",
            ),
            (
                "\"virtual_stages\": 1",
                "\"virtual_stages\": 7",
                "plans[0].virtual_stages: 7",
            ),
            ("\"ranks\": 4", "\"ranks\": 3", "plans[0].stages"),
            (
                "\"partition\": \"min-max\"",
                "\"partition\": \"weird\"",
                "plans[0].partition",
            ),
        ] {
            let good = plan_json("1f1b", &[(0, 3), (3, 5), (5, 7), (7, 8)]);
            let bad = good.replacen(field, value, 1);
            assert_ne!(bad, good, "{field}");
            let err = PlanChoice::from_json(&bad, "p.json")
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!(": p.json: {want}")), "{err}");
            assert!(!err.contains("--"), "{err}");
        }
        let none = r#"{"plans": [], "rejected": []}"#;
        let err = PlanChoice::from_json(none, "p.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("holds no plan"), "{err}");
    }
}
