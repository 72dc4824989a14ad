//! The routed experts sharded over an expert-parallel group: each worker stores (weights and
//! optimizer state) only the experts its [`ExpertPlacement`] gives it, so three things travel
//! over the group's link (an [`ExpertLink`]: in process or over MPI) instead of through the dense exchange:
//!
//! - [`exchange_gradients`]: an expert's gradient summed among the workers that hold it (in
//!   worker order) and divided by the group's size, the value the dense mean gave when the
//!   other workers held zeros;
//! - [`move_experts`]: a re-placement's transfers (the planner's move plan, round by round):
//!   the expert's weights and its optimizer state from a holder to the new holder, stamped
//!   with the new placement's version;
//! - [`gather_experts`]: every expert from its lowest holder, for the whole model's weights
//!   (validation, samples).

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use dualpipe_nn::gpt::moe::parallel::{ExchangeTag, ExpertLink, ExpertPlacement, Phase};
use dualpipe_nn::gpt::{expert_prefix, GptWeights, MoeLayer};
use dualpipe_nn::stage::to_f64_vec;
use dualpipe_nn::{ModelStage, Optimizer, OptimizerKind, ParamState};
use dualpipe_runtime::RankStages;
use dualpipe_schedule::Chunk;

use crate::error::TrainError;

pub use crate::model::EXPERT_TENSORS;

/// One expert transfer of a re-placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// The MoE block (model-wide index).
    pub layer: usize,
    /// The logical expert.
    pub expert: usize,
    /// The worker that sends (it holds the expert in the placement in force).
    pub from: usize,
    /// The worker that receives.
    pub to: usize,
}

/// One stored expert's gradient on this replica and the workers holding the expert.
struct HeldGradient {
    layer: usize,
    expert: usize,
    holders: Vec<usize>,
    /// Per tensor of the expert ([`EXPERT_TENSORS`]), flattened.
    grads: Vec<Vec<f64>>,
}

fn nn(e: dualpipe_nn::NnError) -> TrainError {
    TrainError::Execution(format!("expert shards: {e}"))
}

fn tensor_error(e: candle_core::Error) -> TrainError {
    TrainError::Execution(format!("expert shards: {e}"))
}

/// Every MoE block copy held, as (block, direction, layer), ascending.
fn moe_copies(stages: &mut [RankStages<ModelStage>]) -> Vec<(usize, usize, &mut MoeLayer)> {
    let mut out = Vec::new();
    for (_, stage) in stages.iter_mut().flat_map(RankStages::iter_mut) {
        let dir = stage.dir();
        if let Some(g) = stage.experts_mut() {
            out.extend(g.moe_layers_mut().into_iter().map(|(l, m)| (l, dir, m)));
        }
    }
    out.sort_by_key(|(l, dir, _)| (*l, *dir));
    out
}

/// The placement block copy `m` serves by.
fn placement_of(m: &MoeLayer) -> Result<ExpertPlacement, TrainError> {
    m.expert_parallel()
        .map(|p| p.placement().clone())
        .ok_or_else(|| {
            TrainError::Execution("expert shards: a block is not expert-parallel".into())
        })
}

/// Values `values` read back as a tensor shaped like `like`.
fn tensor_like(values: &[f64], like: &Tensor) -> Result<Tensor, TrainError> {
    Tensor::from_slice(values, like.shape(), &Device::Cpu)
        .and_then(|t| t.to_dtype(like.dtype()))
        .map_err(tensor_error)
}

/// Reads the next `n` values of `part` from `*at`.
fn take<'a>(
    part: &'a [f64],
    at: &mut usize,
    n: usize,
    from: usize,
) -> Result<&'a [f64], TrainError> {
    let got = part.get(*at..*at + n).ok_or_else(|| {
        TrainError::Execution(format!(
            "expert shards: worker {from} sent {} values, fewer than expected",
            part.len()
        ))
    })?;
    *at += n;
    Ok(got)
}

/// Replaces the gradient of every routed expert this replica stores by the sum over the
/// expert's holders, divided by `workers` (the group's size). `copies_summed`: the copies of
/// a block (DualPipe's two directions) already hold their sum; otherwise they are summed
/// here, lowest direction first. One all-to-all on `link` when some expert has several
/// replicas (stamped with the placement's version), none otherwise.
pub fn exchange_gradients(
    link: &mut dyn ExpertLink,
    step: usize,
    stages: &mut [RankStages<ModelStage>],
    copies_summed: bool,
    workers: usize,
) -> Result<(), TrainError> {
    let me = link.worker();
    let mut copies = moe_copies(stages);
    // Per (block, stored expert): the placement's holders and this replica's gradients.
    let mut local: Vec<HeldGradient> = Vec::new();
    let mut version = 0;
    // Whether some expert has several holders: decided from the placements, which every
    // worker of the group shares (a worker that stores no replicated expert still joins).
    let mut replicated = false;
    let mut i = 0;
    while i < copies.len() {
        let l = copies[i].0;
        let end = i + copies[i..].iter().take_while(|c| c.0 == l).count();
        let placement = placement_of(copies[i].2)?;
        version = version.max(placement.version);
        replicated |= placement.replicas.iter().any(|h| h.len() > 1);
        for j in copies[i].2.stored_experts() {
            let mut grads: Vec<Vec<f64>> = Vec::new();
            let take = if copies_summed { 1 } else { end - i };
            for (_, _, m) in &copies[i..i + take] {
                let params = m.expert_params(j).ok_or_else(|| {
                    TrainError::Execution(format!(
                        "expert shards: the copies of block {l} store different experts"
                    ))
                })?;
                for (k, p) in params.iter().enumerate() {
                    let g = to_f64_vec(&p.grad).map_err(nn)?;
                    match grads.get_mut(k) {
                        Some(acc) => acc.iter_mut().zip(&g).for_each(|(a, b)| *a += b),
                        None => grads.push(g),
                    }
                }
            }
            local.push(HeldGradient {
                layer: l,
                expert: j,
                holders: placement.replicas[j].clone(),
                grads,
            });
        }
        i = end;
    }
    let got = if replicated {
        let mut parts = vec![Vec::new(); workers];
        for h in &local {
            for &w in h.holders.iter().filter(|&&w| w != me) {
                h.grads.iter().for_each(|g| parts[w].extend_from_slice(g));
            }
        }
        let tag = ExchangeTag {
            chunk: Chunk::new(0, 1, step),
            phase: Phase::GradDispatch,
            version,
        };
        link.all_to_all(tag, parts).map_err(nn)?
    } else {
        vec![Vec::new(); workers]
    };
    let mut at = vec![0usize; workers];
    let mut sums: HashMap<(usize, usize), Vec<Vec<f64>>> = HashMap::new();
    for h in local {
        let mine = h.grads;
        let mut total: Vec<Vec<f64>> = mine.iter().map(|g| vec![0.0; g.len()]).collect();
        for &w in &h.holders {
            for (k, acc) in total.iter_mut().enumerate() {
                let part: &[f64] = if w == me {
                    &mine[k]
                } else {
                    take(&got[w], &mut at[w], acc.len(), w)?
                };
                acc.iter_mut().zip(part).for_each(|(a, b)| *a += b);
            }
        }
        for acc in &mut total {
            acc.iter_mut().for_each(|v| *v /= workers as f64);
        }
        sums.insert((h.layer, h.expert), total);
    }
    for (l, _, m) in copies.iter_mut() {
        for j in m.stored_experts() {
            let total = sums.get(&(*l, j)).ok_or_else(|| {
                TrainError::Execution(format!("expert shards: no gradient for expert {j}"))
            })?;
            for (p, g) in m.expert_params_mut(j).into_iter().flatten().zip(total) {
                p.grad = tensor_like(g, &p.grad)?;
            }
        }
    }
    Ok(())
}

/// Fills `weights` with every routed expert of the expert-parallel blocks this replica holds
/// a copy of, each from its lowest holder (a collective call of the group).
pub fn gather_experts(
    link: &mut dyn ExpertLink,
    step: usize,
    stages: &mut [RankStages<ModelStage>],
    weights: &mut GptWeights,
) -> Result<(), TrainError> {
    let me = link.worker();
    let workers = link.workers();
    let mut blocks: Vec<(usize, ExpertPlacement)> = Vec::new();
    let mut parts = vec![Vec::new(); workers];
    let mut version = 0;
    for (l, _, m) in moe_copies(stages) {
        if blocks.iter().any(|(b, _)| *b == l) {
            continue;
        }
        let placement = placement_of(m)?;
        version = version.max(placement.version);
        for (j, holders) in placement.replicas.iter().enumerate() {
            if holders.first() == Some(&me) {
                for (suffix, p) in EXPERT_TENSORS
                    .iter()
                    .zip(m.expert_params(j).into_iter().flatten())
                {
                    let name = format!("{}{suffix}", expert_prefix(l, j));
                    weights.set(&name, p.value.clone()).map_err(nn)?;
                    let v = to_f64_vec(&p.value).map_err(nn)?;
                    for (w, part) in parts.iter_mut().enumerate() {
                        if w != me {
                            part.extend_from_slice(&v);
                        }
                    }
                }
            }
        }
        blocks.push((l, placement));
    }
    let tag = ExchangeTag {
        chunk: Chunk::new(0, 2, step),
        phase: Phase::Combine,
        version,
    };
    let got = link.all_to_all(tag, parts).map_err(nn)?;
    let mut at = vec![0usize; workers];
    for (l, placement) in &blocks {
        for (j, holders) in placement.replicas.iter().enumerate() {
            let owner = holders[0];
            if owner == me {
                continue;
            }
            for suffix in EXPERT_TENSORS {
                let name = format!("{}{suffix}", expert_prefix(*l, j));
                let like = weights.get(&name).map_err(nn)?.clone();
                let values = take(&got[owner], &mut at[owner], like.elem_count(), owner)?;
                weights
                    .set(&name, tensor_like(values, &like)?)
                    .map_err(nn)?;
            }
        }
    }
    Ok(())
}

/// One parameter's optimizer state of `kind` from its tensors (in [`ParamState::tensors`]
/// order).
fn state_of(kind: OptimizerKind, mut tensors: Vec<Tensor>) -> Result<ParamState, TrainError> {
    let bad =
        || TrainError::Execution("expert shards: an optimizer state of the wrong size".into());
    Ok(match kind {
        OptimizerKind::Sgd { .. } => ParamState::Sgd {
            momentum: tensors.pop().ok_or_else(bad)?,
        },
        OptimizerKind::AdamW { .. } => {
            let v = tensors.pop().ok_or_else(bad)?;
            let m = tensors.pop().ok_or_else(bad)?;
            ParamState::AdamW { m, v }
        }
    })
}

/// Carries out a re-placement on this replica (every worker of the group calls it with the
/// same arguments): the `rounds` of transfers (each worker sends and receives at most one
/// expert per round, as the planner scheduled them), each an all-to-all on `link` stamped
/// with `new`'s version: the sender's weights of the expert, then its optimizer state
/// (per tensor), from its copy of the block; the receiver stores them in every copy of the
/// block and its optimizers. Then every copy serves `new` (per block) and frees the experts
/// it no longer holds, and each optimizer's state is re-indexed to its stage's parameters.
/// Returns the bytes the whole group sent (weights and state, in the model's float type).
pub fn move_experts(
    link: &mut dyn ExpertLink,
    step: usize,
    stages: &mut [RankStages<ModelStage>],
    optimizers: &mut [Vec<Optimizer>],
    new: &[(usize, ExpertPlacement)],
    rounds: &[Vec<Transfer>],
) -> Result<u64, TrainError> {
    let me = link.worker();
    let workers = link.workers();
    let version = new.iter().map(|(_, p)| p.version).max().unwrap_or(0);
    // Every copy's optimizer state by parameter name, before anything changes.
    let mut states: Vec<Vec<HashMap<String, ParamState>>> = Vec::new();
    for (rank, opts) in stages.iter().zip(optimizers.iter()) {
        states.push(
            rank.iter()
                .zip(opts)
                .map(|((_, s), o)| {
                    s.param_names()
                        .into_iter()
                        .zip(o.state().iter().cloned())
                        .collect()
                })
                .collect(),
        );
    }
    let kind = optimizers
        .iter()
        .flatten()
        .next()
        .map(Optimizer::kind)
        .unwrap_or(OptimizerKind::sgd());
    let per_param = ParamState::names(kind).len();
    let mut received: HashMap<String, ParamState> = HashMap::new();
    let mut bytes = 0u64;
    for (r, round) in rounds.iter().enumerate() {
        let mut parts = vec![Vec::new(); workers];
        for t in round.iter().filter(|t| t.from == me) {
            let (values, dtype_bytes) = expert_payload(stages, &states, t)?;
            bytes += (values.len() * dtype_bytes) as u64;
            parts[t.to].extend(values);
        }
        let tag = ExchangeTag {
            chunk: Chunk::new(1, r, step),
            phase: Phase::Dispatch,
            version,
        };
        let got = link.all_to_all(tag, parts).map_err(nn)?;
        let mut at = vec![0usize; workers];
        for t in round.iter().filter(|t| t.to == me) {
            let mut copies = moe_copies(stages);
            let template = copies
                .iter()
                .find(|(l, _, _)| *l == t.layer)
                .and_then(|(_, _, m)| m.stored_experts().first().and_then(|&k| m.expert_params(k)))
                .ok_or_else(|| {
                    TrainError::Execution(format!(
                        "expert shards: worker {me} holds no expert of block {} to shape \
                         expert {} by",
                        t.layer, t.expert
                    ))
                })?
                .into_iter()
                .map(|p| p.value.clone())
                .collect::<Vec<_>>();
            let mut values = Vec::new();
            for (suffix, like) in EXPERT_TENSORS.iter().zip(&template) {
                let n = like.elem_count();
                values.push(tensor_like(
                    take(&got[t.from], &mut at[t.from], n, t.from)?,
                    like,
                )?);
                let state = (0..per_param)
                    .map(|_| tensor_like(take(&got[t.from], &mut at[t.from], n, t.from)?, like))
                    .collect::<Result<Vec<_>, _>>()?;
                let name = format!("{}{suffix}", expert_prefix(t.layer, t.expert));
                received.insert(name, state_of(kind, state)?);
            }
            for (_, _, m) in copies.iter_mut().filter(|(l, _, _)| *l == t.layer) {
                m.store_expert(t.expert, values.clone()).map_err(nn)?;
            }
        }
    }
    // The group's total: every worker's sent bytes (integers, exact in f64).
    let tag = ExchangeTag {
        chunk: Chunk::new(1, rounds.len(), step),
        phase: Phase::Combine,
        version,
    };
    let sent = link
        .all_to_all(tag, vec![vec![bytes as f64]; workers])
        .map_err(nn)?;
    let total: f64 = sent.iter().flatten().sum();
    for (l, _, m) in moe_copies(stages) {
        m.set_placement(block_placement(new, l)?).map_err(nn)?;
    }
    for ((rank, opts), before) in stages.iter().zip(optimizers.iter_mut()).zip(&states) {
        for (((_, s), o), old) in rank.iter().zip(opts.iter_mut()).zip(before) {
            if o.steps() == 0 {
                continue;
            }
            let state = s
                .param_names()
                .iter()
                .map(|n| {
                    old.get(n)
                        .or_else(|| received.get(n))
                        .cloned()
                        .ok_or_else(|| {
                            TrainError::Execution(format!(
                                "expert shards: no optimizer state for {n} after the re-placement"
                            ))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            o.set_state(o.steps(), state).map_err(nn)?;
        }
    }
    Ok(total as u64)
}

/// What transfer `t`'s sender sends: per tensor of the expert, its values, then its
/// optimizer state's tensors (a re-placement follows an optimizer step, so there is one);
/// and the bytes per value in the model's float type.
fn expert_payload(
    stages: &[RankStages<ModelStage>],
    states: &[Vec<HashMap<String, ParamState>>],
    t: &Transfer,
) -> Result<(Vec<f64>, usize), TrainError> {
    for (rank, rank_states) in stages.iter().zip(states) {
        for ((_, s), state) in rank.iter().zip(rank_states) {
            let Some(g) = s.experts() else { continue };
            let Some((_, m)) = g.moe_layers().into_iter().find(|(l, _)| *l == t.layer) else {
                continue;
            };
            let params = m.expert_params(t.expert).ok_or_else(|| {
                TrainError::Execution(format!(
                    "expert shards: worker {} is to send expert {} of block {}, which it does \
                     not store",
                    t.from, t.expert, t.layer
                ))
            })?;
            let mut out = Vec::new();
            let mut dtype_bytes = 8;
            for (suffix, p) in EXPERT_TENSORS.iter().zip(params) {
                dtype_bytes = p.value.dtype().size_in_bytes();
                out.extend(to_f64_vec(&p.value).map_err(nn)?);
                let name = format!("{}{suffix}", expert_prefix(t.layer, t.expert));
                match state.get(&name) {
                    Some(st) => {
                        for (_, tensor) in st.tensors() {
                            out.extend(to_f64_vec(tensor).map_err(nn)?);
                        }
                    }
                    None => {
                        return Err(TrainError::Execution(format!(
                            "expert shards: no optimizer state for {name}"
                        )))
                    }
                }
            }
            return Ok((out, dtype_bytes));
        }
    }
    Err(TrainError::Execution(format!(
        "expert shards: no copy of block {} here",
        t.layer
    )))
}

/// The names of the routed experts' tensors that worker `worker` writes into a checkpoint
/// from `stage`: those of the experts of expert-parallel blocks whose lowest holder it is
/// (each expert is written once, by one holder).
pub fn owned_names(stage: &ModelStage, worker: usize) -> Vec<String> {
    let Some(g) = stage.experts() else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for (l, m) in g.moe_layers() {
        let Some(p) = m.expert_parallel() else {
            continue;
        };
        for j in m.stored_experts() {
            if p.placement().replicas[j].first() == Some(&worker) {
                names.extend(
                    EXPERT_TENSORS
                        .iter()
                        .map(|suffix| format!("{}{suffix}", expert_prefix(l, j))),
                );
            }
        }
    }
    names
}

/// Makes worker `worker`'s copies serve `placements` (per block) as a restore does: each
/// expert a placement gives the worker and it does not store is stored from `load` (a
/// tensor by name), then the copy takes the placement and frees the rest.
pub fn adopt(
    stages: &mut [RankStages<ModelStage>],
    worker: usize,
    placements: &[(usize, ExpertPlacement)],
    load: impl Fn(&str) -> Result<Tensor, TrainError>,
) -> Result<(), TrainError> {
    for (l, _, m) in moe_copies(stages) {
        let placement = block_placement(placements, l)?;
        let stored = m.stored_experts();
        for j in (0..m.experts()).filter(|&j| placement.serves(worker, j) && !stored.contains(&j)) {
            let values = EXPERT_TENSORS
                .iter()
                .map(|suffix| load(&format!("{}{suffix}", expert_prefix(l, j))))
                .collect::<Result<Vec<_>, _>>()?;
            m.store_expert(j, values).map_err(nn)?;
        }
        m.set_placement(placement).map_err(nn)?;
    }
    Ok(())
}

/// The sum of squares of every routed expert's gradient over the group (each expert counted
/// once, by its lowest holder, from its block's copy of direction 0, as the stages' norms
/// count), the same on every worker: the part of the global gradient norm the stages' own
/// sums leave out, for the blocks held here. One all-to-all on `link`.
pub fn expert_squares(
    link: &mut dyn ExpertLink,
    step: usize,
    stages: &mut [RankStages<ModelStage>],
) -> Result<f64, TrainError> {
    let me = link.worker();
    let mut mine = 0.0;
    let mut version = 0;
    let mut seen = Vec::new();
    for (l, dir, m) in moe_copies(stages) {
        if dir != 0 || seen.contains(&l) {
            continue;
        }
        seen.push(l);
        let placement = placement_of(m)?;
        version = version.max(placement.version);
        for j in m.stored_experts() {
            if placement.replicas[j].first() == Some(&me) {
                for p in m.expert_params(j).into_iter().flatten() {
                    mine += to_f64_vec(&p.grad)
                        .map_err(nn)?
                        .iter()
                        .map(|g| g * g)
                        .sum::<f64>();
                }
            }
        }
    }
    let tag = ExchangeTag {
        chunk: Chunk::new(0, 3, step),
        phase: Phase::Dispatch,
        version,
    };
    let got = link
        .all_to_all(tag, vec![vec![mine]; link.workers()])
        .map_err(nn)?;
    Ok(got.iter().flatten().sum())
}

/// Block `l`'s placement in `placements` (block, placement) pairs.
fn block_placement(
    placements: &[(usize, ExpertPlacement)],
    l: usize,
) -> Result<ExpertPlacement, TrainError> {
    placements
        .iter()
        .find(|(b, _)| *b == l)
        .map(|(_, p)| p.clone())
        .ok_or_else(|| TrainError::Execution(format!("expert shards: no placement for block {l}")))
}
