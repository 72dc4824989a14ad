//! The trainer's MoE work after each step: the router counts of every copy of each MoE block
//! summed, the auxiliary-loss-free bias step applied to every copy alike, and the step's
//! [`ExpertLoad`].

use dualpipe_nn::ModelStage;
use dualpipe_runtime::transport::wire::WireData;
use dualpipe_runtime::RankStages;

use super::{Trainer, COUNTS_ROUND};
use crate::driver::Driver;
use crate::error::TrainError;
use crate::expert_parallel::{ExpertGroup, ExpertLinks};
use crate::moe::{sum_by_layer, ExpertLoad};

impl<D: Driver> Trainer<D> {
    /// With MoE: the step's counts over every held copy, and the bias step from them on each
    /// copy (the copies stay equal: each takes the same sums). `None` for a dense model.
    pub(super) fn balance_experts(
        &mut self,
        step: usize,
    ) -> Result<Option<ExpertLoad>, TrainError> {
        let Some(moe) = self.config.moe else {
            return Ok(None);
        };
        let copies = self
            .stages
            .iter()
            .flat_map(RankStages::iter)
            .filter_map(|(_, s)| match s {
                ModelStage::Gpt(g) => Some(g.router_counts()),
                ModelStage::Mlp(_) => None,
            })
            .flatten();
        let mut totals = sum_by_layer(copies);
        if self.held.len() < self.config.ranks {
            totals = self.counts_over_ranks(step, totals)?;
        }
        let mut worker_rows = None;
        if let Some(group) = &mut self.expert_group {
            let served = self
                .stages
                .iter()
                .flat_map(RankStages::iter)
                .filter_map(|(_, s)| match s {
                    ModelStage::Gpt(g) => Some(
                        g.moe_layers()
                            .into_iter()
                            .map(|(l, m)| (l, vec![m.served_rows()]))
                            .collect::<Vec<_>>(),
                    ),
                    ModelStage::Mlp(_) => None,
                })
                .flatten();
            let served: Vec<(usize, u64)> = sum_by_layer(served)
                .into_iter()
                .map(|(l, v)| (l, v[0]))
                .collect();
            let out = group.step(
                step,
                &totals,
                &served,
                &mut self.stages,
                &mut self.optimizers,
            )?;
            totals = out.totals;
            worker_rows = out.worker_rows;
        }
        if moe.bias_update_rate > 0.0 {
            for (_, stage) in self.stages.iter_mut().flat_map(RankStages::iter_mut) {
                if let ModelStage::Gpt(g) = stage {
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
        let load = ExpertLoad::new(step, totals);
        Ok(Some(match worker_rows {
            Some(rows) => load.with_worker_rows(rows),
            None => load,
        }))
    }

    /// This process's counts per MoE block (`mine`, over its copies) summed with the other
    /// ranks' of the same blocks (DualPipe keeps a block's two copies on two ranks), as a
    /// process holding every rank sums them. A collective call of the pipeline's processes.
    fn counts_over_ranks(
        &mut self,
        step: usize,
        mine: Vec<(usize, Vec<u64>)>,
    ) -> Result<Vec<(usize, Vec<u64>)>, TrainError> {
        let flat: Vec<f64> = mine
            .iter()
            .flat_map(|(l, c)| {
                [*l as f64, c.len() as f64]
                    .into_iter()
                    .chain(c.iter().map(|&v| v as f64))
            })
            .collect();
        let parts = self.driver.all_gather(
            step,
            COUNTS_ROUND,
            vec![WireData::from_f64s(&flat)],
            &self.exec_options,
        )?;
        let bad = |e: String| TrainError::Execution(format!("gathering the router counts: {e}"));
        let mut totals: Vec<(usize, Vec<u64>)> =
            mine.iter().map(|(l, c)| (*l, vec![0; c.len()])).collect();
        for part in parts.iter().flatten() {
            let values = part.to_f64s().map_err(|e| bad(e.to_string()))?;
            let mut rest = &values[..];
            while let [l, n, tail @ ..] = rest {
                let n = *n as usize;
                let counts = tail
                    .get(..n)
                    .ok_or_else(|| bad(format!("block {l}: {n} counts announced")))?;
                if let Some((_, total)) = totals.iter_mut().find(|(b, _)| *b as f64 == *l) {
                    if total.len() != n {
                        return Err(bad(format!("block {l}: {n} counts for {}", total.len())));
                    }
                    total.iter_mut().zip(counts).for_each(|(t, &c)| *t += c as u64);
                }
                rest = &tail[n..];
            }
        }
        Ok(totals)
    }

    /// Joins replica `replica` to its MoE group over `links` (called once, before the first
    /// step, by [`DataParallel`](crate::DataParallel)): the counts are summed over the group
    /// and, with expert parallelism, the experts are served where the placement says.
    pub fn join_expert_group(
        &mut self,
        replica: usize,
        links: ExpertLinks,
    ) -> Result<(), TrainError> {
        self.expert_group = Some(ExpertGroup::new(
            &self.config,
            replica,
            links,
            &mut self.stages,
        )?);
        Ok(())
    }

    /// Bytes of expert weights and optimizer state this replica sent in EPLB's re-placements
    /// (`None`: no expert parallelism).
    pub fn expert_bytes_moved(&self) -> Option<u64> {
        self.expert_group
            .as_ref()
            .filter(|_| self.config.moe.is_some_and(|m| m.expert_parallel))
            .map(ExpertGroup::bytes_moved)
    }

    /// EPLB's figures of the run so far: rebalances, expert replicas moved, and the replicas
    /// re-planning from scratch would have moved (`None`: no expert parallelism).
    pub fn rebalance_totals(&self) -> Option<(usize, usize, u64)> {
        self.expert_group
            .as_ref()
            .filter(|_| self.config.moe.is_some_and(|m| m.expert_parallel))
            .map(ExpertGroup::rebalance_totals)
    }
}
