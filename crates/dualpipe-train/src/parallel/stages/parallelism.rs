//! Moving whole blocks between stages at a step boundary: [`Trainer::repartition`], and
//! stage re-partitioning as a [`Parallelism`] of the run (the
//! [`StageRebalancer`](crate::parallel::stages::rebalance::StageRebalancer) after each step).

use std::collections::HashMap;

use dualpipe_nn::{ModelStage, Optimizer, ParamState, StagePosition};
use dualpipe_runtime::RankStages;

use crate::config::{ModelKind, Naming, TrainConfig};
use crate::error::TrainError;
use crate::model::gpt_stage;
use crate::parallel::stages::partition::format_partition;
use crate::parallel::stages::rebalance::{head_units, Repartition, StageRebalancer};
use crate::step::driver::Driver;
use crate::step::{Parallelism, StageRead, StepReport, StepView, Trainer};

impl<D: Driver> Trainer<D> {
    /// Moves to the partition `blocks` (blocks per model stage) between steps: every held
    /// copy is rebuilt with its new blocks from the current weights (and the MoE selection
    /// biases), and every parameter's optimizer state (AdamW moments, SGD momentum) and the
    /// step count go with it, by name. The next steps compute exactly what they would have
    /// computed without the move. Needs the GPT, every rank in this process and one replica.
    pub fn repartition(&mut self, blocks: Vec<usize>) -> Result<(), TrainError> {
        let replicated = self.replicated;
        self.with_view(|view| {
            let config = move_blocks(view, replicated, blocks)?;
            view.reconfigured = Some(config);
            Ok(())
        })
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

/// Rebuilds the stages and optimizers of `view` on the partition `blocks` (see
/// [`Trainer::repartition`]) and returns the configuration with that partition.
fn move_blocks<D: Driver>(
    view: &mut StepView<'_, D>,
    replicated: bool,
    blocks: Vec<usize>,
) -> Result<TrainConfig, TrainError> {
    check_movable(&view.read(), replicated, "re-partitioning")?;
    let mut config = view.config.clone();
    config.model.partition = Some(blocks);
    config.check_partition(Naming::Fields)?;
    let Some(gpt) = view.workload.gpt() else {
        return Err(TrainError::Config(
            "only the GPT's stages re-partition".into(),
        ));
    };
    let mut weights = gpt.weights.clone();
    let mut states: HashMap<String, ParamState> = HashMap::new();
    let mut steps = 0;
    for s in 0..view.config.model_stages() {
        let Some((stage, opt)) = canonical_copy(view, s) else {
            return Err(TrainError::Execution(format!(
                "re-partitioning: model stage {s} is not held here"
            )));
        };
        let Some(stage) = stage.as_gpt() else {
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
    let per_dir = view.schedule.micro_batches_per_dir();
    let mut new_stages = Vec::with_capacity(view.held.len());
    let mut new_optimizers = Vec::with_capacity(view.held.len());
    for &rank in view.held {
        let mut copies = RankStages::new();
        for (dir, stage) in view.schedule.placement.stages_of(rank) {
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
    *view.stages = new_stages;
    *view.optimizers = new_optimizers;
    Ok(config)
}

/// The copy of model stage `s` of the lowest direction among those `view` holds, with its
/// optimizer.
fn canonical_copy<'v, D: Driver>(
    view: &'v StepView<'_, D>,
    s: usize,
) -> Option<(&'v ModelStage, &'v Optimizer)> {
    view.stages
        .iter()
        .zip(view.optimizers.iter())
        .flat_map(|(rank, opts)| rank.iter().map(|(_, st)| st).zip(opts))
        .filter(|(st, _)| st.model_stage() == s)
        .min_by_key(|(st, _)| st.dir())
}

/// Refuses what cannot move blocks: the MLP, ranks in other processes, replicas.
fn check_movable(read: &StageRead<'_>, replicated: bool, what: &str) -> Result<(), TrainError> {
    if read.config.model.kind != ModelKind::Gpt {
        return Err(TrainError::Config(format!(
            "{what} moves the GPT's blocks; the MLP's stages stay as they are"
        )));
    }
    if read.held.len() != read.config.schedule.ranks {
        return Err(TrainError::Config(format!(
            "{what} moves blocks between the ranks of one process; under `transport` mpi \
             train with a static `partition` (or `plan`) instead"
        )));
    }
    if read.config.parallelism.data_parallel > 1 || replicated {
        return Err(TrainError::Config(format!(
            "{what} works on one pipeline replica for now; drop `data_parallel` {} or \
             `rebalance`",
            read.config.parallelism.data_parallel
        )));
    }
    Ok(())
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
    /// Whether the trainer is one replica of a data-parallel run (then no block moves).
    replicated: bool,
}

impl Repartitioning {
    /// Re-partitioning of a trainer that is one replica of several (`replicated`) or not.
    pub(crate) fn new(replicated: bool) -> Self {
        Repartitioning {
            replicated,
            ..Repartitioning::default()
        }
    }
}

impl<D: Driver> Parallelism<D> for Repartitioning {
    fn begin_run(&mut self) {
        self.rebalancer = None;
    }

    fn after_step(
        &mut self,
        t: &mut StepView<'_, D>,
        report: &StepReport,
    ) -> Result<(), TrainError> {
        let Some(settings) = t.config.parallelism.rebalance else {
            return Ok(());
        };
        let r = self.rebalancer.get_or_insert_with(|| {
            StageRebalancer::new(settings, t.schedule, head_units(t.config.model.d_model))
        });
        let Some(timeline) = &report.timeline else {
            return Ok(());
        };
        let from = t.config.stage_blocks();
        if let Some(p) = r.observe(timeline, &from) {
            let moved = move_blocks(t, self.replicated, p.to.clone());
            t.reconfigured = Some(t.own(report.step, moved)?);
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
