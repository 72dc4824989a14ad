//! Property tests: every plan the improved planner emits passes the validator, with and without
//! a previous placement, and so do its move plans and rounds.

use dualpipe_eplb::improved::{
    gpu_loads, moved_replicas, rebalance_improved, Decision, PlannerOptions,
};
use dualpipe_eplb::migrate::relabel;
use dualpipe_eplb::moves::move_plan;
use dualpipe_eplb::plan_check::check_plan;
use dualpipe_eplb::plan_check::{check_moves, check_placement, check_policy, check_rounds};
use dualpipe_eplb::{rebalance_experts, Layout, LoadMatrix};
use proptest::prelude::*;

/// A layout and two load matrices (previous interval, this interval).
fn case() -> impl Strategy<Value = (Layout, Vec<Vec<f64>>, Vec<Vec<f64>>)> {
    (
        1usize..=3,
        1usize..=4,
        1usize..=4,
        1usize..=3,
        1usize..=3,
        1usize..=3,
    )
        .prop_flat_map(|(nodes, gpn, slots, groups_per_node, layers, shrink)| {
            let gpus = nodes * gpn;
            let replicas = gpus * slots;
            // Groups divide over nodes (hierarchical) unless `shrink` makes them not.
            let groups = if shrink == 3 && nodes > 1 {
                nodes * groups_per_node + 1
            } else {
                nodes * groups_per_node
            };
            let max_size = (replicas / groups).max(1);
            (1usize..=max_size).prop_flat_map(move |size| {
                let experts = groups * size;
                let layout = Layout {
                    experts,
                    replicas,
                    groups,
                    nodes,
                    gpus,
                };
                let row = prop::collection::vec(
                    prop_oneof![
                        Just(0.0),
                        0.0f64..10.0,
                        0.0f64..1000.0,
                        (1u32..8).prop_map(|k| 10f64.powi(k as i32))
                    ],
                    experts,
                );
                let loads = prop::collection::vec(row, layers);
                (Just(layout), loads.clone(), loads)
            })
        })
        .prop_filter("at least one replica per expert", |(l, _, _)| {
            l.replicas >= l.experts
        })
}

fn reference_phy2log(loads: &[Vec<f64>], l: &Layout) -> Vec<Vec<usize>> {
    let m = LoadMatrix::from_rows(loads.to_vec()).unwrap();
    let plan = rebalance_experts(&m, l.replicas, l.groups, l.nodes, l.gpus).unwrap();
    plan.phy2log
        .iter_rows()
        .map(|r| r.iter().map(|&e| e as usize).collect())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn fresh_plans_pass_the_validator((layout, _, load) in case()) {
        let plan = rebalance_improved(&load, &layout, None, &PlannerOptions::default()).unwrap();
        let phy2log = plan.phy2log();
        prop_assert!(check_placement(&phy2log, layout.experts, layout.gpus).is_ok());
        prop_assert_eq!(check_policy(&phy2log, &layout), Ok(()));
        prop_assert_eq!(check_plan(&plan.to_plan(&layout).unwrap()), Ok(()));
        for l in &plan.layers {
            prop_assert_eq!(l.decision, Decision::Fresh);
            prop_assert!(l.max_load <= l.fresh_max_load * (1.0 + 1e-9));
        }
        // Deterministic.
        let again = rebalance_improved(&load, &layout, None, &PlannerOptions::default()).unwrap();
        prop_assert_eq!(again.phy2log(), phy2log);
    }

    #[test]
    fn migration_plans_pass_the_validator(
        (layout, before, now) in case(),
        tolerance in prop_oneof![Just(0.0), 0.0f64..0.2],
        from_reference in any::<bool>(),
    ) {
        let opts = PlannerOptions { tolerance, ..PlannerOptions::default() };
        let prev = if from_reference {
            reference_phy2log(&before, &layout)
        } else {
            rebalance_improved(&before, &layout, None, &opts).unwrap().phy2log()
        };
        let plan = rebalance_improved(&now, &layout, Some(&prev), &opts).unwrap();
        let new = plan.phy2log();
        prop_assert!(check_placement(&new, layout.experts, layout.gpus).is_ok());
        prop_assert_eq!(check_policy(&new, &layout), Ok(()));
        prop_assert_eq!(check_plan(&plan.to_plan(&layout).unwrap()), Ok(()));
        for (i, l) in plan.layers.iter().enumerate() {
            // Within the tolerance of a fresh plan of the same policy.
            prop_assert!(l.max_load <= l.fresh_max_load * (1.0 + tolerance) * (1.0 + 1e-9),
                "layer {} max {} fresh {}", i, l.max_load, l.fresh_max_load);
            prop_assert_eq!(l.moved, moved_replicas(&prev[i], &l.phy2log, layout.gpus));
            let max = gpu_loads(&l.phy2log, &now[i], layout.gpus).into_iter().fold(0.0, f64::max);
            prop_assert!((max - l.max_load).abs() <= 1e-9 * max.max(1.0));
        }
        // Slot preservation: an expert that stays on its GPU keeps its slot.
        let slots = layout.slots_per_gpu();
        for (old_row, new_row) in prev.iter().zip(&new) {
            for g in 0..layout.gpus {
                let range = g * slots..(g + 1) * slots;
                let count = |row: &[usize], x: usize| row[range.clone()].iter().filter(|&&e| e == x).count();
                for s in range.clone() {
                    let x = old_row[s];
                    if count(new_row, x) >= count(old_row, x) {
                        prop_assert_eq!(new_row[s], x, "GPU {} slot {}", g, s);
                    }
                }
            }
        }
        let moves = move_plan(&prev, &new, layout.gpus, layout.nodes, 1000);
        prop_assert_eq!(check_moves(&prev, &new, &moves.moves, layout.gpus), Ok(()));
        prop_assert_eq!(check_rounds(&moves), Ok(()));
        prop_assert_eq!(moves.moves.len(), plan.moved());
        // Rounds: as many as the busiest GPU's transfers.
        let mut deg = vec![0usize; 2 * layout.gpus];
        for m in &moves.moves {
            deg[m.src_gpu] += 1;
            deg[layout.gpus + m.dst_gpu] += 1;
        }
        prop_assert_eq!(moves.rounds.len(), deg.into_iter().max().unwrap_or(0));
        // A source is on the destination's node whenever a copy exists there.
        let gpn = layout.gpus / layout.nodes;
        let slots = layout.slots_per_gpu();
        for m in &moves.moves {
            let local = (0..layout.gpus).any(|g| g / gpn == m.dst_gpu / gpn
                && prev[m.layer][g * slots..(g + 1) * slots].contains(&m.expert));
            prop_assert_eq!(m.inter_node, !local);
        }
        let bytes: u64 = moves.rounds.iter().map(|r| r.intra_node_bytes + r.inter_node_bytes).sum();
        prop_assert_eq!(bytes, 1000 * moves.moves.len() as u64);
    }

    #[test]
    fn hysteresis_leaves_balanced_layers_alone((layout, before, now) in case()) {
        let prev = reference_phy2log(&before, &layout);
        let opts = PlannerOptions { min_imbalance: Some(1e12), ..PlannerOptions::default() };
        let plan = rebalance_improved(&now, &layout, Some(&prev), &opts).unwrap();
        prop_assert_eq!(plan.phy2log(), prev);
        prop_assert_eq!(plan.moved(), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Relabelling never keeps fewer replicas in place than the plan as it came, keeps each
    /// GPU's multiset of experts, and moves whole nodes.
    #[test]
    fn relabelling_keeps_more_in_place(
        nodes in 1usize..=3,
        gpn in 1usize..=3,
        slots in 1usize..=3,
        seed in any::<u64>(),
    ) {
        let gpus = nodes * gpn;
        let n = gpus * slots;
        let mut x = seed | 1;
        let mut next = |m: usize| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; (x % m as u64) as usize };
        let experts = n.div_ceil(2);
        let old: Vec<usize> = (0..n).map(|_| next(experts)).collect();
        let new: Vec<usize> = (0..n).map(|_| next(experts)).collect();
        let out = relabel(&new, &old, gpus, nodes);
        prop_assert!(moved_replicas(&old, &out, gpus) <= moved_replicas(&old, &new, gpus));
        let sorted = |row: &[usize], g: usize| { let mut v = row[g * slots..(g + 1) * slots].to_vec(); v.sort_unstable(); v };
        let mut a: Vec<Vec<usize>> = (0..gpus).map(|g| sorted(&new, g)).collect();
        let mut b: Vec<Vec<usize>> = (0..gpus).map(|g| sorted(&out, g)).collect();
        // GPUs of a new node land together on one old node.
        for node in 0..nodes {
            let group: Vec<Vec<usize>> = (0..gpn).map(|i| sorted(&new, node * gpn + i)).collect();
            let target = (0..gpus).find(|&g| b[g] == group[0]).map(|g| g / gpn);
            prop_assert!(target.is_some());
        }
        a.sort();
        b.sort();
        prop_assert_eq!(a, b);
    }
}

#[test]
fn a_placement_within_tolerance_is_kept() {
    let layout = Layout {
        experts: 8,
        replicas: 8,
        groups: 1,
        nodes: 1,
        gpus: 4,
    };
    let load = vec![vec![1.0; 8]];
    let prev = vec![vec![3, 2, 1, 0, 7, 6, 5, 4]];
    let plan = rebalance_improved(&load, &layout, Some(&prev), &PlannerOptions::default()).unwrap();
    assert_eq!(plan.layers[0].decision, Decision::Kept);
    assert_eq!(plan.phy2log(), prev);
}

#[test]
fn duplicates_of_the_previous_plan_are_repaired() {
    // Expert 0 twice on GPU 0 with two GPUs: the improved policy must split them.
    let layout = Layout {
        experts: 3,
        replicas: 4,
        groups: 1,
        nodes: 1,
        gpus: 2,
    };
    let load = vec![vec![10.0, 1.0, 1.0]];
    let prev = vec![vec![0, 0, 1, 2]];
    let opts = PlannerOptions {
        tolerance: 10.0,
        ..PlannerOptions::default()
    };
    let plan = rebalance_improved(&load, &layout, Some(&prev), &opts).unwrap();
    assert_eq!(check_policy(&plan.phy2log(), &layout), Ok(()));
    assert!(plan.moved() >= 1);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let layout = Layout {
        experts: 4,
        replicas: 4,
        groups: 1,
        nodes: 1,
        gpus: 2,
    };
    let opts = PlannerOptions::default();
    assert!(rebalance_improved(&[vec![1.0; 3]], &layout, None, &opts).is_err());
    assert!(rebalance_improved(&[vec![f64::NAN; 4]], &layout, None, &opts).is_err());
    let prev = vec![vec![0, 1, 2, 2]];
    assert!(rebalance_improved(&[vec![1.0; 4]], &layout, Some(&prev), &opts).is_err());
    let bad = Layout { gpus: 3, ..layout };
    assert!(rebalance_improved(&[vec![1.0; 4]], &bad, None, &opts).is_err());
    let neg = PlannerOptions {
        tolerance: -1.0,
        ..opts
    };
    assert!(rebalance_improved(&[vec![1.0; 4]], &layout, None, &neg).is_err());
}

#[test]
fn size_errors_read_like_the_reference_policy() {
    let load = vec![vec![1.0; 12], vec![2.0; 12]];
    let m = LoadMatrix::from_rows(load.clone()).unwrap();
    // (replicas, groups, nodes, gpus)
    for (replicas, groups, nodes, gpus) in [
        (15, 4, 2, 8),
        (8, 4, 2, 8),
        (16, 5, 2, 8),
        (16, 4, 3, 8),
        (0, 4, 2, 8),
        (16, 4, 2, 0),
    ] {
        let layout = Layout {
            experts: 12,
            replicas,
            groups,
            nodes,
            gpus,
        };
        let ours = rebalance_improved(&load, &layout, None, &PlannerOptions::default())
            .expect_err("invalid sizes");
        let reference = rebalance_experts(&m, replicas, groups, nodes, gpus).expect_err("invalid");
        assert_eq!(ours.to_string(), reference.to_string());
    }
    let bad = vec![vec![1.0, -2.0, 3.0, 4.0]];
    let layout = Layout {
        experts: 4,
        replicas: 4,
        groups: 1,
        nodes: 1,
        gpus: 2,
    };
    let ours = rebalance_improved(&bad, &layout, None, &PlannerOptions::default()).unwrap_err();
    let m = LoadMatrix::from_rows(bad).unwrap();
    assert_eq!(
        ours.to_string(),
        rebalance_experts(&m, 4, 1, 1, 2).unwrap_err().to_string()
    );
}
