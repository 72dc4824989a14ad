//! MoE training over a data-parallel group (`--data-parallel D`), one replica's part:
//!
//! - the group's router counts summed over the replicas every step, so every replica takes
//!   the same selection-bias step (and with [`MoeSettings::expert_parallel`] the per-worker
//!   load);
//! - with expert parallelism, the group's all-to-all ends of every MoE block copy
//!   ([`ExpertLinks`]) and the [`ExpertPlacement`] each block serves by: `E / D` logical
//!   experts per worker at first (plus [`MoeSettings::redundant_experts`] slots per block);
//! - EPLB in training ([`crate::parallel::experts::eplb`]).
//!
//! With expert parallelism a worker stores (weights and optimizer state) only the experts its
//! placement gives it; their gradients, re-placements and the whole model's weights travel
//! over the group's counts link ([`crate::parallel::experts::shards`]). See `docs/moe.md`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dualpipe_nn::gpt::moe::parallel::{
    ChannelExpertLink, ExchangeTag, ExpertLink, ExpertPlacement, LinkModel, Phase, WallClock,
};
use dualpipe_nn::gpt::moe::ExpertParallel;
use dualpipe_nn::gpt::GptWeights;
use dualpipe_nn::{ModelStage, Optimizer};
use dualpipe_runtime::RankStages;
use dualpipe_schedule::Chunk;

use crate::checkpoint::{Checkpoint, HostTensor};
use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::parallel::experts::eplb::ExpertRebalancer;
use crate::parallel::experts::shards;
use crate::parallel::experts::MoeSettings;

/// One replica's ends of the all-to-alls of every MoE block copy, keyed by (model-wide
/// block, direction), plus the group's end for the step's counts: in process
/// ([`local_links`]) or over MPI ([`experts::mpi`](crate::parallel::experts), feature `mpi`).
#[derive(Debug)]
pub struct ExpertLinks {
    /// Per (block, direction) copy: this replica's end of the copy's group.
    pub blocks: BTreeMap<(usize, usize), Box<dyn ExpertLink>>,
    /// The group's end for the router counts.
    pub counts: Box<dyn ExpertLink>,
}

/// Builds the in-process links of `replicas` replicas for the MoE blocks `blocks` in
/// `directions` directions, the blocks' links emulating `link` (the counts' link never);
/// entry `d` is replica `d`'s.
pub fn local_links(
    replicas: usize,
    blocks: &[usize],
    directions: usize,
    timeout: Duration,
    link: LinkModel,
) -> Vec<ExpertLinks> {
    let clock = Arc::new(WallClock::new());
    let mut per: Vec<ExpertLinks> = ChannelExpertLink::group(replicas, timeout)
        .into_iter()
        .map(|counts| ExpertLinks {
            blocks: BTreeMap::new(),
            counts: Box::new(counts),
        })
        .collect();
    for &l in blocks {
        for dir in 0..directions {
            for (d, link) in ChannelExpertLink::emulated(replicas, timeout, link, clock.clone())
                .into_iter()
                .enumerate()
            {
                per[d].blocks.insert((l, dir), Box::new(link));
            }
        }
    }
    per
}

/// The local links of `config`'s replicas (entry `d`: replica `d`'s), or none for a dense
/// model or a single replica.
pub fn links_for(config: &TrainConfig, replicas: usize) -> Vec<ExpertLinks> {
    let Some(moe) = config.gpt().moe.filter(|_| replicas > 1) else {
        return Vec::new();
    };
    let layers = config
        .model
        .layers_per_stage
        .saturating_mul(config.model_stages());
    let blocks: Vec<usize> = (0..layers).filter(|&l| moe.is_moe_block(l)).collect();
    let timeout = Duration::from_secs_f64(config.transport.recv_timeout);
    let link = config.model.moe.map_or(LinkModel::NONE, |s| s.link());
    local_links(replicas, &blocks, 2, timeout, link)
}

/// The initial placement of `experts` logical experts with `redundant` extra slots over
/// `workers`: slot `p` holds expert `p mod E`, slots in runs of `(E + R) / D` per worker.
pub fn initial_placement(experts: usize, redundant: usize, workers: usize) -> ExpertPlacement {
    if redundant == 0 {
        return ExpertPlacement::contiguous(experts, workers);
    }
    let slots = experts + redundant;
    let row: Vec<usize> = (0..slots).map(|p| p % experts).collect();
    placement_of_slots(&row, workers, 0)
}

/// The placement of one block's slots (`phy2log`: the logical expert of each physical slot,
/// `slots / workers` consecutive slots per worker), at `version`.
pub fn placement_of_slots(phy2log: &[usize], workers: usize, version: u64) -> ExpertPlacement {
    let experts = phy2log.iter().copied().max().map_or(0, |m| m + 1);
    let per = (phy2log.len() / workers.max(1)).max(1);
    let mut replicas = vec![Vec::new(); experts];
    for (p, &j) in phy2log.iter().enumerate() {
        let w = (p / per).min(workers.saturating_sub(1));
        if !replicas[j].contains(&w) {
            replicas[j].push(w);
        }
    }
    replicas.iter_mut().for_each(|r| r.sort_unstable());
    ExpertPlacement {
        version,
        workers,
        replicas,
    }
}

/// The name of MoE block `l`'s placement tensor `what` in a checkpoint.
fn placement_name(l: usize, what: &str) -> String {
    format!("blocks.{l}.moe.placement.{what}")
}

/// One replica's part in its group's MoE training (see the [module](self) documentation).
#[derive(Debug)]
pub struct ExpertGroup {
    replica: usize,
    replicas: usize,
    settings: MoeSettings,
    counts: Box<dyn ExpertLink>,
    /// With expert parallelism: the rebalancer (placements, EMA, moves).
    rebalancer: Option<ExpertRebalancer>,
}

/// What the group's step tells the trainer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupStep {
    /// Per MoE block: tokens per expert over every replica.
    pub totals: Vec<(usize, Vec<u64>)>,
    /// With expert parallelism, per MoE block: rows each worker's experts computed.
    pub worker_rows: Option<Vec<(usize, Vec<u64>)>>,
    /// Whether EPLB re-placed the experts after this step.
    pub rebalanced: bool,
    /// Expert replicas that changed worker in that rebalance.
    pub moved: usize,
}

fn exchange_error(e: dualpipe_nn::NnError) -> TrainError {
    TrainError::Execution(format!("MoE counts: {e}"))
}

impl ExpertGroup {
    /// Replica `replica`'s part, installing the links and the initial placements in its
    /// `stages` (with expert parallelism).
    pub fn new(
        config: &TrainConfig,
        replica: usize,
        links: ExpertLinks,
        stages: &mut [RankStages<ModelStage>],
    ) -> Result<Self, TrainError> {
        let settings = config.model.moe.ok_or_else(|| {
            TrainError::Config("expert groups need the mixture of experts".into())
        })?;
        let replicas = config.parallelism.data_parallel.max(1);
        let mut rebalancer = None;
        if settings.expert_parallel {
            let placement =
                initial_placement(settings.experts, settings.redundant_experts, replicas);
            let mut blocks = links.blocks;
            let mut layers = Vec::new();
            for (_, stage) in stages.iter_mut().flat_map(RankStages::iter_mut) {
                let dir = stage.dir();
                if let Some(g) = stage.experts_mut() {
                    for (l, m) in g.moe_layers_mut() {
                        let link = blocks.remove(&(l, dir)).ok_or_else(|| {
                            TrainError::Execution(format!("no expert link for block {l}"))
                        })?;
                        m.set_expert_parallel(Some(
                            ExpertParallel::new(link, placement.clone())?
                                .with_overlap(settings.overlap),
                        ))?;
                        layers.push(l);
                    }
                }
            }
            layers.sort_unstable();
            layers.dedup();
            rebalancer = Some(ExpertRebalancer::new(
                &settings, replicas, &layers, &placement,
            ));
        }
        Ok(ExpertGroup {
            replica,
            replicas,
            settings,
            counts: links.counts,
            rebalancer,
        })
    }

    /// `mine` (per block, equal lengths everywhere) summed over the group in replica order.
    fn sum(
        &mut self,
        step: usize,
        phase: Phase,
        mine: &[(usize, Vec<u64>)],
    ) -> Result<Vec<(usize, Vec<u64>)>, TrainError> {
        let flat: Vec<f64> = mine
            .iter()
            .flat_map(|(_, c)| c.iter().map(|&v| v as f64))
            .collect();
        let tag = ExchangeTag {
            chunk: Chunk::new(0, 0, step),
            phase,
            version: 0,
        };
        let got = self
            .counts
            .all_to_all(tag, vec![flat.clone(); self.replicas])
            .map_err(exchange_error)?;
        let mut out: Vec<(usize, Vec<u64>)> =
            mine.iter().map(|(l, c)| (*l, vec![0; c.len()])).collect();
        for part in &got {
            if part.len() != flat.len() {
                return Err(TrainError::Execution(format!(
                    "MoE counts: a replica sent {} counts, this one has {}",
                    part.len(),
                    flat.len()
                )));
            }
            let mut it = part.iter();
            for (_, c) in &mut out {
                for v in c.iter_mut() {
                    *v += it.next().map_or(0, |&x| x as u64);
                }
            }
        }
        Ok(out)
    }

    /// The step's group figures from this replica's `local` counts (per block, over its
    /// copies) and `served` rows (per block, over its copies); with EPLB due, re-places
    /// every copy in `stages` (the same new placement on every replica), moving the experts'
    /// weights and the state of `optimizers` (`optimizers[i][k]`: the `k`-th copy of
    /// `stages[i]`'s) where the plan says.
    pub fn step(
        &mut self,
        step: usize,
        local: &[(usize, Vec<u64>)],
        served: &[(usize, u64)],
        stages: &mut [RankStages<ModelStage>],
        optimizers: &mut [Vec<Optimizer>],
    ) -> Result<GroupStep, TrainError> {
        let totals = self.sum(step, Phase::Dispatch, local)?;
        let mut out = GroupStep {
            totals,
            ..GroupStep::default()
        };
        if self.settings.expert_parallel {
            let mine: Vec<(usize, Vec<u64>)> = served
                .iter()
                .map(|(l, n)| {
                    let mut v = vec![0; self.replicas];
                    v[self.replica] = *n;
                    (*l, v)
                })
                .collect();
            out.worker_rows = Some(self.sum(step, Phase::Combine, &mine)?);
        }
        if let Some(r) = &mut self.rebalancer {
            if let Some(replan) = r.observe(step, &out.totals)? {
                let bytes = shards::move_experts(
                    self.counts.as_mut(),
                    step,
                    stages,
                    optimizers,
                    &replan.placements,
                    &replan.rounds,
                )?;
                r.add_bytes_moved(bytes);
                out.rebalanced = true;
                out.moved = replan.moved;
            }
        }
        Ok(out)
    }

    /// With expert parallelism: sums each stored expert's gradient among its holders (see
    /// [`shards::exchange_gradients`]); `copies_summed`: DualPipe's copies of a
    /// block already hold their sum. Nothing to do otherwise (the dense exchange carries
    /// the experts).
    pub fn exchange_gradients(
        &mut self,
        step: usize,
        stages: &mut [RankStages<ModelStage>],
        copies_summed: bool,
    ) -> Result<(), TrainError> {
        if !self.settings.expert_parallel {
            return Ok(());
        }
        shards::exchange_gradients(
            self.counts.as_mut(),
            step,
            stages,
            copies_summed,
            self.replicas,
        )
    }

    /// With expert parallelism: the sum of squares of the routed experts' gradients over the
    /// group (see [`shards::expert_squares`]); 0 otherwise.
    pub fn expert_squares(
        &mut self,
        step: usize,
        stages: &mut [RankStages<ModelStage>],
    ) -> Result<f64, TrainError> {
        if !self.settings.expert_parallel {
            return Ok(0.0);
        }
        shards::expert_squares(self.counts.as_mut(), step, stages)
    }

    /// With expert parallelism: fills `weights` with the experts other workers hold (a
    /// collective call of the group, see [`shards::gather_experts`]).
    pub fn gather_experts(
        &mut self,
        step: usize,
        stages: &mut [RankStages<ModelStage>],
        weights: &mut GptWeights,
    ) -> Result<(), TrainError> {
        if !self.settings.expert_parallel {
            return Ok(());
        }
        shards::gather_experts(self.counts.as_mut(), step, stages, weights)
    }

    /// The rebalancer's running figures: rebalances, expert replicas moved, the replicas
    /// planning from scratch would have moved.
    pub fn rebalance_totals(&self) -> (usize, usize, u64) {
        self.rebalancer
            .as_ref()
            .map_or((0, 0, 0), ExpertRebalancer::totals)
    }

    /// With expert parallelism: the tensors a checkpoint keeps of the group's state, per MoE
    /// block `l`: `blocks.{l}.moe.placement.slots` (the logical expert of each slot),
    /// `.version` (the step it took effect) and `.ema` (the moving average of the counts,
    /// once there is one). The same on every replica (replica 0 writes them).
    pub fn checkpoint_tensors(&self, stages: &[RankStages<ModelStage>]) -> Vec<HostTensor> {
        let Some(r) = &self.rebalancer else {
            return Vec::new();
        };
        let versions: BTreeMap<usize, u64> = stages
            .iter()
            .flat_map(RankStages::iter)
            .filter_map(|(_, s)| s.experts())
            .flat_map(|g| g.moe_layers())
            .filter_map(|(l, m)| m.expert_parallel().map(|p| (l, p.placement().version)))
            .collect();
        let mut out = Vec::new();
        for (i, &l) in r.layers().iter().enumerate() {
            let slots: Vec<f64> = r.phy2log()[i].iter().map(|&j| j as f64).collect();
            out.push(HostTensor::from_f64s(placement_name(l, "slots"), &slots));
            let version = versions.get(&l).copied().unwrap_or(0) as f64;
            out.push(HostTensor::from_f64s(
                placement_name(l, "version"),
                &[version],
            ));
            if let Some(ema) = r.ema() {
                out.push(HostTensor::from_f64s(placement_name(l, "ema"), &ema[i]));
            }
        }
        out
    }

    /// With expert parallelism, from checkpoint `ckpt` of the same group shape (replicas,
    /// experts, redundant slots, expert parallelism): the placement in force and the moving
    /// average, the experts that placement gives this worker stored from the checkpoint
    /// (values of type `dtype`; the caller then restores every stored tensor by name). A
    /// checkpoint of another shape keeps the initial placement.
    pub fn restore(
        &mut self,
        ckpt: &Checkpoint,
        stages: &mut [RankStages<ModelStage>],
        dtype: candle_core::DType,
    ) -> Result<(), TrainError> {
        let Some(r) = &mut self.rebalancer else {
            return Ok(());
        };
        let saved = &ckpt.state.config;
        let same_group = saved.parallelism.data_parallel == self.replicas
            && saved.model.moe.is_some_and(|m| {
                m.expert_parallel
                    && m.experts == self.settings.experts
                    && m.redundant_experts == self.settings.redundant_experts
            });
        if !same_group {
            return Ok(());
        }
        let values = |l: usize, what: &str| -> Result<Vec<f64>, TrainError> {
            Ok(ckpt.tensor(&placement_name(l, what))?.to_f64s())
        };
        let mut rows = Vec::new();
        let mut emas = Vec::new();
        let mut placements = Vec::new();
        for &l in r.layers() {
            let row: Vec<usize> = values(l, "slots")?.iter().map(|&j| j as usize).collect();
            let version = values(l, "version")?.first().copied().unwrap_or(0.0) as u64;
            placements.push((l, placement_of_slots(&row, self.replicas, version)));
            rows.push(row);
            if ckpt.tensors.contains_key(&placement_name(l, "ema")) {
                emas.push(values(l, "ema")?);
            }
        }
        let ema = (!emas.is_empty()).then_some(emas);
        r.resume(rows, ema)?;
        shards::adopt(stages, self.replica, &placements, |name| {
            Ok(ckpt.tensor(name)?.to_tensor(dtype)?)
        })
    }

    /// Bytes of expert weights and optimizer state this replica sent in re-placements.
    pub fn bytes_moved(&self) -> u64 {
        self.rebalancer
            .as_ref()
            .map_or(0, ExpertRebalancer::bytes_moved)
    }
}
