//! Helpers to run the GPT under a schedule: build every rank's stage copies, run one
//! sequential step (the single-thread oracle), read weights and gradients back by name.

use std::collections::HashMap;

use candle_core::Tensor;
use dualpipe_runtime::{try_build_ranks, ForwardInput, ForwardOutput, RankStages, Stage};
use dualpipe_schedule::{Chunk, Schedule};

use super::{GptStage, GptWeights, TokenBatch};
use crate::error::NnError;
use crate::model_stage::StagePosition;

/// Every rank's stage copies for `schedule`, each built from `weights` (the model's blocks
/// split evenly over the schedule's stages per pipeline).
pub fn build_stages(
    schedule: &Schedule,
    weights: &GptWeights,
) -> Result<Vec<RankStages<GptStage>>, NnError> {
    let stages = schedule.placement.stages();
    let per_dir = schedule.micro_batches_per_dir();
    try_build_ranks(&schedule.placement, |_rank, dir, stage| {
        GptStage::new(
            weights,
            stages,
            StagePosition {
                dir,
                model_stage: stage,
                micro_batches: schedule.micro_batches,
                micro_batches_per_dir: per_dir,
            },
        )
    })
}

/// One copy of every model stage (the lowest direction's), in stage order.
fn one_copy_each(ranks: &[RankStages<GptStage>]) -> Vec<&GptStage> {
    let mut best: HashMap<usize, &GptStage> = HashMap::new();
    for (_, s) in ranks.iter().flat_map(RankStages::iter) {
        let e = best.entry(s.model_stage()).or_insert(s);
        if s.dir() < e.dir() {
            *e = s;
        }
    }
    let mut v: Vec<_> = best.into_values().collect();
    v.sort_by_key(|s| s.model_stage());
    v
}

/// The gradients of the step by tensor name, read from one copy of each stage (call after
/// [`dualpipe_runtime::sum_stage_copies`], which makes the copies' sums agree).
pub fn gradients_by_name(ranks: &[RankStages<GptStage>]) -> HashMap<String, Tensor> {
    one_copy_each(ranks)
        .into_iter()
        .flat_map(|s| {
            s.param_names()
                .into_iter()
                .zip(s.params().into_iter().map(|p| p.grad.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The current parameters written into `weights` (one copy of each stage).
pub fn collect_weights(
    ranks: &[RankStages<GptStage>],
    weights: &mut GptWeights,
) -> Result<(), NnError> {
    one_copy_each(ranks)
        .into_iter()
        .try_for_each(|s| s.write_into(weights))
}

/// One step on a whole-model stage built with `micro_batches` (see [`GptStage::new`]):
/// every micro-batch's forward, input and weight backward in order, on this thread. Returns
/// the micro-batch losses; the gradients accumulate in the stage.
pub fn sequential_step(stage: &mut GptStage, batch: TokenBatch) -> Result<Vec<f64>, NnError> {
    let m = batch.len();
    stage.set_batch(batch);
    let mut losses = Vec::with_capacity(m);
    for mb in 0..m {
        let c = Chunk::new(0, 0, mb);
        match stage.forward(c, ForwardInput::MicroBatch { global_mb: mb })? {
            ForwardOutput::Loss(l) => losses.push(l),
            ForwardOutput::Activation(_) => {
                return Err(NnError::Stage(
                    "a whole-model stage must return the loss".into(),
                ))
            }
        }
        stage.backward_input(c, None)?;
        stage.backward_weight(c)?;
    }
    Ok(losses)
}
