//! How balanced a placement is: per-GPU loads, hottest GPU over the mean, balancedness.
//!
//! A replica carries its expert's load divided by the expert's replica count (the
//! reference's model: tokens are spread evenly over an expert's replicas). Totals over
//! layers add the layers up, since MoE layers run one after another: the total imbalance is
//! `sum(max) / sum(mean)`.

use serde::Serialize;

use crate::matrix::{LoadMatrix, Matrix};
use crate::plan::ExpertPlan;
use crate::EplbError;

/// The hottest and the mean GPU load of one layer (or of all layers added up).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LayerBalance {
    /// Load of the most loaded GPU.
    pub max_load: f64,
    /// Mean load over GPUs.
    pub mean_load: f64,
}

impl LayerBalance {
    /// Hottest GPU over the mean (1.0 is perfect; 1.0 when there is no load).
    pub fn imbalance(&self) -> f64 {
        if self.mean_load > 0.0 {
            self.max_load / self.mean_load
        } else {
            1.0
        }
    }

    /// Mean over hottest GPU, in (0, 1] (1.0 is perfect; 1.0 when there is no load).
    pub fn balancedness(&self) -> f64 {
        if self.max_load > 0.0 {
            self.mean_load / self.max_load
        } else {
            1.0
        }
    }
}

/// Balance of every layer and of all layers together.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BalanceStats {
    /// One entry per layer.
    pub layers: Vec<LayerBalance>,
    /// All layers added up: `max_load` and `mean_load` are sums over layers.
    pub total: LayerBalance,
}

impl BalanceStats {
    /// Statistics of a `[layers][gpus]` load matrix.
    pub fn from_gpu_loads(gpu_loads: &Matrix<f64>) -> Self {
        let layers: Vec<LayerBalance> = gpu_loads
            .iter_rows()
            .map(|row| LayerBalance {
                max_load: row.iter().copied().fold(0.0, f64::max),
                mean_load: row.iter().sum::<f64>() / row.len().max(1) as f64,
            })
            .collect();
        let total = LayerBalance {
            max_load: layers.iter().map(|l| l.max_load).sum(),
            mean_load: layers.iter().map(|l| l.mean_load).sum(),
        };
        Self { layers, total }
    }
}

/// Balance before (no replicas, experts in order over GPUs) and after a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanStats {
    /// Experts laid out in order over the GPUs, one copy each ([`baseline_gpu_loads`]).
    pub before: BalanceStats,
    /// With the plan's replicas and placement ([`gpu_loads`]).
    pub after: BalanceStats,
}

/// Per-GPU loads `[layers][gpus]` without replication: expert `e` of `E` sits on GPU
/// `e * num_gpus / E` (contiguous blocks, as a plain expert-parallel layout does).
pub fn baseline_gpu_loads(loads: &LoadMatrix, num_gpus: usize) -> Matrix<f64> {
    let experts = loads.cols();
    let mut out = Matrix::filled(loads.rows(), num_gpus, 0.0);
    if num_gpus == 0 {
        return out;
    }
    for layer in 0..loads.rows() {
        let row = loads.row(layer);
        let dst = out.row_mut(layer);
        for (e, &load) in row.iter().enumerate() {
            dst[e * num_gpus / experts] += load;
        }
    }
    out
}

/// Per-GPU loads `[layers][gpus]` under `plan`: each physical slot carries its expert's load
/// divided by the expert's replica count. Fails if `loads` has a different shape than the
/// plan.
pub fn gpu_loads(loads: &LoadMatrix, plan: &ExpertPlan) -> Result<Matrix<f64>, EplbError> {
    check_shape(loads, plan)?;
    let per_gpu = plan.replicas_per_gpu().max(1);
    let mut out = Matrix::filled(loads.rows(), plan.num_gpus, 0.0);
    for layer in 0..loads.rows() {
        let row = loads.row(layer);
        let cnt = plan.logcnt.row(layer);
        let dst = out.row_mut(layer);
        for (slot, &log) in plan.phy2log.row(layer).iter().enumerate() {
            let log = log as usize;
            dst[slot / per_gpu] += row[log] / cnt[log] as f64;
        }
    }
    Ok(out)
}

fn check_shape(loads: &LoadMatrix, plan: &ExpertPlan) -> Result<(), EplbError> {
    if loads.rows() != plan.num_layers() || loads.cols() != plan.num_experts() {
        return Err(EplbError::ShapeMismatch {
            layers: plan.num_layers(),
            experts: plan.num_experts(),
            expected: plan.num_layers() * plan.num_experts(),
            len: loads.rows() * loads.cols(),
        });
    }
    Ok(())
}

impl ExpertPlan {
    /// Per-GPU loads under this plan; see [`gpu_loads`].
    pub fn gpu_loads(&self, loads: &LoadMatrix) -> Result<Matrix<f64>, EplbError> {
        gpu_loads(loads, self)
    }

    /// Balance before and after this plan for `loads`.
    pub fn stats(&self, loads: &LoadMatrix) -> Result<PlanStats, EplbError> {
        Ok(PlanStats {
            before: BalanceStats::from_gpu_loads(&baseline_gpu_loads(loads, self.num_gpus)),
            after: BalanceStats::from_gpu_loads(&self.gpu_loads(loads)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_blocks_and_ratios() {
        let loads = LoadMatrix::from_rows(vec![vec![4.0, 0.0, 1.0, 1.0]]).unwrap();
        let g = baseline_gpu_loads(&loads, 2);
        assert_eq!(g.row(0), &[4.0, 2.0]);
        let s = BalanceStats::from_gpu_loads(&g);
        assert_eq!(s.layers[0].max_load, 4.0);
        assert_eq!(s.layers[0].mean_load, 3.0);
        assert!((s.total.imbalance() - 4.0 / 3.0).abs() < 1e-12);
        assert!((s.total.balancedness() - 0.75).abs() < 1e-12);
    }

    #[test]
    fn zero_load_is_balanced() {
        let s = BalanceStats::from_gpu_loads(&Matrix::filled(1, 3, 0.0));
        assert_eq!(s.total.imbalance(), 1.0);
        assert_eq!(s.total.balancedness(), 1.0);
    }
}
