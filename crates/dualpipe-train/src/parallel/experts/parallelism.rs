//! The MoE experts as a [`Parallelism`] of the step: after the optimizer, the router counts
//! of every copy of each MoE block summed, over data-parallel replicas the expert group's
//! EPLB re-placement, the auxiliary-loss-free bias step applied to every copy alike, and the
//! step's [`ExpertLoad`]; after the pipeline's backward, the group's routed experts' gradients
//! summed among their holders; the group's state in checkpoints.

use dualpipe_runtime::RankStages;

use dualpipe_nn::gpt::GptWeights;

use crate::checkpoint::{Checkpoint, HostTensor};
use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::parallel::experts::group::{ExpertGroup, ExpertLinks};
use crate::parallel::experts::{sum_by_layer, ExpertLoad};
use crate::step::collective::gather_f64s;
use crate::step::driver::{Driver, Round};
use crate::step::{Parallelism, StageRead, StepState, StepView, Trainer};
use crate::summary::RunSummary;

/// The MoE experts of a run (present when the model has MoE blocks): the balance after every
/// step, and over data-parallel replicas this replica's part in the expert group (joined by
/// [`Trainer::join_expert_group`] before the first step).
#[derive(Debug, Default)]
pub(crate) struct Experts {
    /// This replica's part in the group (`None`: one replica, or not joined yet).
    pub group: Option<ExpertGroup>,
}

impl<D: Driver> Parallelism<D> for Experts {
    fn check_ready(&self, trainer: &StageRead<'_>) -> Result<(), TrainError> {
        if trainer.config.parallelism.data_parallel > 1 && self.group.is_none() {
            return Err(TrainError::Config(
                "a mixture of experts over data-parallel replicas needs its expert group: call \
                 Trainer::join_expert_group before the first step"
                    .into(),
            ));
        }
        Ok(())
    }

    fn after_backward(
        &mut self,
        trainer: &mut StepView<'_, D>,
        state: &mut StepState,
    ) -> Result<(), TrainError> {
        // The routed experts of an expert-parallel run: summed among their holders.
        let experts = match &mut self.group {
            Some(group) => {
                group.exchange_gradients(state.step, trainer.stages, state.copies_summed)
            }
            None => Ok(()),
        };
        trainer.own(state.step, experts)
    }

    fn sharded_squares(
        &mut self,
        trainer: &mut StepView<'_, D>,
        step: usize,
    ) -> Result<Option<f64>, TrainError> {
        match &mut self.group {
            Some(group) => Ok(Some(group.expert_squares(step, trainer.stages)?)),
            None => Ok(None),
        }
    }

    fn after_optimizer(
        &mut self,
        trainer: &mut StepView<'_, D>,
        state: &mut StepState,
    ) -> Result<(), TrainError> {
        let balanced = self.balance(trainer, state.step);
        state.expert_load = trainer.own(state.step, balanced)?;
        Ok(())
    }

    fn end_run(
        &mut self,
        trainer: &mut StepView<'_, D>,
        _seconds: f64,
        summary: &mut RunSummary,
    ) -> Result<(), TrainError> {
        if let Some((rebalances, moved, scratch, bytes)) = self.rebalance_over_ranks(trainer)? {
            summary.eplb_rebalances = Some(rebalances);
            summary.experts_moved = Some(moved);
            summary.experts_moved_from_scratch = Some(scratch);
            summary.expert_bytes_moved = Some(bytes);
        }
        Ok(())
    }

    /// With expert parallelism each worker holds only its routed experts.
    fn shards_weights(&self, config: &TrainConfig) -> bool {
        self.group.is_some() && config.model.moe.is_some_and(|m| m.expert_parallel)
    }

    /// The routed experts of the held blocks (each worker stores only its own).
    fn gather_shards(
        &mut self,
        view: &mut StepView<'_, D>,
        template: &mut GptWeights,
    ) -> Result<(), TrainError> {
        if let Some(group) = self.group.as_mut() {
            group.gather_experts(view.steps_done, view.stages, template)?;
        }
        Ok(())
    }

    fn checkpoint_tensors(
        &self,
        trainer: &StageRead<'_>,
        tensors: &mut Vec<HostTensor>,
    ) -> Result<(), TrainError> {
        if let (Some(group), 0) = (&self.group, trainer.replica) {
            tensors.extend(group.checkpoint_tensors(trainer.stages));
        }
        Ok(())
    }

    fn restore_placement(
        &mut self,
        trainer: &mut StepView<'_, D>,
        checkpoint: &Checkpoint,
    ) -> Result<(), TrainError> {
        if let Some(group) = &mut self.group {
            group.restore(
                checkpoint,
                trainer.stages,
                trainer.config.model.dtype.candle(),
            )?;
        }
        Ok(())
    }
}

impl Experts {
    /// The step's counts over every held copy, and the bias step from them on each copy
    /// (the copies stay equal: each takes the same sums).
    fn balance<D: Driver>(
        &mut self,
        t: &mut StepView<'_, D>,
        step: usize,
    ) -> Result<Option<ExpertLoad>, TrainError> {
        let Some(moe) = t.config.model.moe else {
            return Ok(None);
        };
        let copies = t
            .stages
            .iter()
            .flat_map(RankStages::iter)
            .filter_map(|(_, s)| s.experts().map(|g| g.router_counts()))
            .flatten();
        let mut totals = sum_by_layer(copies);
        if t.held.len() < t.config.schedule.ranks {
            totals = counts_over_ranks(t, step, Round::RouterCounts, totals)?;
        }
        let mut worker_rows = None;
        if self.group.is_some() {
            let served = t
                .stages
                .iter()
                .flat_map(RankStages::iter)
                .filter_map(|(_, s)| {
                    s.experts().map(|g| {
                        g.moe_layers()
                            .into_iter()
                            .map(|(l, m)| (l, vec![m.served_rows()]))
                            .collect::<Vec<_>>()
                    })
                })
                .flatten();
            let mut served = sum_by_layer(served);
            if t.held.len() < t.config.schedule.ranks {
                served = counts_over_ranks(t, step, Round::ServedRows, served)?;
            }
            let served: Vec<(usize, u64)> = served.into_iter().map(|(l, v)| (l, v[0])).collect();
            if let Some(group) = &mut self.group {
                let out = group.step(step, &totals, &served, t.stages, t.optimizers)?;
                totals = out.totals;
                worker_rows = out.worker_rows;
            }
        }
        if moe.bias_update_rate > 0.0 {
            for (_, stage) in t.stages.iter_mut().flat_map(RankStages::iter_mut) {
                if let Some(g) = stage.experts_mut() {
                    for (layer, _) in g.router_counts() {
                        let loads = totals
                            .iter()
                            .find(|(l, _)| *l == layer)
                            .map(|(_, c)| c.as_slice())
                            .unwrap_or_default();
                        g.update_selection_bias(layer, loads, moe.bias_update_rate)?;
                    }
                }
            }
        }
        if t.held.len() < t.config.schedule.ranks {
            totals = blocks_over_ranks(t, step, Round::ExpertLoads, &totals)?;
            if let Some(rows) = worker_rows {
                worker_rows = Some(blocks_over_ranks(t, step, Round::WorkerRows, &rows)?);
            }
        }
        let load = ExpertLoad::new(step, totals);
        Ok(Some(match worker_rows {
            Some(rows) => load.with_worker_rows(rows),
            None => load,
        }))
    }

    /// The group's figures, when it re-places experts (expert parallelism).
    fn placing(&self, moe_expert_parallel: bool) -> Option<&ExpertGroup> {
        self.group.as_ref().filter(|_| moe_expert_parallel)
    }

    /// EPLB's figures of the run so far over every rank of this replica: rebalances, expert
    /// replicas moved, the replicas re-planning from scratch would have moved, and the bytes
    /// this replica sent (`None`: no expert parallelism). A collective call of the pipeline's
    /// processes when they are several: each counts its blocks' figures, so a block held by
    /// `c` ranks (DualPipe's copies) is counted `c` times and the sums are divided by `c`.
    fn rebalance_over_ranks<D: Driver>(
        &self,
        t: &mut StepView<'_, D>,
    ) -> Result<Option<(usize, usize, u64, u64)>, TrainError> {
        let ep = t.config.model.moe.is_some_and(|m| m.expert_parallel);
        let Some(group) = self.placing(ep) else {
            return Ok(None);
        };
        let (rebalances, moved, scratch) = group.rebalance_totals();
        let bytes = group.bytes_moved();
        if t.held.len() == t.config.schedule.ranks {
            return Ok(Some((rebalances, moved, scratch, bytes)));
        }
        let mine = [
            rebalances as f64,
            moved as f64,
            scratch as f64,
            bytes as f64,
        ];
        let parts = gather_f64s(
            t.driver,
            t.steps_done,
            Round::Rebalances,
            &mine,
            t.exec_options,
            "the rebalances' figures",
        )?;
        let mut sums = [0.0f64; 4];
        for values in &parts {
            sums[0] = sums[0].max(values.first().copied().unwrap_or(0.0));
            for (acc, v) in sums[1..].iter_mut().zip(values.iter().skip(1)) {
                *acc += v;
            }
        }
        let held: usize = (0..t.config.schedule.ranks)
            .map(|r| t.schedule.placement.stages_of(r).len())
            .sum();
        let copies = (held / t.config.model_stages().max(1)).max(1) as f64;
        Ok(Some((
            sums[0] as usize,
            (sums[1] / copies) as usize,
            (sums[2] / copies) as u64,
            (sums[3] / copies) as u64,
        )))
    }
}

/// This process's counts per MoE block (`mine`, over its copies) summed with the other
/// ranks' of the same blocks (DualPipe keeps a block's two copies on two ranks), as a
/// process holding every rank sums them. A collective call of the pipeline's processes
/// (gather `round` of `step`).
fn counts_over_ranks<D: Driver>(
    t: &mut StepView<'_, D>,
    step: usize,
    round: Round,
    mine: Vec<(usize, Vec<u64>)>,
) -> Result<Vec<(usize, Vec<u64>)>, TrainError> {
    let parts = gather_blocks(t, step, round, &mine)?;
    let mut totals: Vec<(usize, Vec<u64>)> =
        mine.iter().map(|(l, c)| (*l, vec![0; c.len()])).collect();
    for (l, counts) in parts.into_iter().flatten() {
        if let Some((_, total)) = totals.iter_mut().find(|(b, _)| *b == l) {
            if total.len() != counts.len() {
                return Err(TrainError::Execution(format!(
                    "gathering the router counts: block {l}: {} counts for {}",
                    counts.len(),
                    total.len()
                )));
            }
            total.iter_mut().zip(counts).for_each(|(t, c)| *t += c);
        }
    }
    Ok(totals)
}

/// Every block's figures from the processes holding it (`mine`: this process's, the
/// same on every holder), in block order: the whole model's, for the step's report. A
/// collective call of the pipeline's processes (gather `round` of `step`).
fn blocks_over_ranks<D: Driver>(
    t: &mut StepView<'_, D>,
    step: usize,
    round: Round,
    mine: &[(usize, Vec<u64>)],
) -> Result<Vec<(usize, Vec<u64>)>, TrainError> {
    let mut all: Vec<(usize, Vec<u64>)> = Vec::new();
    for (l, values) in gather_blocks(t, step, round, mine)?.into_iter().flatten() {
        if !all.iter().any(|(b, _)| *b == l) {
            all.push((l, values));
        }
    }
    all.sort_by_key(|(l, _)| *l);
    Ok(all)
}

/// Every process's per-block figures (`mine` here), in process order.
#[allow(clippy::type_complexity)]
fn gather_blocks<D: Driver>(
    t: &mut StepView<'_, D>,
    step: usize,
    round: Round,
    mine: &[(usize, Vec<u64>)],
) -> Result<Vec<Vec<(usize, Vec<u64>)>>, TrainError> {
    let flat: Vec<f64> = mine
        .iter()
        .flat_map(|(l, c)| {
            [*l as f64, c.len() as f64]
                .into_iter()
                .chain(c.iter().map(|&v| v as f64))
        })
        .collect();
    let parts = gather_f64s(
        t.driver,
        step,
        round,
        &flat,
        t.exec_options,
        "the MoE blocks",
    )?;
    let bad = |e: String| TrainError::Execution(format!("gathering the MoE blocks: {e}"));
    let mut out = Vec::with_capacity(parts.len());
    for values in &parts {
        let mut blocks = Vec::new();
        let mut rest = &values[..];
        while let [l, n, tail @ ..] = rest {
            let n = *n as usize;
            let counts = tail
                .get(..n)
                .ok_or_else(|| bad(format!("block {l}: {n} values announced")))?;
            blocks.push((*l as usize, counts.iter().map(|&c| c as u64).collect()));
            rest = &tail[n..];
        }
        out.push(blocks);
    }
    Ok(out)
}

impl<D: Driver> Trainer<D> {
    /// Joins replica `replica` to its MoE group over `links` (called once, before the first
    /// step, by [`LocalReplicas`](crate::LocalReplicas)): the counts are summed over the group
    /// and, with expert parallelism, the experts are served where the placement says.
    pub fn join_expert_group(
        &mut self,
        replica: usize,
        links: ExpertLinks,
    ) -> Result<(), TrainError> {
        let group = ExpertGroup::new(&self.config, replica, links, &mut self.stages)?;
        match self.parallelism_mut::<Experts>() {
            Some(experts) => experts.group = Some(group),
            None => {
                return Err(TrainError::Config(
                    "an expert group needs a model with MoE blocks".into(),
                ))
            }
        }
        Ok(())
    }

    /// The expert group this replica belongs to (`None`: one replica or no MoE).
    pub(crate) fn expert_group(&self) -> Option<&ExpertGroup> {
        self.parallelism::<Experts>()?.group.as_ref()
    }

    /// Bytes of expert weights and optimizer state this replica sent in EPLB's re-placements
    /// (`None`: no expert parallelism).
    pub fn expert_bytes_moved(&self) -> Option<u64> {
        self.expert_group()
            .filter(|_| self.config.model.moe.is_some_and(|m| m.expert_parallel))
            .map(ExpertGroup::bytes_moved)
    }

    /// EPLB's figures of the run so far: rebalances, expert replicas moved, and the replicas
    /// re-planning from scratch would have moved (`None`: no expert parallelism).
    pub fn rebalance_totals(&self) -> Option<(usize, usize, u64)> {
        self.expert_group()
            .filter(|_| self.config.model.moe.is_some_and(|m| m.expert_parallel))
            .map(ExpertGroup::rebalance_totals)
    }
}
