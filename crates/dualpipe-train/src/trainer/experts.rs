//! The trainer's MoE work after each step: the router counts of every copy of each MoE block
//! summed, the auxiliary-loss-free bias step applied to every copy alike, and the step's
//! [`ExpertLoad`].

use dualpipe_nn::ModelStage;
use dualpipe_runtime::RankStages;

use super::Trainer;
use crate::driver::Driver;
use crate::error::TrainError;
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
        let totals = sum_by_layer(copies);
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
        Ok(Some(ExpertLoad::new(step, totals)))
    }
}
