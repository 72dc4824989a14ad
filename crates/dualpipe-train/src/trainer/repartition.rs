//! Moving whole blocks between stages at a step boundary: [`Trainer::repartition`], and
//! stage re-partitioning as a [`Parallelism`] of the run (the
//! [`StageRebalancer`](crate::rebalance::StageRebalancer) after each step).

use std::collections::HashMap;

use dualpipe_nn::{ModelStage, Optimizer, ParamState, StagePosition};
use dualpipe_runtime::RankStages;

use super::phase::Parallelism;
use super::{StepReport, Trainer};
use crate::config::{ModelKind, Naming};
use crate::driver::Driver;
use crate::error::TrainError;
use crate::partition::format_partition;
use crate::rebalance::{head_units, Repartition, StageRebalancer};
use crate::workload::gpt_stage;

impl<D: Driver> Trainer<D> {
    /// Moves to the partition `blocks` (blocks per model stage) between steps: every held
    /// copy is rebuilt with its new blocks from the current weights (and the MoE selection
    /// biases), and every parameter's optimizer state (AdamW moments, SGD momentum) and the
    /// step count go with it, by name. The next steps compute exactly what they would have
    /// computed without the move. Needs the GPT, every rank in this process and one replica.
    pub fn repartition(&mut self, blocks: Vec<usize>) -> Result<(), TrainError> {
        self.check_movable("re-partitioning")?;
        let mut config = self.config.clone();
        config.model.partition = Some(blocks);
        config.check_partition(Naming::Fields)?;
        let Some(gpt) = self.workload.gpt() else {
            return Err(TrainError::Config(
                "only the GPT's stages re-partition".into(),
            ));
        };
        let mut weights = gpt.weights.clone();
        let mut states: HashMap<String, ParamState> = HashMap::new();
        let mut steps = 0;
        for s in 0..self.config.model_stages() {
            let (Some(stage), Some(opt)) = (
                self.canonical_copy(s).and_then(ModelStage::as_gpt),
                self.optimizer_of(s),
            ) else {
                return Err(TrainError::Execution(format!(
                    "re-partitioning: model stage {s} is not held here"
                )));
            };
            stage.write_into(&mut weights)?;
            steps = opt.steps();
            for (name, state) in stage.param_names().into_iter().zip(opt.state()) {
                states.insert(name, state.clone());
            }
        }
        let stages = config.model_stages();
        let per_dir = self.schedule.micro_batches_per_dir();
        let mut new_stages = Vec::with_capacity(self.held.len());
        let mut new_optimizers = Vec::with_capacity(self.held.len());
        for &rank in &self.held {
            let mut copies = RankStages::new();
            for (dir, stage) in self.schedule.placement.stages_of(rank) {
                let position = StagePosition {
                    dir,
                    model_stage: stage,
                    micro_batches: config.schedule.micro_batches,
                    micro_batches_per_dir: per_dir,
                };
                let copy = gpt_stage(&config, &weights, stages, position)?;
                copies.insert(dir, stage, ModelStage::new(copy));
            }
            // `optimizers[i][j]` updates the `j`-th copy of `stages[i]` in iteration order.
            let mut optimizers = Vec::with_capacity(copies.len());
            for (_, copy) in copies.iter() {
                let mut opt = config.new_optimizer();
                if steps > 0 {
                    let state = copy
                        .param_names()
                        .iter()
                        .map(|n| {
                            states.get(n).cloned().ok_or_else(|| {
                                TrainError::Execution(format!(
                                    "re-partitioning: no optimizer state for `{n}`"
                                ))
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    opt.set_state(steps, state)?;
                }
                optimizers.push(opt);
            }
            new_stages.push(copies);
            new_optimizers.push(optimizers);
        }
        self.stages = new_stages;
        self.optimizers = new_optimizers;
        self.config = config;
        self.gathered = None;
        Ok(())
    }

    /// The optimizer of the canonical copy of model stage `s`.
    fn optimizer_of(&self, s: usize) -> Option<&Optimizer> {
        let canonical = self.canonical_copy(s)?;
        self.stages
            .iter()
            .zip(&self.optimizers)
            .flat_map(|(rank, opts)| rank.iter().map(|(_, st)| st).zip(opts))
            .find(|(st, _)| std::ptr::eq(*st, canonical))
            .map(|(_, o)| o)
    }

    /// Refuses what cannot move blocks: the MLP, ranks in other processes, replicas.
    pub(super) fn check_movable(&self, what: &str) -> Result<(), TrainError> {
        if self.config.model.kind != ModelKind::Gpt {
            return Err(TrainError::Config(format!(
                "{what} moves the GPT's blocks; the MLP's stages stay as they are"
            )));
        }
        if self.held.len() != self.config.schedule.ranks {
            return Err(TrainError::Config(format!(
                "{what} moves blocks between the ranks of one process; under `transport` mpi \
                 train with a static `partition` (or `plan`) instead"
            )));
        }
        if self.config.parallelism.data_parallel > 1 || self.exchange().is_some() {
            return Err(TrainError::Config(format!(
                "{what} works on one pipeline replica for now; drop `data_parallel` {} or \
                 `rebalance`",
                self.config.parallelism.data_parallel
            )));
        }
        Ok(())
    }

    /// The re-partitionings this trainer made, in order.
    pub fn repartitions(&self) -> &[Repartition] {
        self.parallelism::<Repartitioning>()
            .map_or(&[], |r| r.done.as_slice())
    }

    /// The blocks per model stage now, as the flag writes them (`3,2,2,1`).
    pub fn partition_text(&self) -> String {
        format_partition(&self.config.stage_blocks())
    }
}

/// Stage re-partitioning ([`TrainConfig::rebalance`](crate::TrainConfig)): after each step
/// of a run but the last, the rebalancer measures, and the trainer moves blocks when it says
/// so.
#[derive(Debug, Default)]
pub(crate) struct Repartitioning {
    /// The run's rebalancer, built at its first step (a new one for every run).
    rebalancer: Option<StageRebalancer>,
    /// The re-partitionings made so far.
    done: Vec<Repartition>,
}

impl<D: Driver> Parallelism<D> for Repartitioning {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn begin_run(&mut self) {
        self.rebalancer = None;
    }

    fn after_step(&mut self, t: &mut Trainer<D>, report: &StepReport) -> Result<(), TrainError> {
        let Some(settings) = t.config.parallelism.rebalance else {
            return Ok(());
        };
        let r = self.rebalancer.get_or_insert_with(|| {
            StageRebalancer::new(settings, &t.schedule, head_units(t.config.model.d_model))
        });
        let Some(timeline) = &report.timeline else {
            return Ok(());
        };
        let from = t.config.stage_blocks();
        if let Some(p) = r.observe(timeline, &from) {
            let moved = t.repartition(p.to.clone());
            t.own(report.step, moved)?;
            self.done.push(Repartition {
                after_steps: t.steps_done,
                from,
                to: p.to,
                rank_seconds: p.rank_seconds,
                predicted: p.predicted,
            });
        }
        Ok(())
    }
}
