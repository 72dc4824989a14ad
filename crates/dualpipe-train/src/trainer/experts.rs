//! The trainer's MoE work after each step: the router counts of every copy of each MoE block
//! summed, the auxiliary-loss-free bias step applied to every copy alike, and the step's
//! [`ExpertLoad`].

use dualpipe_runtime::RankStages;

use super::{Trainer, COUNTS_ROUND, LOADS_ROUND, REBALANCE_ROUND, ROWS_ROUND, SERVED_ROUND};
use crate::collective::gather_f64s;
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
        let Some(moe) = self.config.model.moe else {
            return Ok(None);
        };
        let copies = self
            .stages
            .iter()
            .flat_map(RankStages::iter)
            .filter_map(|(_, s)| s.experts().map(|g| g.router_counts()))
            .flatten();
        let mut totals = sum_by_layer(copies);
        if self.held.len() < self.config.schedule.ranks {
            totals = self.counts_over_ranks(step, COUNTS_ROUND, totals)?;
        }
        let mut worker_rows = None;
        if self.expert_group.is_some() {
            let served = self
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
            if self.held.len() < self.config.schedule.ranks {
                served = self.counts_over_ranks(step, SERVED_ROUND, served)?;
            }
            let served: Vec<(usize, u64)> = served.into_iter().map(|(l, v)| (l, v[0])).collect();
            if let Some(group) = &mut self.expert_group {
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
        }
        if moe.bias_update_rate > 0.0 {
            for (_, stage) in self.stages.iter_mut().flat_map(RankStages::iter_mut) {
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
        if self.held.len() < self.config.schedule.ranks {
            totals = self.blocks_over_ranks(step, LOADS_ROUND, &totals)?;
            if let Some(rows) = worker_rows {
                worker_rows = Some(self.blocks_over_ranks(step, ROWS_ROUND, &rows)?);
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
    /// process holding every rank sums them. A collective call of the pipeline's processes
    /// (gather `round` of `step`).
    fn counts_over_ranks(
        &mut self,
        step: usize,
        round: usize,
        mine: Vec<(usize, Vec<u64>)>,
    ) -> Result<Vec<(usize, Vec<u64>)>, TrainError> {
        let parts = self.gather_blocks(step, round, &mine)?;
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
    fn blocks_over_ranks(
        &mut self,
        step: usize,
        round: usize,
        mine: &[(usize, Vec<u64>)],
    ) -> Result<Vec<(usize, Vec<u64>)>, TrainError> {
        let mut all: Vec<(usize, Vec<u64>)> = Vec::new();
        for (l, values) in self.gather_blocks(step, round, mine)?.into_iter().flatten() {
            if !all.iter().any(|(b, _)| *b == l) {
                all.push((l, values));
            }
        }
        all.sort_by_key(|(l, _)| *l);
        Ok(all)
    }

    /// Every process's per-block figures (`mine` here), in process order.
    #[allow(clippy::type_complexity)]
    fn gather_blocks(
        &mut self,
        step: usize,
        round: usize,
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
            &mut self.driver,
            step,
            round,
            &flat,
            &self.exec_options,
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
            .filter(|_| self.config.model.moe.is_some_and(|m| m.expert_parallel))
            .map(ExpertGroup::bytes_moved)
    }

    /// EPLB's figures of the run so far over every rank of this replica: rebalances, expert
    /// replicas moved, the replicas re-planning from scratch would have moved, and the bytes
    /// this replica sent (`None`: no expert parallelism). A collective call of the pipeline's
    /// processes when they are several: each counts its blocks' figures, so a block held by
    /// `c` ranks (DualPipe's copies) is counted `c` times and the sums are divided by `c`.
    pub(super) fn rebalance_over_ranks(
        &mut self,
    ) -> Result<Option<(usize, usize, u64, u64)>, TrainError> {
        let Some((rebalances, moved, scratch)) = self.rebalance_totals() else {
            return Ok(None);
        };
        let bytes = self.expert_bytes_moved().unwrap_or(0);
        if self.held.len() == self.config.schedule.ranks {
            return Ok(Some((rebalances, moved, scratch, bytes)));
        }
        let mine = [
            rebalances as f64,
            moved as f64,
            scratch as f64,
            bytes as f64,
        ];
        let parts = gather_f64s(
            &mut self.driver,
            self.steps_done,
            REBALANCE_ROUND,
            &mine,
            &self.exec_options,
            "the rebalances' figures",
        )?;
        let mut sums = [0.0f64; 4];
        for values in &parts {
            sums[0] = sums[0].max(values.first().copied().unwrap_or(0.0));
            for (acc, v) in sums[1..].iter_mut().zip(values.iter().skip(1)) {
                *acc += v;
            }
        }
        let held: usize = (0..self.config.schedule.ranks)
            .map(|r| self.schedule.placement.stages_of(r).len())
            .sum();
        let copies = (held / self.config.model_stages().max(1)).max(1) as f64;
        Ok(Some((
            sums[0] as usize,
            (sums[1] / copies) as usize,
            (sums[2] / copies) as u64,
            (sums[3] / copies) as u64,
        )))
    }

    /// EPLB's figures of the run so far: rebalances, expert replicas moved, and the replicas
    /// re-planning from scratch would have moved (`None`: no expert parallelism).
    pub fn rebalance_totals(&self) -> Option<(usize, usize, u64)> {
        self.expert_group
            .as_ref()
            .filter(|_| self.config.model.moe.is_some_and(|m| m.expert_parallel))
            .map(ExpertGroup::rebalance_totals)
    }
}
