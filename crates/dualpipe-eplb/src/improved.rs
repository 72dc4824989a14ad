//! The improved, migration-aware placement policy.
//!
//! It keeps the structure of DeepSeek's hierarchical policy (expert groups packed onto nodes,
//! replicas chosen and packed inside each node; one domain of all GPUs when the groups do not
//! divide over the nodes) and changes three things:
//!
//! - **duplicate-free packing**: a GPU never holds two replicas of one expert unless that expert
//!   has more replicas than its domain has GPUs (then at most `ceil(replicas / gpus)`);
//! - **an improvement pass**: a deterministic local search (exchanging replicas between GPUs and
//!   giving surplus replicas to other experts) that lowers the hottest GPU's load, bounded in
//!   steps, in work (about the deepseek policy's own `n log n` per domain, so it stays within
//!   a few times the reference's time at every size) and, when a previous placement exists, in
//!   moved replicas;
//! - **migration awareness**: given the previous placement, a layer is left as it is when it is
//!   balanced enough, and otherwise re-planned from the previous placement with as few moved
//!   replicas as reach the balance of a fresh plan (within a tolerance).
//!
//! A replica *moves* when its logical expert was not on that GPU before.
//!
//! ```
//! use dualpipe_eplb::improved::{rebalance_improved, PlannerOptions};
//! use dualpipe_eplb::Layout;
//! use dualpipe_eplb::moves::move_plan;
//! use dualpipe_eplb::plan_check::{check_moves, check_policy};
//!
//! // 4 experts in 2 groups, 8 replicas on 4 GPUs in 2 nodes.
//! let layout = Layout { experts: 4, replicas: 8, groups: 2, nodes: 2, gpus: 4 };
//! let opts = PlannerOptions { tolerance: 0.01, ..PlannerOptions::default() };
//! let before = rebalance_improved(&[vec![40.0, 10.0, 30.0, 20.0]], &layout, None, &opts).unwrap();
//! let after = rebalance_improved(
//!     &[vec![10.0, 40.0, 30.0, 20.0]], &layout, Some(&before.phy2log()), &opts,
//! ).unwrap();
//! let moves = move_plan(&before.phy2log(), &after.phy2log(), layout.gpus, layout.nodes, 1 << 20);
//! assert_eq!(moves.moves.len(), after.moved());
//! assert!(check_moves(&before.phy2log(), &after.phy2log(), &moves.moves, layout.gpus).is_ok());
//! assert!(check_policy(&after.phy2log(), &layout).is_ok());
//! ```

use rayon::prelude::*;

use crate::migrate::{assign_max, matching_work, relabel, MATCHING_MAX_WORK};
use crate::previous::PreviousPlacement;
use crate::{EplbError, Layout, LoadMatrix};

mod domains;
mod options;
use domains::{pack_layer, reduce_moves};
pub use options::PlannerOptions;

/// From this many physical slots in total (layers x replicas), layers are planned in parallel.
const PARALLEL_MIN_SLOTS: usize = 4096;

/// How a layer's placement was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// No previous placement: planned from scratch.
    Fresh,
    /// Left untouched by hysteresis (`min_imbalance`).
    Hysteresis,
    /// The previous placement was already within the tolerance.
    Kept,
    /// Re-planned from the previous placement, groups staying on their nodes.
    Repaired,
    /// Re-planned from the previous placement with groups re-packed onto nodes.
    Regrouped,
    /// The fresh plan, relabelled to keep as many replicas in place as possible.
    Relabelled,
}

/// One layer's result.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerPlan {
    /// Logical expert of every physical slot (`gpu * slots_per_gpu + slot`).
    pub phy2log: Vec<usize>,
    /// How it was obtained.
    pub decision: Decision,
    /// Replicas moved relative to the previous placement (0 without one).
    pub moved: usize,
    /// The hottest GPU's load under this layer's loads.
    pub max_load: f64,
    /// The hottest GPU's load of a fresh plan of this policy.
    pub fresh_max_load: f64,
}

/// Load of every GPU of one layer's placement (`phy2log` row), each replica carrying
/// `load[e] / replicas of e`.
pub fn gpu_loads(phy2log: &[usize], load: &[f64], gpus: usize) -> Vec<f64> {
    let slots = phy2log.len() / gpus.max(1);
    let mut count = vec![0usize; load.len()];
    for &e in phy2log {
        count[e] += 1;
    }
    let mut out = vec![0.0; gpus];
    for (s, &e) in phy2log.iter().enumerate() {
        out[s / slots] += load[e] / count[e] as f64;
    }
    out
}

/// Balancedness of one layer: mean GPU load / hottest GPU load (1.0 = perfect; 1.0 when idle).
pub fn balancedness(phy2log: &[usize], load: &[f64], gpus: usize) -> f64 {
    let loads = gpu_loads(phy2log, load, gpus);
    let max = loads.iter().copied().fold(0.0, f64::max);
    if max <= 0.0 {
        return 1.0;
    }
    loads.iter().sum::<f64>() / loads.len() as f64 / max
}

/// Replicas of `new` whose logical expert was not on the same GPU in `old` (one layer each).
pub fn moved_replicas(old: &[usize], new: &[usize], gpus: usize) -> usize {
    let slots = new.len() / gpus.max(1);
    let experts = old.iter().chain(new).copied().max().map_or(0, |e| e + 1);
    // Whether GPU `g` held the expert: stamped with `g + 1`.
    let mut held = vec![0usize; experts];
    (0..gpus)
        .map(|g| {
            for &e in &old[g * slots..(g + 1) * slots] {
                held[e] = g + 1;
            }
            new[g * slots..(g + 1) * slots]
                .iter()
                .filter(|&&e| held[e] != g + 1)
                .count()
        })
        .sum()
}

/// Packs expert groups onto nodes, heaviest first onto the lightest node with room. Returns the
/// node of every group.
fn pack_groups(load: &[f64], layout: &Layout) -> Vec<usize> {
    let (domains, _) = layout.domains();
    let groups = layout.policy_groups();
    let size = layout.experts / groups;
    let per_node = groups / domains;
    let group_load: Vec<f64> = (0..groups)
        .map(|g| load[g * size..(g + 1) * size].iter().sum())
        .collect();
    let mut order: Vec<usize> = (0..groups).collect();
    order.sort_by(|&a, &b| group_load[b].total_cmp(&group_load[a]).then(a.cmp(&b)));
    let mut node_load = vec![0.0f64; domains];
    let mut node_items = vec![0; domains];
    let mut node_of = vec![0; groups];
    for g in order {
        let n = (0..domains)
            .filter(|&n| node_items[n] < per_node)
            .min_by(|&a, &b| node_load[a].total_cmp(&node_load[b]).then(a.cmp(&b)))
            .expect("enough room for every group");
        node_of[g] = n;
        node_load[n] += group_load[g];
        node_items[n] += 1;
    }
    // Then exchange groups between the hottest node and another while that cools it.
    for _ in 0..4 * groups {
        let hot = (0..domains)
            .max_by(|&a, &b| node_load[a].total_cmp(&node_load[b]).then(b.cmp(&a)))
            .expect("at least one node");
        let mut best: Option<(f64, usize, usize)> = None;
        for a in (0..groups).filter(|&a| node_of[a] == hot) {
            for b in (0..groups).filter(|&b| node_of[b] != hot) {
                let n = node_of[b];
                let delta = group_load[a] - group_load[b];
                let worst = (node_load[hot] - delta).max(node_load[n] + delta);
                if worst < node_load[hot] * (1.0 - 1e-12) && best.is_none_or(|(w, _, _)| worst < w)
                {
                    best = Some((worst, a, b));
                }
            }
        }
        let Some((_, a, b)) = best else { break };
        let n = node_of[b];
        let delta = group_load[a] - group_load[b];
        node_load[hot] -= delta;
        node_load[n] += delta;
        node_of[a] = n;
        node_of[b] = hot;
    }
    node_of
}

/// Node of every group that keeps the most of `prev`'s replicas on their node; the fresh
/// packing of `load` when that matching would take more than [`MATCHING_MAX_WORK`].
fn groups_from_previous(prev: &[usize], load: &[f64], layout: &Layout) -> Vec<usize> {
    let (domains, gpd) = layout.domains();
    let groups = layout.policy_groups();
    if matching_work(groups) > MATCHING_MAX_WORK {
        return pack_groups(load, layout);
    }
    let size = layout.experts / groups;
    let per_node = groups / domains;
    let slots_per_domain = gpd * layout.slots_per_gpu();
    let mut held = vec![vec![0i64; domains]; groups];
    for (s, &e) in prev.iter().enumerate() {
        held[e / size][s / slots_per_domain] += 1;
    }
    let profit: Vec<Vec<i64>> = held
        .iter()
        .map(|row| (0..groups).map(|c| row[c / per_node]).collect())
        .collect();
    assign_max(&profit)
        .into_iter()
        .map(|c| c / per_node)
        .collect()
}

/// Relabels the nodes of a group packing so it keeps the most of `prev`'s replicas in place
/// (unchanged when that matching would take more than [`MATCHING_MAX_WORK`]).
fn relabel_groups(node_of: &[usize], prev: &[usize], layout: &Layout) -> Vec<usize> {
    let (domains, gpd) = layout.domains();
    if matching_work(domains) > MATCHING_MAX_WORK {
        return node_of.to_vec();
    }
    let size = layout.experts / node_of.len();
    let slots_per_domain = gpd * layout.slots_per_gpu();
    let mut profit = vec![vec![0i64; domains]; domains];
    for (s, &e) in prev.iter().enumerate() {
        profit[node_of[e / size]][s / slots_per_domain] += 1;
    }
    let to = assign_max(&profit);
    node_of.iter().map(|&n| to[n]).collect()
}

/// A fresh plan of the improved policy for one layer.
fn fresh_layer(load: &[f64], layout: &Layout, opts: &PlannerOptions) -> Vec<usize> {
    let node_of = pack_groups(load, layout);
    let (domains, gpd) = layout.domains();
    let size = layout.experts / node_of.len();
    // No domain can go below its mean, so the hottest domain's mean bounds the layer.
    let mut domain_load = vec![0.0; domains];
    for (e, &l) in load.iter().enumerate() {
        domain_load[node_of[e / size]] += l;
    }
    let bound = domain_load.iter().copied().fold(0.0, f64::max) / gpd as f64;
    pack_layer(load, layout, &node_of, None, false, bound, opts).0
}

/// Whether a placement obeys the improved policy's rules: duplicate-free and, for the
/// hierarchical policy, every group on one node.
pub fn follows_policy(phy2log: &[usize], layout: &Layout) -> bool {
    let (domains, gpd) = layout.domains();
    let slots = layout.slots_per_gpu();
    let mut count = vec![0usize; layout.experts];
    for &e in phy2log {
        count[e] += 1;
    }
    for g in 0..layout.gpus {
        let mut here = vec![0usize; 0];
        here.extend_from_slice(&phy2log[g * slots..(g + 1) * slots]);
        here.sort_unstable();
        for run in here.chunk_by(|a, b| a == b) {
            if run.len() > count[run[0]].div_ceil(gpd).max(1) {
                return false;
            }
        }
    }
    if domains > 1 {
        let size = layout.experts / layout.groups;
        let mut node_of = vec![usize::MAX; layout.groups];
        for (s, &e) in phy2log.iter().enumerate() {
            let node = s / (gpd * slots);
            let g = e / size;
            if node_of[g] == usize::MAX {
                node_of[g] = node;
            } else if node_of[g] != node {
                return false;
            }
        }
    }
    true
}

/// Plans one layer with the improved policy. `prev` is the layer's previous placement (already
/// checked to be a placement for `layout`).
pub fn plan_layer(
    load: &[f64],
    layout: &Layout,
    prev: Option<&[usize]>,
    opts: &PlannerOptions,
) -> LayerPlan {
    let fresh = fresh_layer(load, layout, opts);
    let fresh_max = max_of(&fresh, load, layout);
    let Some(prev) = prev else {
        return LayerPlan {
            phy2log: fresh,
            decision: Decision::Fresh,
            moved: 0,
            max_load: fresh_max,
            fresh_max_load: fresh_max,
        };
    };
    let plan = |phy2log: Vec<usize>, decision| {
        let max_load = max_of(&phy2log, load, layout);
        let moved = moved_replicas(prev, &phy2log, layout.gpus);
        LayerPlan {
            phy2log,
            decision,
            moved,
            max_load,
            fresh_max_load: fresh_max,
        }
    };
    let prev_loads = gpu_loads(prev, load, layout.gpus);
    let prev_max = prev_loads.iter().copied().fold(0.0, f64::max);
    let mean = prev_loads.iter().sum::<f64>() / layout.gpus as f64;
    if let Some(x) = opts.min_imbalance {
        if prev_max <= x * mean {
            return plan(prev.to_vec(), Decision::Hysteresis);
        }
    }
    let budget = fresh_max * (1.0 + opts.tolerance) * (1.0 + 1e-12);
    if prev_max <= budget && follows_policy(prev, layout) {
        return plan(prev.to_vec(), Decision::Kept);
    }
    let mut candidates = Vec::new();
    let kept_groups = groups_from_previous(prev, load, layout);
    // From the previous placement: as it is, then with surplus replicas freed first.
    for trim in [false, true] {
        let (repaired, ok) = pack_layer(load, layout, &kept_groups, Some(prev), trim, budget, opts);
        if ok {
            candidates.push(plan(
                reduce_moves(&repaired, prev, load, layout, budget),
                Decision::Repaired,
            ));
            break;
        }
    }
    if layout.hierarchical() && layout.nodes > 1 {
        let packed = relabel_groups(&pack_groups(load, layout), prev, layout);
        if packed != kept_groups {
            for trim in [false, true] {
                let (regrouped, ok) =
                    pack_layer(load, layout, &packed, Some(prev), trim, budget, opts);
                if ok {
                    candidates.push(plan(
                        reduce_moves(&regrouped, prev, load, layout, budget),
                        Decision::Regrouped,
                    ));
                    break;
                }
            }
        }
    }
    let nodes = if layout.hierarchical() {
        layout.nodes
    } else {
        1
    };
    // The relabelled fresh plan has the fresh plan's loads, so it is within budget (up to the
    // order of floating-point sums, hence the fallback).
    let relabelled = relabel(&fresh, prev, layout.gpus, nodes);
    let relabelled = plan(
        reduce_moves(&relabelled, prev, load, layout, budget),
        Decision::Relabelled,
    );
    candidates
        .into_iter()
        .filter(|c| c.max_load <= budget)
        .min_by(|a, b| {
            a.moved
                .cmp(&b.moved)
                .then(a.max_load.total_cmp(&b.max_load))
        })
        .filter(|c| c.moved < relabelled.moved)
        .unwrap_or(relabelled)
}

fn max_of(phy2log: &[usize], load: &[f64], layout: &Layout) -> f64 {
    gpu_loads(phy2log, load, layout.gpus)
        .into_iter()
        .fold(0.0, f64::max)
}

/// The improved policy over every layer.
#[derive(Clone, Debug, PartialEq)]
pub struct ImprovedPlan {
    /// One [`LayerPlan`] per layer.
    pub layers: Vec<LayerPlan>,
}

impl ImprovedPlan {
    /// The `phy2log` matrix, `[layers][replicas]`.
    pub fn phy2log(&self) -> Vec<Vec<usize>> {
        self.layers.iter().map(|l| l.phy2log.clone()).collect()
    }

    /// Replicas moved over all layers.
    pub fn moved(&self) -> usize {
        self.layers.iter().map(|l| l.moved).sum()
    }

    /// The plan in the crate's [`ExpertPlan`](crate::ExpertPlan) form.
    pub fn to_plan(&self, layout: &Layout) -> Result<crate::ExpertPlan, EplbError> {
        crate::ExpertPlan::from_phy2log(&self.phy2log(), layout)
    }
}

/// Checks that the improved policy can plan `layout`: its GPU x expert table of one placement
/// domain stays below 2^28 cells.
pub fn check_domain_size(layout: &Layout) -> Result<(), EplbError> {
    let (domains, gpd) = layout.domains();
    let cells = (gpd as u128) * (layout.experts / domains) as u128;
    if cells > 1 << 28 {
        return Err(EplbError::Layout(format!(
            "{gpd} GPUs x {} experts in one placement domain is too large for the improved policy (at most 2^28); use `policy` deepseek or more nodes",
            layout.experts / domains
        )));
    }
    Ok(())
}

/// Plans every layer with the improved policy. `load` is `[layers][experts]`; `prev` is the
/// previous `phy2log` (`[layers][replicas]`) when there is one.
pub fn rebalance_improved(
    load: &[Vec<f64>],
    layout: &Layout,
    prev: Option<&[Vec<usize>]>,
    opts: &PlannerOptions,
) -> Result<ImprovedPlan, EplbError> {
    let loads = LoadMatrix::from_rows(load.to_vec())?;
    layout.validate(&loads)?;
    check_domain_size(layout)?;
    opts.check()?;
    if let Some(prev) = prev {
        // The topology of a bare matrix is the layout's; only the shape is checked here.
        PreviousPlacement::from_rows(prev.to_vec()).check(load.len(), layout)?;
    }
    let one =
        |(l, row): (usize, &Vec<f64>)| plan_layer(row, layout, prev.map(|p| p[l].as_slice()), opts);
    // Layers are independent: large inputs are planned in parallel (as the reference does);
    // the result does not depend on the number of threads.
    let layers = if load.len() > 1 && load.len() * layout.replicas >= PARALLEL_MIN_SLOTS {
        load.par_iter().enumerate().map(one).collect()
    } else {
        load.iter().enumerate().map(one).collect()
    };
    Ok(ImprovedPlan { layers })
}
