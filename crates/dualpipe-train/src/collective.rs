//! The trainer's whole-model operations across processes: the global gradient norm (for
//! clipping) and the model's weights on every process (for validation and saving).
//!
//! Each model stage is counted once, by its copy of direction 0 (DualPipe keeps a second,
//! identical after the copies' gradients are summed). The parts travel with
//! [`Driver::all_gather`], so a local run and a run of one process per rank compute the same
//! numbers in the same order.

use dualpipe_nn::distributed::{tensor_from_wire, tensor_to_wire};
use dualpipe_nn::gpt::{tensor_names, GptWeights};
use dualpipe_nn::stage::to_f64_vec;
use dualpipe_nn::ModelStage;
use dualpipe_runtime::transport::wire::WireData;
use dualpipe_runtime::{ExecOptions, RankStages};

use crate::driver::Driver;
use crate::error::TrainError;

/// The all-gather round of the gradient norm within a step.
const NORM_ROUND: usize = 0;
/// The all-gather round of the weights within a step.
const WEIGHTS_ROUND: usize = 1;

/// The copies that count for their model stage (direction 0), in stage order.
fn counted(stages: &[RankStages<ModelStage>]) -> Vec<&ModelStage> {
    let mut copies: Vec<&ModelStage> = stages
        .iter()
        .flat_map(RankStages::iter)
        .map(|(_, s)| s)
        .filter(|s| s.dir() == 0)
        .collect();
    copies.sort_by_key(|s| s.model_stage());
    copies
}

fn wire_error(e: impl std::fmt::Display) -> TrainError {
    TrainError::Execution(format!("gathering across ranks: {e}"))
}

/// The L2 norm of the step's whole gradient, the same on every process: each stage's sum of
/// squares (in f64, parameter by parameter) is gathered, and the sums are added in stage
/// order, then `sharded_squares`: the sum of squares of the parameters the stages hold only
/// a share of (the routed experts of expert-parallel blocks, which the stages' sums leave out:
/// [`crate::expert_shards::expert_squares`]; 0 otherwise).
pub fn gradient_norm<D: Driver>(
    driver: &mut D,
    stages: &[RankStages<ModelStage>],
    model_stages: usize,
    step: usize,
    options: &ExecOptions,
    sharded_squares: f64,
) -> Result<f64, TrainError> {
    let mut mine = Vec::new();
    for stage in counted(stages) {
        let mut sum = 0.0;
        for (p, sharded) in stage.params().into_iter().zip(stage.sharded_params()) {
            if !sharded {
                sum += to_f64_vec(&p.grad)?.iter().map(|g| g * g).sum::<f64>();
            }
        }
        mine.extend([stage.model_stage() as f64, sum]);
    }
    let parts = driver.all_gather(step, NORM_ROUND, vec![WireData::from_f64s(&mine)], options)?;
    let mut per_stage = vec![None; model_stages];
    for part in parts.iter().flatten() {
        let values = part.to_f64s().map_err(wire_error)?;
        for pair in values.chunks_exact(2) {
            let slot = per_stage
                .get_mut(pair[0] as usize)
                .ok_or_else(|| wire_error(format!("a norm for stage {}", pair[0])))?;
            *slot = Some(pair[1]);
        }
    }
    let mut total = 0.0;
    for (s, sum) in per_stage.into_iter().enumerate() {
        total += sum.ok_or_else(|| wire_error(format!("no process sent stage {s}'s norm")))?;
    }
    Ok((total + sharded_squares).sqrt())
}

/// Multiplies every gradient of every copy by `scale`.
pub fn scale_gradients(
    stages: &mut [RankStages<ModelStage>],
    scale: f64,
) -> Result<(), TrainError> {
    for (_, stage) in stages.iter_mut().flat_map(RankStages::iter_mut) {
        for p in stage.params_mut() {
            p.grad = p
                .grad
                .affine(scale, 0.0)
                .map_err(|e| TrainError::Execution(format!("clipping gradients: {e}")))?;
        }
    }
    Ok(())
}

/// The GPT's current weights on every process: each process sends the parameters of the
/// stages it counts; `template` gives the names and the architecture. The routed experts of
/// expert-parallel blocks stay as in `template` (the expert group gathers them:
/// [`crate::expert_shards::gather_experts`]).
pub fn gather_weights<D: Driver>(
    driver: &mut D,
    stages: &[RankStages<ModelStage>],
    template: &GptWeights,
    step: usize,
    options: &ExecOptions,
) -> Result<GptWeights, TrainError> {
    let mut mine = Vec::new();
    // The routed experts of expert-parallel blocks are sharded over the group: they do not
    // travel here (the group's gather fills them in; MoE runs hold every rank here).
    let mut sharded = false;
    for stage in counted(stages) {
        let mask = stage.sharded_params();
        sharded |= mask.contains(&true);
        let params: Vec<_> = stage
            .params()
            .into_iter()
            .zip(mask)
            .filter_map(|(p, s)| (!s).then_some(p))
            .collect();
        mine.push(WireData::from_f64s(&[
            stage.model_stage() as f64,
            params.len() as f64,
        ]));
        for p in params {
            mine.push(tensor_to_wire(&p.value).map_err(wire_error)?);
        }
    }
    let parts = driver.all_gather(step, WEIGHTS_ROUND, mine, options)?;
    let mut by_stage: Vec<(usize, Vec<WireData>)> = Vec::new();
    for part in parts {
        let mut items = part.into_iter();
        while let Some(header) = items.next() {
            let header = header.to_f64s().map_err(wire_error)?;
            let [stage, count] = header[..] else {
                return Err(wire_error("a malformed stage header"));
            };
            let tensors: Vec<WireData> = items.by_ref().take(count as usize).collect();
            by_stage.push((stage as usize, tensors));
        }
    }
    by_stage.sort_by_key(|(s, _)| *s);
    // The parameters travel; the MoE selection biases (buffers) are written below from the
    // stages held here (MoE runs hold every rank in one process).
    let names: Vec<_> = tensor_names(template.config())
        .into_iter()
        .filter(|(n, _)| {
            !(n.ends_with(".selection_bias") || (sharded && n.contains(".moe.experts.")))
        })
        .collect();
    let tensors: Vec<WireData> = by_stage.into_iter().flat_map(|(_, t)| t).collect();
    if tensors.len() != names.len() {
        return Err(wire_error(format!(
            "{} tensors arrived for a model of {}",
            tensors.len(),
            names.len()
        )));
    }
    let mut weights = template.clone();
    for ((name, _), data) in names.iter().zip(tensors) {
        weights.set(name, tensor_from_wire(data).map_err(wire_error)?)?;
    }
    for stage in counted(stages) {
        if let ModelStage::Gpt(g) = stage {
            for (l, m) in g.moe_layers() {
                let bias = candle_core::Tensor::new(m.selection_bias(), &candle_core::Device::Cpu)
                    .map_err(wire_error)?;
                weights.set(&format!("blocks.{l}.moe.router.selection_bias"), bias)?;
            }
        }
    }
    Ok(weights)
}
