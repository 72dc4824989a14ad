//! The search: schedule kind x micro-batch count, each with a min-max layer partition and a
//! bottleneck placement refined in turns, scored by the simulator on the topology.
//!
//! For one (kind, micro-batches) candidate: ranks start on the devices in topology order;
//! then, up to [`ROUNDS`] times, the layers are partitioned for the devices the ranks sit on
//! ([`min_max`]), the ranks are re-placed for that partition ([`assign`]), and the result is
//! simulated; the best simulated step is kept. Placements never split what the schedule puts
//! on one rank: DualPipe's stage and its mirror (and DualPipeV's two arms) move together.

use dualpipe_schedule::{build, Op, Schedule, ScheduleKind, StagePlacement};
use dualpipe_sim::topology::{DeviceSlot, Topology};
use dualpipe_sim::{
    metrics, simulate, ChunkBytes, CommCost, CostModel, Recompute, StageCost, Timeline,
};
use serde::{Deserialize, Serialize};

use crate::assign::{assign, MAX_SIDE};
use crate::error::PlanError;
use crate::memory::{rank_activation_bytes, LiveChunks};
use crate::partition::{min_max, Partition, StageSlot};
use crate::previous::PreviousLayers;
use crate::profile::Profile;

/// Partition and placement turns per candidate.
pub const ROUNDS: usize = 4;

/// The most micro-batch counts or schedule kinds one search takes.
pub const MAX_CANDIDATES: usize = 64;

/// What to search.
#[derive(Clone, Debug, Default)]
pub struct PlanOptions {
    /// Schedule kinds to try; empty means every kind but interleaved.
    pub kinds: Vec<ScheduleKind>,
    /// Micro-batch counts to try; empty means `ranks`, `2 x ranks` and `4 x ranks`.
    pub micro_batches: Vec<usize>,
    /// Use the even partition and the topology's device order (the baseline a plan beats).
    pub even: bool,
    /// The layers each device held in the previous plan: placements keep the most of them.
    pub previous: Option<PreviousLayers>,
}

/// One stage's layers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StagePlan {
    /// Stage index along a direction's pipeline.
    pub stage: usize,
    /// First layer.
    pub first_layer: usize,
    /// One past the last layer.
    pub end_layer: usize,
    /// The activation recomputation the stage needs to fit its devices' memory (`none`,
    /// not written, when it fits without).
    #[serde(default, skip_serializing_if = "is_none")]
    pub recompute: Recompute,
}

fn is_none(r: &Recompute) -> bool {
    *r == Recompute::None
}

/// One rank: where it runs and what it holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankPlan {
    /// Pipeline rank.
    pub rank: usize,
    /// `datacenter/node/device` path of its device.
    pub device: String,
    /// The device's relative speed.
    pub speed: f64,
    /// The device's memory, in bytes.
    pub memory_capacity: f64,
    /// `(dir, stage)` pairs it runs.
    pub stages: Vec<(usize, usize)>,
    /// The layers whose weights it holds, ascending.
    pub layers: Vec<usize>,
    /// Bytes it uses at its peak: parameters plus the most live activations.
    pub memory: f64,
    /// Its compute time in the simulated step, in seconds.
    pub busy: f64,
}

/// One plan: a schedule, a partition and a placement, with its simulated step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Schedule kind name (`dualpipe`, `1f1b`, ...).
    pub schedule: String,
    /// Pipeline ranks.
    pub ranks: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Stages per rank per direction the schedule was generated with.
    pub virtual_stages: usize,
    /// `"min-max"` (planned) or `"even"` (the baseline).
    pub partition: String,
    /// Simulated step time, in seconds.
    pub step_time: f64,
    /// Micro-batches per second.
    pub throughput: f64,
    /// Idle share of all ranks' time in the step.
    pub bubble_ratio: f64,
    /// The largest share of a device's memory a rank uses.
    pub peak_memory_share: f64,
    /// Layers moved onto devices that did not hold them in the previous plan (with
    /// `--previous` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_moves: Option<usize>,
    /// Stages and their layers.
    pub stages: Vec<StagePlan>,
    /// Ranks and their devices.
    pub placement: Vec<RankPlan>,
}

/// A candidate no plan came from, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rejected {
    /// Schedule kind name.
    pub schedule: String,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Why.
    pub reason: String,
}

/// Every plan found (best first, by throughput) and the rejected candidates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    /// The plans, best first.
    pub plans: Vec<Plan>,
    /// Candidates without a plan.
    pub rejected: Vec<Rejected>,
}

/// A plan with its simulated timeline (for pictures).
#[derive(Clone, Debug)]
pub struct Evaluated {
    /// The plan.
    pub plan: Plan,
    /// Its simulated step.
    pub timeline: Timeline,
    /// The schedule it runs.
    pub schedule: Schedule,
}

/// How far a search has come, told before each candidate is planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Candidates planned so far.
    pub done: usize,
    /// Candidates in the search (those refused before any work not counted).
    pub total: usize,
    /// The schedule kind of the candidate now being planned.
    pub schedule: ScheduleKind,
    /// Its micro-batch count.
    pub micro_batches: usize,
}

/// Searches every candidate of `options` on `topology` with `profile`'s costs; one rank per
/// device.
pub fn plan(
    topology: &Topology,
    profile: &Profile,
    options: &PlanOptions,
) -> Result<PlanReport, PlanError> {
    plan_with_progress(topology, profile, options, &mut |_| {})
}

/// [`plan()`], telling `progress` before each candidate. Shapes no plan can have (more
/// stages than layers for every kind asked for, more parameters than all devices' memory)
/// are refused before any work, in one sentence each.
pub fn plan_with_progress(
    topology: &Topology,
    profile: &Profile,
    options: &PlanOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<PlanReport, PlanError> {
    let devices = topology.devices();
    let ranks = devices.len();
    if ranks > MAX_SIDE {
        return Err(PlanError::NoPlan(format!(
            "the topology has {ranks} devices; the planner places at most {MAX_SIDE}"
        )));
    }
    let kinds = if options.kinds.is_empty() {
        ScheduleKind::ALL
            .into_iter()
            .filter(|&k| k != ScheduleKind::Interleaved)
            .collect()
    } else {
        options.kinds.clone()
    };
    let mbs = if options.micro_batches.is_empty() {
        vec![ranks, 2 * ranks, 4 * ranks]
    } else {
        options.micro_batches.clone()
    };
    if kinds.len() > MAX_CANDIDATES || mbs.len() > MAX_CANDIDATES {
        return Err(PlanError::NoPlan(format!(
            "at most {MAX_CANDIDATES} schedule kinds and {MAX_CANDIDATES} micro-batch counts per search"
        )));
    }
    let too_few = |kind: ScheduleKind| {
        let stages = StagePlacement::for_kind(kind, ranks, kind.default_virtual_stages()).stages();
        (profile.layers.len() < stages).then(|| too_few_layers(kind, ranks, stages, profile))
    };
    let refused: Vec<Option<String>> = kinds.iter().map(|&k| too_few(k)).collect();
    if refused.iter().all(Option::is_some) {
        let least = kinds
            .iter()
            .map(|&k| StagePlacement::for_kind(k, ranks, k.default_virtual_stages()).stages())
            .min()
            .unwrap_or(ranks);
        return Err(PlanError::NoPlan(format!(
            "the profile has {} layers but every schedule asked for has at least {least} \
             stages on the topology's {ranks} devices, and every stage needs a layer; give a \
             profile of at least {least} layers or a topology of fewer devices",
            profile.layers.len()
        )));
    }
    let params = profile.sum(0..profile.layers.len()).parameter_bytes;
    let memory: f64 = devices.iter().map(|d| d.memory).sum();
    if params > memory {
        return Err(PlanError::NoPlan(format!(
            "the profile's layers hold {params:.4e} bytes of parameters, more than the \
             {memory:.4e} bytes of memory of all {ranks} devices together; give devices more \
             memory, more devices, or a smaller model"
        )));
    }
    let mut report = PlanReport {
        plans: Vec::new(),
        rejected: Vec::new(),
    };
    let total = refused.iter().filter(|r| r.is_none()).count() * mbs.len();
    let mut done = 0;
    for (&kind, refused) in kinds.iter().zip(refused) {
        for &n in &mbs {
            if let Some(reason) = &refused {
                report.rejected.push(Rejected {
                    schedule: kind.name().into(),
                    micro_batches: n,
                    reason: reason.clone(),
                });
                continue;
            }
            progress(Progress {
                done,
                total,
                schedule: kind,
                micro_batches: n,
            });
            done += 1;
            match evaluate(topology, profile, kind, n, options) {
                Ok(e) => report.plans.push(e.plan),
                Err(PlanError::NoPlan(reason))
                | Err(PlanError::Sim(dualpipe_sim::SimError::Schedule(reason))) => {
                    report.rejected.push(Rejected {
                        schedule: kind.name().into(),
                        micro_batches: n,
                        reason,
                    })
                }
                Err(other) => return Err(other),
            }
        }
    }
    report
        .plans
        .sort_by(|a, b| b.throughput.total_cmp(&a.throughput));
    Ok(report)
}

/// Why `kind` cannot run on `ranks` ranks with `profile`'s layers.
fn too_few_layers(kind: ScheduleKind, ranks: usize, stages: usize, profile: &Profile) -> String {
    format!(
        "{kind} on {ranks} ranks has {stages} stages but the profile has {} layers; every \
         stage needs a layer",
        profile.layers.len()
    )
}

/// What a rank holds for a partition: its compute per step (speed 1), its parameter bytes and
/// its peak memory.
struct RankNeeds {
    load: Vec<f64>,
    memory: Vec<f64>,
}

fn rank_needs(
    schedule: &Schedule,
    profile: &Profile,
    part: &Partition,
    recompute: &[Recompute],
) -> RankNeeds {
    let placement = &schedule.placement;
    let per_dir = schedule.micro_batches_per_dir() as f64;
    // Per stage: its seconds per micro-batch (with what it reruns), its parameter bytes, what
    // one chunk keeps after its forward and after its input backward, and the transient of
    // its recomputation.
    let per_stage: Vec<(f64, f64, (ChunkBytes, f64))> = (0..part.stages())
        .map(|s| {
            let sum = profile.sum(part.range(s));
            let mode = recompute.get(s).copied().unwrap_or_default();
            let (kept, rerun) = profile
                .kept(part.range(s), mode)
                .unwrap_or((sum.activation_bytes, 0.0));
            let per_chunk = ChunkBytes {
                forward: kept,
                backward: sum.backward_bytes(),
            };
            let bytes = (per_chunk, sum.activation_bytes - kept);
            (sum.work() + rerun, sum.parameter_bytes, bytes)
        })
        .collect();
    let (load, memory) = (0..schedule.ranks)
        .map(|r| {
            let stages = placement.stages_of(r);
            let load: f64 = stages.iter().map(|&(_, s)| per_dir * per_stage[s].0).sum();
            let params: f64 = stages.iter().map(|&(_, s)| per_stage[s].1).sum();
            let ops = schedule.programs[r].iter().filter(|op| op.is_compute());
            (
                load,
                params + rank_activation_bytes(ops, |s| per_stage[s].2),
            )
        })
        .unzip();
    RankNeeds { load, memory }
}

/// The stage slots of a placement of ranks on devices.
fn stage_slots(
    schedule: &Schedule,
    devices: &[DeviceSlot],
    device_of_rank: &[usize],
    live: &[LiveChunks],
) -> Vec<StageSlot> {
    let placement = &schedule.placement;
    let copies = placement.parameter_copies();
    (0..placement.stages())
        .map(|s| {
            let holders: Vec<usize> = placement.rank_of.iter().map(|row| row[s]).collect();
            StageSlot {
                speed: holders
                    .iter()
                    .map(|&r| devices[device_of_rank[r]].speed)
                    .fold(f64::INFINITY, f64::min),
                memory: holders
                    .iter()
                    .map(|&r| devices[device_of_rank[r]].memory / copies[r].max(1) as f64)
                    .fold(f64::INFINITY, f64::min),
                live: holders
                    .iter()
                    .fold(LiveChunks::default(), |acc, &r| acc.merge(&live[r])),
            }
        })
        .collect()
}

/// Plans one (kind, micro-batches) candidate.
pub fn evaluate(
    topology: &Topology,
    profile: &Profile,
    kind: ScheduleKind,
    micro_batches: usize,
    options: &PlanOptions,
) -> Result<Evaluated, PlanError> {
    let devices = topology.devices();
    let ranks = devices.len();
    let virtual_stages = kind.default_virtual_stages();
    let schedule = build(kind, ranks, micro_batches, virtual_stages)
        .map_err(|e| PlanError::NoPlan(e.to_string()))?;
    let stages = schedule.placement.stages();
    if profile.layers.len() < stages {
        return Err(PlanError::NoPlan(too_few_layers(
            kind, ranks, stages, profile,
        )));
    }
    let live: Vec<LiveChunks> = schedule
        .programs
        .iter()
        .map(|p| LiveChunks::of_program(p.iter().filter(|op| op.is_compute())))
        .collect();
    let mut sends = vec![vec![0usize; ranks]; ranks];
    for (r, program) in schedule.programs.iter().enumerate() {
        for op in program {
            if let Op::SendF { peer, .. } | Op::SendB { peer, .. } = *op {
                sends[r][peer] += 1;
            }
        }
    }
    let mut best: Option<Evaluated> = None;
    // Two starting placements: topology order, and (for the even split, only that one) the
    // devices sorted by speed with each rank and its mirror `ranks - 1 - r` on two devices of
    // neighbouring speed, so that DualPipe's pairs, which hold the same stages, are matched.
    let starts: Vec<Vec<usize>> = if options.even {
        vec![(0..ranks).collect()]
    } else {
        vec![(0..ranks).collect(), mirror_paired(&devices)]
    };
    for start in starts {
        let mut device_of_rank = start;
        let mut seen: Vec<Vec<usize>> = Vec::new();
        for _ in 0..ROUNDS {
            let slots = stage_slots(&schedule, &devices, &device_of_rank, &live);
            let part = if options.even {
                Partition::even(profile.layers.len(), stages)
                    .filter(|p| p.bottleneck(profile, &slots).is_some())
            } else {
                min_max(profile, &slots).map(|(p, _)| p)
            };
            let Some(part) = part else {
                return Err(PlanError::NoPlan(format!(
                "no {} partition of the {} layers into {stages} stages fits the devices' memory",
                if options.even { "even" } else { "contiguous" },
                profile.layers.len()
            )));
            };
            let recompute = part.recompute(profile, &slots);
            if !options.even {
                // The partition was cut for the devices the ranks sat on; place the ranks for
                // it (the next turn cuts again for the new devices).
                let needs = rank_needs(&schedule, profile, &part, &recompute);
                device_of_rank = place(
                    topology,
                    &devices,
                    &schedule,
                    profile,
                    &part,
                    &needs,
                    &sends,
                    &device_of_rank,
                    options,
                )?;
            }
            // The ranks may have moved: what each stage recomputes on its new devices.
            let recompute = part.recompute(
                profile,
                &stage_slots(&schedule, &devices, &device_of_rank, &live),
            );
            let e = simulate_plan(
                topology,
                &devices,
                &schedule,
                profile,
                (&part, &recompute),
                &device_of_rank,
                options,
            )?;
            let better = best.as_ref().is_none_or(|b| {
                (e.plan.step_time, e.plan.layer_moves) < (b.plan.step_time, b.plan.layer_moves)
            });
            if better {
                best = Some(e);
            }
            if options.even || seen.contains(&device_of_rank) {
                break;
            }
            seen.push(device_of_rank.clone());
        }
    }
    best.ok_or_else(|| PlanError::NoPlan(format!("{kind}: no placement found")))
}

/// Devices sorted by speed (fastest first, then topology order), dealt to the rank pairs
/// `(0, ranks - 1)`, `(1, ranks - 2)`, ...
fn mirror_paired(devices: &[DeviceSlot]) -> Vec<usize> {
    let ranks = devices.len();
    let mut order: Vec<usize> = (0..ranks).collect();
    order.sort_by(|&a, &b| {
        devices[b]
            .speed
            .total_cmp(&devices[a].speed)
            .then(a.cmp(&b))
    });
    let mut device_of_rank = vec![0; ranks];
    for (k, pair) in order.chunks(2).enumerate() {
        device_of_rank[k] = pair[0];
        if let Some(&d) = pair.get(1) {
            device_of_rank[ranks - 1 - k] = d;
        }
    }
    device_of_rank
}

/// Places ranks on devices for a partition (bottleneck, then kept layers, then messages).
#[allow(clippy::too_many_arguments)]
fn place(
    topology: &Topology,
    devices: &[DeviceSlot],
    schedule: &Schedule,
    profile: &Profile,
    part: &Partition,
    needs: &RankNeeds,
    sends: &[Vec<usize>],
    current: &[usize],
    options: &PlanOptions,
) -> Result<Vec<usize>, PlanError> {
    let ranks = schedule.ranks;
    let time: Vec<Vec<Option<f64>>> = (0..ranks)
        .map(|r| {
            devices
                .iter()
                .map(|d| (needs.memory[r] <= d.memory).then(|| needs.load[r] / d.speed))
                .collect()
        })
        .collect();
    let layers = rank_layers(schedule, part);
    let keep: Vec<Vec<u32>> = (0..ranks)
        .map(|r| {
            devices
                .iter()
                .map(|d| match &options.previous {
                    Some(prev) => prev.kept(&d.path, &layers[r]),
                    None => 0,
                })
                .collect()
        })
        .collect();
    let bytes = profile.message_bytes;
    let extra: Vec<Vec<f64>> = (0..ranks)
        .map(|r| {
            devices
                .iter()
                .map(|d| {
                    (0..ranks)
                        .filter(|&q| q != r && sends[r][q] + sends[q][r] > 0)
                        .map(|q| {
                            let class = Topology::class(d, &devices[current[q]]);
                            let t = topology.link(class).map_or(0.0, |l| l.message_time(bytes));
                            (sends[r][q] + sends[q][r]) as f64 * t
                        })
                        .sum()
                })
                .collect()
        })
        .collect();
    let a = assign(&time, &keep, &extra).ok_or_else(|| {
        PlanError::NoPlan(format!(
            "{}: no placement of the ranks fits the devices' memory",
            schedule.kind
        ))
    })?;
    Ok(a.column)
}

/// The layers each rank holds under a partition.
pub fn rank_layers(schedule: &Schedule, part: &Partition) -> Vec<Vec<usize>> {
    (0..schedule.ranks)
        .map(|r| {
            let mut layers: Vec<usize> = schedule
                .placement
                .stages_of(r)
                .into_iter()
                .flat_map(|(_, s)| part.range(s))
                .collect();
            layers.sort_unstable();
            layers.dedup();
            layers
        })
        .collect()
}

/// The cost model of a partition placed on devices: per-stage compute at speed 1 (a stage's
/// backward charged with the forward its `recompute` entry reruns, see
/// [`StageCost::with_recompute`]; missing entries recompute nothing), per-rank speeds, and
/// messages charged by the links they cross.
pub fn cost_model(
    topology: &Topology,
    devices: &[DeviceSlot],
    profile: &Profile,
    part: &Partition,
    recompute: &[Recompute],
    device_of_rank: &[usize],
) -> Result<CostModel, PlanError> {
    let per_stage = (0..part.stages())
        .map(|s| {
            let sum = profile.sum(part.range(s));
            let b = sum.i + sum.w;
            let mode = recompute.get(s).copied().unwrap_or_default();
            let rerun = profile.kept(part.range(s), mode).map_or(0.0, |k| k.1);
            StageCost::new(sum.f, b, sum.w, sum.f + b).with_recompute(rerun)
        })
        .collect();
    let network = topology.network(device_of_rank, vec![profile.message_bytes])?;
    Ok(CostModel::default()
        .with_per_stage(per_stage)
        .with_comm(CommCost {
            message_bytes: profile.message_bytes,
            ..CommCost::FREE
        })
        .with_rank_speed(device_of_rank.iter().map(|&d| devices[d].speed).collect())
        .with_network(network))
}

fn simulate_plan(
    topology: &Topology,
    devices: &[DeviceSlot],
    schedule: &Schedule,
    profile: &Profile,
    (part, recompute): (&Partition, &[Recompute]),
    device_of_rank: &[usize],
    options: &PlanOptions,
) -> Result<Evaluated, PlanError> {
    let cost = cost_model(topology, devices, profile, part, recompute, device_of_rank)?;
    let timeline = simulate(schedule, &cost)?;
    let m = metrics(&timeline, &schedule.placement);
    let needs = rank_needs(schedule, profile, part, recompute);
    let layers = rank_layers(schedule, part);
    let placement: Vec<RankPlan> = (0..schedule.ranks)
        .map(|r| {
            let d = &devices[device_of_rank[r]];
            RankPlan {
                rank: r,
                device: d.path.clone(),
                speed: d.speed,
                memory_capacity: d.memory,
                stages: schedule.placement.stages_of(r),
                layers: layers[r].clone(),
                memory: needs.memory[r],
                busy: m.busy_per_rank[r],
            }
        })
        .collect();
    let layer_moves = options.previous.as_ref().map(|prev| {
        placement
            .iter()
            .map(|rp| rp.layers.len() - prev.kept(&rp.device, &rp.layers) as usize)
            .sum()
    });
    let plan = Plan {
        schedule: schedule.kind.name().into(),
        ranks: schedule.ranks,
        micro_batches: schedule.micro_batches,
        virtual_stages: schedule.virtual_stages,
        partition: if options.even { "even" } else { "min-max" }.into(),
        step_time: m.makespan,
        throughput: if m.makespan > 0.0 {
            schedule.micro_batches as f64 / m.makespan
        } else {
            0.0
        },
        bubble_ratio: m.bubble_ratio,
        peak_memory_share: placement
            .iter()
            .map(|p| p.memory / p.memory_capacity)
            .fold(0.0, f64::max),
        layer_moves,
        stages: (0..part.stages())
            .map(|s| StagePlan {
                stage: s,
                first_layer: part.bounds[s],
                end_layer: part.bounds[s + 1],
                recompute: recompute.get(s).copied().unwrap_or_default(),
            })
            .collect(),
        placement,
    };
    Ok(Evaluated {
        plan,
        timeline,
        schedule: schedule.clone(),
    })
}
