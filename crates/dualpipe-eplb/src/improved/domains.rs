//! Packing one layer's domains (a node each, or every GPU for the global policy) for a given
//! placement of the expert groups, and bringing moved replicas back afterwards.

use super::PlannerOptions;
use crate::migrate::preserve_slots;
use crate::packing::{Domain, SearchLimits};
use crate::Layout;

/// Builds and packs every domain for the given group placement. With `prev`, each domain
/// starts from the previous replicas of its experts (at most one per GPU) and the search is
/// charged for moves; without it, it starts empty and moves are free. Returns the layer's
/// placement and whether every domain reached `target`.
///
/// The layer's hottest GPU is the hottest of its domains' GPUs, so no domain is searched
/// further than the hottest load another domain was left at: the domains are searched hottest
/// first (after filling), each stopping at `target` or at the hottest load of the domains
/// before it. The layer's hottest load is the one searching every domain to `target` gives.
pub(super) fn pack_layer(
    load: &[f64],
    layout: &Layout,
    node_of: &[usize],
    prev: Option<&[usize]>,
    trim: bool,
    target: f64,
    opts: &PlannerOptions,
) -> (Vec<usize>, bool) {
    pack_layer_with(load, layout, node_of, prev, trim, target, opts, true)
}

/// [`pack_layer`]; with `share_floor` false every domain is searched all the way to `target`
/// (what the layer's hottest load is compared with in the tests).
#[allow(clippy::too_many_arguments)]
fn pack_layer_with(
    load: &[f64],
    layout: &Layout,
    node_of: &[usize],
    prev: Option<&[usize]>,
    trim: bool,
    target: f64,
    opts: &PlannerOptions,
    share_floor: bool,
) -> (Vec<usize>, bool) {
    let (domains, gpd) = layout.domains();
    let slots = layout.slots_per_gpu();
    let size = layout.experts / node_of.len();
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); domains];
    for e in 0..layout.experts {
        members[node_of[e / size]].push(e);
    }
    let mut local = vec![usize::MAX; layout.experts];
    let mut filled = Vec::with_capacity(domains);
    for (d, experts) in members.iter().enumerate() {
        for (i, &e) in experts.iter().enumerate() {
            local[e] = i;
        }
        let n = experts.len();
        let base = d * gpd * slots;
        let loads: Vec<f64> = experts.iter().map(|&e| load[e]).collect();
        let mut dom = match prev {
            None => Domain::fresh(gpd, slots, loads, opts.near_equal),
            Some(prev) => {
                let mut orig = vec![false; gpd * n];
                for s in 0..gpd * slots {
                    let e = prev[base + s];
                    if local[e] != usize::MAX {
                        orig[(s / slots) * n + local[e]] = true;
                    }
                }
                Domain::new(gpd, slots, loads, orig, opts.near_equal)
            }
        };
        if let Some(prev) = prev {
            for s in 0..gpd * slots {
                let e = local[prev[base + s]];
                if e != usize::MAX && dom.on(s / slots, e) == 0 {
                    dom.put(s, e);
                }
            }
        }
        if trim {
            dom.trim_to_fair_counts();
        }
        dom.fill();
        for &e in experts {
            local[e] = usize::MAX;
        }
        let max = dom.max_load();
        filled.push((dom, max));
    }
    let mut order: Vec<usize> = (0..domains).collect();
    order.sort_by(|&a, &b| filled[b].1.total_cmp(&filled[a].1).then(a.cmp(&b)));
    let mut reached = true;
    // The hottest load of the domains searched so far.
    let mut enough = f64::NEG_INFINITY;
    for d in order {
        let (dom, max) = &mut filled[d];
        if *max > target && *max > enough {
            let limits = SearchLimits {
                target,
                enough,
                max_moves: if prev.is_some() {
                    (opts.max_move_fraction * (gpd * slots) as f64).floor() as usize
                } else {
                    usize::MAX
                },
                max_steps: opts.search_steps,
                free_moves: prev.is_none(),
            };
            reached &= dom.improve(&limits);
            *max = dom.max_load();
        }
        if share_floor {
            enough = enough.max(*max);
        }
    }
    let mut out = vec![0; layout.replicas];
    for (d, ((dom, _), experts)) in filled.iter().zip(&members).enumerate() {
        let base = d * gpd * slots;
        for (s, &e) in dom.slot.iter().enumerate() {
            out[base + s] = experts[e];
        }
    }
    (out, reached)
}

/// Brings moved replicas of a layer's placement back to GPUs that held them before, by
/// exchanges inside each domain that keep every GPU at or below `cap_load` (see
/// [`Domain::reduce_moves`]); then preserves slots.
pub(super) fn reduce_moves(
    phy2log: &[usize],
    prev: &[usize],
    load: &[f64],
    layout: &Layout,
    cap_load: f64,
) -> Vec<usize> {
    let (domains, gpd) = layout.domains();
    let slots = layout.slots_per_gpu();
    let per_domain = gpd * slots;
    let mut out = phy2log.to_vec();
    for d in 0..domains {
        let base = d * per_domain;
        let mut experts: Vec<usize> = phy2log[base..base + per_domain].to_vec();
        experts.sort_unstable();
        experts.dedup();
        let mut local = vec![usize::MAX; layout.experts];
        for (i, &e) in experts.iter().enumerate() {
            local[e] = i;
        }
        let n = experts.len();
        let mut orig = vec![false; gpd * n];
        for s in 0..per_domain {
            let e = local[prev[base + s]];
            if e != usize::MAX {
                orig[(s / slots) * n + e] = true;
            }
        }
        let loads: Vec<f64> = experts.iter().map(|&e| load[e]).collect();
        let mut dom = Domain::new(gpd, slots, loads, orig, 0.0);
        for s in 0..per_domain {
            dom.put(s, local[phy2log[base + s]]);
        }
        if dom.moves() == 0 || dom.reduce_moves(cap_load, 8) == 0 {
            continue;
        }
        for (s, &e) in dom.slot.iter().enumerate() {
            out[base + s] = experts[e];
        }
    }
    preserve_slots(&out, prev, layout.gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic skewed loads.
    fn loads(experts: usize, seed: u64) -> Vec<f64> {
        let mut x = seed;
        (0..experts)
            .map(|_| {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                (3.0 * u).exp() * 10.0
            })
            .collect()
    }

    #[test]
    fn cooler_domains_stop_at_the_hottest_without_changing_the_layer_max() {
        // 8 groups on 4 nodes of 4 GPUs, 2 or 3 slots per GPU: the domains differ in load, so
        // the cooler ones stop early.
        let mut stopped_early = 0;
        for (replicas, seed) in [(32, 1), (48, 2), (32, 3), (48, 4), (32, 5), (48, 6)] {
            let layout = Layout {
                experts: 32,
                replicas,
                groups: 8,
                nodes: 4,
                gpus: 16,
            };
            let load = loads(32, seed);
            let node_of: Vec<usize> = (0..8).map(|g| g / 2).collect();
            let opts = PlannerOptions::default();
            let (shared, a) =
                pack_layer_with(&load, &layout, &node_of, None, false, 0.0, &opts, true);
            let (full, b) =
                pack_layer_with(&load, &layout, &node_of, None, false, 0.0, &opts, false);
            let max = |p: &[usize]| {
                crate::improved::gpu_loads(p, &load, layout.gpus)
                    .into_iter()
                    .fold(0.0, f64::max)
            };
            assert_eq!(max(&shared).to_bits(), max(&full).to_bits(), "seed {seed}");
            assert_eq!(a, b);
            assert!(crate::improved::follows_policy(&shared, &layout));
            stopped_early += usize::from(shared != full);
        }
        assert!(
            stopped_early > 0,
            "the case covers a domain that stops early"
        );
    }
}
