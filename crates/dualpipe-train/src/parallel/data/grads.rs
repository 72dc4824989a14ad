//! One model stage's gradients in the exchange: the exchange in the run's float type
//! ([`StageGrads`]), a copy's gradients flattened ([`Snapshot`]), the sum of a stage's
//! copies, and the parameters the exchange carries (all but the sharded experts).

use candle_core::{Tensor, WithDType};
use dualpipe_dp::{BucketExchange, DpError, ExchangeStats, GradFloat};
use dualpipe_nn::ModelStage;
use dualpipe_runtime::RankStages;

use crate::config::TrainConfig;
use crate::error::TrainError;

pub(super) enum StageGrads {
    F32(Box<dyn BucketExchange<f32> + Send>),
    F64(Box<dyn BucketExchange<f64> + Send>),
}

/// One copy's gradients, flattened, in the run's float type.
pub(super) enum Snapshot {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl StageGrads {
    pub(super) fn totals(&self) -> ExchangeStats {
        match self {
            StageGrads::F32(ex) => ex.totals(),
            StageGrads::F64(ex) => ex.totals(),
        }
    }

    pub(super) fn method(&self) -> &'static str {
        match self {
            StageGrads::F32(ex) => ex.method(),
            StageGrads::F64(ex) => ex.method(),
        }
    }

    pub(super) fn snapshot(&self, copy: &ModelStage) -> Result<Snapshot, TrainError> {
        Ok(match self {
            StageGrads::F32(_) => Snapshot::F32(copy_grads(copy)?),
            StageGrads::F64(_) => Snapshot::F64(copy_grads(copy)?),
        })
    }

    /// Begins `step` and starts every bucket from the sum of `copies` (in the order given).
    pub(super) fn start(&mut self, step: u64, copies: Vec<Snapshot>) -> Result<(), TrainError> {
        let mismatch = || TrainError::Execution("a copy's gradients of another type".into());
        match self {
            StageGrads::F32(ex) => {
                let copies = copies.into_iter().map(|c| match c {
                    Snapshot::F32(v) => Ok(v),
                    Snapshot::F64(_) => Err(mismatch()),
                });
                start(ex.as_mut(), step, &sum(copies)?)
            }
            StageGrads::F64(ex) => {
                let copies = copies.into_iter().map(|c| match c {
                    Snapshot::F64(v) => Ok(v),
                    Snapshot::F32(_) => Err(mismatch()),
                });
                start(ex.as_mut(), step, &sum(copies)?)
            }
        }
    }

    pub(super) fn progress(&mut self) -> Result<(), DpError> {
        match self {
            StageGrads::F32(ex) => ex.progress(),
            StageGrads::F64(ex) => ex.progress(),
        }
    }

    /// Waits for the started step and writes the result into every target.
    pub(super) fn finish(&mut self, targets: &mut [&mut ModelStage]) -> Result<(), TrainError> {
        match self {
            StageGrads::F32(ex) => {
                ex.finish()?;
                write_grads(targets, ex.as_ref())
            }
            StageGrads::F64(ex) => {
                ex.finish()?;
                write_grads(targets, ex.as_ref())
            }
        }
    }

    /// The whole step at once (`--no-overlap`): the first target's gradients (the copies
    /// already summed) in, the result into every target.
    pub(super) fn all_reduce(
        &mut self,
        step: u64,
        targets: &mut [&mut ModelStage],
    ) -> Result<(), TrainError> {
        let source = targets
            .first()
            .ok_or_else(|| TrainError::Execution("no copy to exchange".into()))?;
        match self {
            StageGrads::F32(ex) => {
                ex.all_reduce(step, &mut copy_grads::<f32>(source)?)?;
                write_grads(targets, ex.as_ref())
            }
            StageGrads::F64(ex) => {
                ex.all_reduce(step, &mut copy_grads::<f64>(source)?)?;
                write_grads(targets, ex.as_ref())
            }
        }
    }
}

/// The element-wise sum of `copies`, left to right (`(c_0 + c_1) + ...`, the order
/// `sum_stage_copies` adds DualPipe's copies in).
pub(super) fn sum<T: GradFloat>(
    copies: impl Iterator<Item = Result<Vec<T>, TrainError>>,
) -> Result<Vec<T>, TrainError> {
    let mut total: Option<Vec<T>> = None;
    for copy in copies {
        let copy = copy?;
        match &mut total {
            None => total = Some(copy),
            Some(t) if t.len() == copy.len() => {
                t.iter_mut().zip(&copy).for_each(|(a, &b)| *a = *a + b);
            }
            Some(t) => {
                return Err(TrainError::Execution(format!(
                    "a stage's copies hold {} and {} gradient values",
                    t.len(),
                    copy.len()
                )))
            }
        }
    }
    total.ok_or_else(|| TrainError::Execution("no copy to exchange".into()))
}

/// The held copies of model stage `model_stage`, lowest direction first.
pub(super) fn copies_of(
    stages: &mut [RankStages<ModelStage>],
    model_stage: usize,
) -> Vec<&mut ModelStage> {
    let mut copies: Vec<&mut ModelStage> = stages
        .iter_mut()
        .flat_map(RankStages::iter_mut)
        .map(|(_, s)| s)
        .filter(|s| s.model_stage() == model_stage)
        .collect();
    copies.sort_by_key(|s| s.dir());
    copies
}

pub(super) fn model_error(e: candle_core::Error) -> TrainError {
    TrainError::Execution(format!("gradient exchange: {e}"))
}

pub(super) fn lock_error(stage: usize) -> TrainError {
    TrainError::Execution(format!(
        "the gradient exchange of stage {stage} was poisoned by a panic"
    ))
}

/// `copy`'s parameters the exchange carries: all but the routed experts of an
/// expert-parallel MoE block (their gradients are summed among their holders only, see
/// [`ExpertGroup::exchange_gradients`](crate::parallel::experts::group::ExpertGroup::exchange_gradients)).
pub(super) fn exchanged(copy: &ModelStage) -> Vec<&dualpipe_nn::layers::Param> {
    let sharded = copy.sharded_params();
    copy.params()
        .into_iter()
        .zip(sharded)
        .filter_map(|(p, s)| (!s).then_some(p))
        .collect()
}

/// The sizes of the parameters [`exchanged`] will carry for `copy` once its MoE blocks
/// serve their placements: with expert parallelism (set up after the exchange is built) no
/// routed expert.
pub(super) fn exchanged_lens(config: &TrainConfig, copy: &ModelStage) -> Vec<usize> {
    let ep =
        config.model.moe.is_some_and(|m| m.expert_parallel) && config.parallelism.data_parallel > 1;
    copy.param_names()
        .iter()
        .zip(copy.params())
        .zip(copy.sharded_params())
        .filter(|((name, _), sharded)| !(*sharded || (ep && name.contains(".moe.experts."))))
        .map(|((_, p), _)| p.grad.elem_count())
        .collect()
}

/// [`exchanged`] mutably.
pub(super) fn exchanged_mut(copy: &mut ModelStage) -> Vec<&mut dualpipe_nn::layers::Param> {
    let sharded = copy.sharded_params();
    copy.params_mut()
        .into_iter()
        .zip(sharded)
        .filter_map(|(p, s)| (!s).then_some(p))
        .collect()
}

/// `copy`'s exchanged gradients ([`exchanged`]), flattened parameter after parameter.
pub(super) fn copy_grads<T: WithDType>(copy: &ModelStage) -> Result<Vec<T>, TrainError> {
    let mut out = Vec::new();
    for p in exchanged(copy) {
        out.extend(
            p.grad
                .flatten_all()
                .and_then(|g| g.to_vec1::<T>())
                .map_err(model_error)?,
        );
    }
    Ok(out)
}

/// Writes the exchanged gradients into every target copy.
pub(super) fn write_grads<T: WithDType + GradFloat>(
    targets: &mut [&mut ModelStage],
    ex: &dyn BucketExchange<T>,
) -> Result<(), TrainError> {
    for copy in targets {
        for (j, p) in exchanged_mut(copy).into_iter().enumerate() {
            p.grad = Tensor::from_slice(ex.param(j), p.grad.shape(), p.grad.device())
                .map_err(model_error)?;
        }
    }
    Ok(())
}

pub(super) fn start<T: GradFloat>(
    ex: &mut dyn BucketExchange<T>,
    step: u64,
    grads: &[T],
) -> Result<(), TrainError> {
    ex.begin_step(step)?;
    let mut at = 0;
    for bucket in 0..ex.layout().buckets() {
        let n = ex.layout().len(bucket);
        ex.start_bucket(bucket, &grads[at..at + n])?;
        at += n;
    }
    Ok(())
}
