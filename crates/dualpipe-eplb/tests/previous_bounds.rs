//! The migration-aware path (`--previous`) is bounded on shapes that used to hang it: a GPU
//! with tens of thousands of slots (the moved-replica count, the move plan and its rounds were
//! quadratic in slots per GPU) and a domain of thousands of GPUs (the relabelling matched GPUs
//! by an `n^3` Hungarian method). Each plan here is made, checked valid, and its move plan
//! checked against both placements.

use dualpipe_eplb::improved::PlannerOptions;
use dualpipe_eplb::plan_check::{check_moves, check_policy, check_rounds};
use dualpipe_eplb::{plan, Layout, LoadMatrix, Planner, PreviousPlacement};

/// Loads with a few hot experts, different for each `seed`.
fn loads(layers: usize, experts: usize, seed: u64) -> LoadMatrix {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data = (0..layers * experts)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            (4.0 * u).exp()
        })
        .collect();
    LoadMatrix::from_flat(layers, experts, data).expect("non-empty shape")
}

/// Plans `layout` fresh on one set of loads, then from that plan on another, and checks the
/// second plan and its moves.
fn replan(layout: &Layout) {
    let planner = Planner::Improved(PlannerOptions::default());
    let before = loads(1, layout.experts, 1);
    let first = plan(&before, layout, &planner, None, 0).expect("a valid shape");
    let old = first.plan.phy2log_rows().expect("expert indices");
    let previous = PreviousPlacement::from_rows(old.clone());
    let now = loads(1, layout.experts, 2);
    let second = plan(&now, layout, &planner, Some(&previous), 1 << 20).expect("a valid shape");
    let new = second.plan.phy2log_rows().expect("expert indices");
    assert_eq!(check_policy(&new, layout), Ok(()));
    let moves = second
        .moves
        .expect("a move plan from the previous placement");
    assert_eq!(
        check_moves(&old, &new, &moves.moves, layout.gpus),
        Ok(()),
        "{layout}"
    );
    assert_eq!(check_rounds(&moves), Ok(()), "{layout}");
}

#[test]
fn many_slots_per_gpu_are_planned_from_a_previous_placement() {
    // 16,384 slots per GPU.
    replan(&Layout {
        experts: 8,
        replicas: 65_536,
        groups: 2,
        nodes: 2,
        gpus: 4,
    });
}

#[test]
fn thousands_of_gpus_in_one_domain_are_planned_from_a_previous_placement() {
    // 2,048 GPUs in one node: matching them would be 2^33 steps of the Hungarian method.
    replan(&Layout {
        experts: 2_048,
        replicas: 4_096,
        groups: 1,
        nodes: 1,
        gpus: 2_048,
    });
}
