//! The trainer's whole-model operations across processes: the global gradient norm (for
//! clipping) and the model's weights on every process (for validation and saving).
//!
//! Each model stage is counted once, by its copy of direction 0 (DualPipe keeps a second,
//! identical after the copies' gradients are summed). The parts travel with
//! [`Driver::all_gather`], so a local run and a run of one process per rank compute the same
//! numbers in the same order.

use dualpipe_nn::distributed::{tensor_from_wire, tensor_to_wire};
use dualpipe_nn::gpt::{expert_prefix, tensor_names, GptWeights};
use dualpipe_nn::stage::to_f64_vec;
use dualpipe_nn::ModelStage;
use dualpipe_runtime::transport::wire::WireData;
use dualpipe_runtime::{ExecOptions, RankStages};

use crate::error::TrainError;
use crate::model::EXPERT_TENSORS;
use crate::step::driver::{Driver, Round};

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

/// Every process's `mine` (one array of `f64` each), in process order: one
/// [`Driver::all_gather`] round; `what` names the figures in an error.
pub(crate) fn gather_f64s<D: Driver>(
    driver: &mut D,
    step: usize,
    round: Round,
    mine: &[f64],
    options: &ExecOptions,
    what: &str,
) -> Result<Vec<Vec<f64>>, TrainError> {
    let parts = driver.all_gather(step, round, vec![WireData::from_f64s(mine)], options)?;
    parts
        .iter()
        .flatten()
        .map(|part| {
            part.to_f64s()
                .map_err(|e| TrainError::Execution(format!("gathering {what}: {e}")))
        })
        .collect()
}

/// The L2 norm of the step's whole gradient, the same on every process: each stage's sum of
/// squares (in f64, parameter by parameter) is gathered, and the sums are added in stage
/// order, then the processes' `sharded_squares` (in process order): each one's sum of squares
/// of the parameters its stages hold only a share of (the routed experts of its
/// expert-parallel blocks, which the stages' sums leave out:
/// [`crate::parallel::experts::shards::expert_squares`]; 0 otherwise).
pub fn gradient_norm<D: Driver>(
    driver: &mut D,
    stages: &[RankStages<ModelStage>],
    model_stages: usize,
    step: usize,
    options: &ExecOptions,
    sharded_squares: f64,
) -> Result<f64, TrainError> {
    let mut mine = vec![sharded_squares];
    for stage in counted(stages) {
        let mut sum = 0.0;
        for (p, sharded) in stage.params().into_iter().zip(stage.sharded_params()) {
            if !sharded {
                sum += to_f64_vec(&p.grad)?.iter().map(|g| g * g).sum::<f64>();
            }
        }
        mine.extend([stage.model_stage() as f64, sum]);
    }
    let parts = gather_f64s(
        driver,
        step,
        Round::GradNorm,
        &mine,
        options,
        "the gradient norm",
    )?;
    let mut per_stage = vec![None; model_stages];
    let mut sharded = 0.0;
    for values in &parts {
        let (first, pairs) = values
            .split_first()
            .ok_or_else(|| wire_error("an empty norm message"))?;
        sharded += first;
        for pair in pairs.chunks_exact(2) {
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
    Ok((total + sharded).sqrt())
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
/// stages it counts and, per MoE block of those stages, its selection bias and, with
/// `sharded` experts (expert parallelism), every routed expert as `template` holds it (the
/// expert group's gather filled them in first: [`crate::parallel::experts::shards::gather_experts`]);
/// `template` gives the names and the architecture.
pub fn gather_weights<D: Driver>(
    driver: &mut D,
    stages: &[RankStages<ModelStage>],
    template: &GptWeights,
    sharded: bool,
    step: usize,
    options: &ExecOptions,
) -> Result<GptWeights, TrainError> {
    let experts = template.config().moe.map_or(0, |m| m.experts);
    let mut mine = Vec::new();
    for stage in counted(stages) {
        let mask = stage.sharded_params();
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
        // A block's header has three values: the block, 1 if its experts follow, and the
        // tensors that follow (its bias first).
        if let Some(g) = stage.experts() {
            for (l, m) in g.moe_layers() {
                let count = 1 + if sharded {
                    experts * EXPERT_TENSORS.len()
                } else {
                    0
                };
                mine.push(WireData::from_f64s(&[
                    l as f64,
                    f64::from(u8::from(sharded)),
                    count as f64,
                ]));
                mine.push(WireData::from_f64s(m.selection_bias()));
                for j in (0..experts).filter(|_| sharded) {
                    for suffix in EXPERT_TENSORS {
                        let name = format!("{}{suffix}", expert_prefix(l, j));
                        mine.push(tensor_to_wire(template.get(&name)?).map_err(wire_error)?);
                    }
                }
            }
        }
    }
    let parts = driver.all_gather(step, Round::Weights, mine, options)?;
    let mut by_stage: Vec<(usize, Vec<WireData>)> = Vec::new();
    let mut blocks: Vec<(String, WireData)> = Vec::new();
    for part in parts {
        let mut items = part.into_iter();
        while let Some(header) = items.next() {
            let header = header.to_f64s().map_err(wire_error)?;
            match header[..] {
                [stage, count] => {
                    let tensors: Vec<WireData> = items.by_ref().take(count as usize).collect();
                    by_stage.push((stage as usize, tensors));
                }
                [l, with_experts, count] => {
                    let l = l as usize;
                    let mut names = vec![format!("blocks.{l}.moe.router.selection_bias")];
                    if with_experts == 1.0 {
                        for j in 0..experts {
                            names.extend(
                                EXPERT_TENSORS
                                    .iter()
                                    .map(|suffix| format!("{}{suffix}", expert_prefix(l, j))),
                            );
                        }
                    }
                    let tensors: Vec<WireData> = items.by_ref().take(count as usize).collect();
                    if tensors.len() != names.len() {
                        return Err(wire_error(format!(
                            "block {l}: {} tensors arrived for {}",
                            tensors.len(),
                            names.len()
                        )));
                    }
                    blocks.extend(names.into_iter().zip(tensors));
                }
                _ => return Err(wire_error("a malformed stage header")),
            }
        }
    }
    by_stage.sort_by_key(|(s, _)| *s);
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
    for (name, data) in blocks {
        let tensor = if name.ends_with(".selection_bias") {
            let bias = data.to_f64s().map_err(wire_error)?;
            candle_core::Tensor::new(bias, &candle_core::Device::Cpu).map_err(wire_error)?
        } else {
            tensor_from_wire(data).map_err(wire_error)?
        };
        weights.set(&name, tensor)?;
    }
    Ok(weights)
}
