//! Every invalid input gets its own error with a message that says what to fix.

use dualpipe_eplb::{
    rebalance_experts, rebalance_experts_with_policy, EplbError, LoadMatrix, Policy,
};

fn loads(layers: usize, experts: usize) -> LoadMatrix {
    LoadMatrix::from_flat(
        layers,
        experts,
        (0..layers * experts)
            .map(|i| (i % 7) as f64 + 1.0)
            .collect(),
    )
    .unwrap()
}

#[test]
fn replicas_not_a_multiple_of_gpus() {
    let e = rebalance_experts(&loads(1, 8), 10, 1, 1, 4).unwrap_err();
    assert!(matches!(
        e,
        EplbError::ReplicasNotMultipleOfGpus {
            replicas: 10,
            gpus: 4
        }
    ));
    assert!(
        e.to_string().contains("multiple of the number of GPUs"),
        "{e}"
    );
}

#[test]
fn gpus_not_a_multiple_of_nodes() {
    let e = rebalance_experts(&loads(1, 8), 12, 2, 4, 6).unwrap_err();
    assert!(matches!(
        e,
        EplbError::GpusNotMultipleOfNodes { gpus: 6, nodes: 4 }
    ));
    assert!(e.to_string().contains("same number of GPUs"), "{e}");
}

#[test]
fn experts_not_a_multiple_of_groups() {
    let e = rebalance_experts(&loads(1, 8), 8, 3, 1, 4).unwrap_err();
    assert!(matches!(
        e,
        EplbError::ExpertsNotMultipleOfGroups {
            experts: 8,
            groups: 3
        }
    ));
    assert!(
        e.to_string()
            .contains("8 experts do not divide evenly into 3 groups"),
        "{e}"
    );
}

#[test]
fn fewer_replicas_than_experts() {
    let e = rebalance_experts(&loads(1, 8), 4, 1, 1, 4).unwrap_err();
    assert!(matches!(
        e,
        EplbError::FewerReplicasThanExperts {
            replicas: 4,
            experts: 8
        }
    ));
    assert!(
        e.to_string().contains("at least one replica per expert"),
        "{e}"
    );
}

#[test]
fn hierarchical_needs_groups_over_nodes() {
    let e = rebalance_experts_with_policy(&loads(1, 12), 12, 3, 2, 4, Policy::Hierarchical)
        .unwrap_err();
    assert!(matches!(
        e,
        EplbError::GroupsNotMultipleOfNodes {
            groups: 3,
            nodes: 2
        }
    ));
    // Auto falls back to global, as the reference does.
    let plan = rebalance_experts(&loads(1, 12), 12, 3, 2, 4).unwrap();
    assert_eq!(plan.policy, Policy::Global);
}

#[test]
fn zero_counts() {
    for (args, name) in [
        ((0, 1, 1, 1), "num_replicas"),
        ((8, 0, 1, 1), "num_groups"),
        ((8, 1, 0, 1), "num_nodes"),
        ((8, 1, 1, 0), "num_gpus"),
    ] {
        let e = rebalance_experts(&loads(1, 8), args.0, args.1, args.2, args.3).unwrap_err();
        assert!(
            matches!(e, EplbError::ZeroCount { name: n } if n == name),
            "{name}: {e}"
        );
    }
}

#[test]
fn bad_load_values() {
    for bad in [-1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut m = loads(2, 4);
        m.as_mut_slice()[6] = bad;
        let e = rebalance_experts(&m, 4, 1, 1, 1).unwrap_err();
        assert!(
            matches!(
                e,
                EplbError::InvalidLoad {
                    layer: 1,
                    expert: 2,
                    ..
                }
            ),
            "{bad}: {e}"
        );
        assert!(e.to_string().contains("finite and non-negative"), "{e}");
    }
    // Above the largest f32 a load would become infinite in the reference's f32 arithmetic.
    let mut m = loads(2, 4);
    m.as_mut_slice()[6] = 1e39;
    let e = rebalance_experts(&m, 4, 1, 1, 1).unwrap_err();
    assert!(
        matches!(
            e,
            EplbError::InvalidLoad {
                layer: 1,
                expert: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("largest f32"), "{e}");
    // So is a layer whose loads add up to more than it.
    let mut m = loads(2, 4);
    m.as_mut_slice()[4] = 3e38;
    m.as_mut_slice()[5] = 3e38;
    let e = rebalance_experts(&m, 4, 1, 1, 1).unwrap_err();
    assert!(
        matches!(e, EplbError::LayerSumTooLarge { layer: 1, .. }),
        "{e}"
    );
    let layout = dualpipe_eplb::Layout::of_loads(&m, 4, 1, 1, 1);
    let improved = dualpipe_eplb::plan(&m, &layout, &Default::default(), None, 0).unwrap_err();
    assert!(matches!(
        improved,
        EplbError::LayerSumTooLarge { layer: 1, .. }
    ));
    // -0.0 is a valid zero.
    let mut m = loads(1, 4);
    m.as_mut_slice()[0] = -0.0;
    assert!(rebalance_experts(&m, 4, 1, 1, 1).is_ok());
}

#[test]
fn sizes_above_the_cap_are_refused_before_planning() {
    // 2^30 replicas of 4 experts: refused by the cap, not by running out of memory.
    let m = loads(1, 4);
    let e = rebalance_experts(&m, 1 << 30, 1, 1, 1).unwrap_err();
    assert!(
        matches!(e, EplbError::TooLarge { name: "num_replicas", cap, .. } if cap == dualpipe_eplb::MAX_SLOTS),
        "{e}"
    );
    // The cap counts every layer's slots.
    let m = loads(64, 4);
    let e = rebalance_experts(&m, 1 << 19, 1, 1, 1).unwrap_err();
    assert!(
        matches!(
            e,
            EplbError::TooLarge {
                name: "layers x num_replicas",
                ..
            }
        ),
        "{e}"
    );
    // Byte totals that would overflow are refused.
    let m = loads(2, 4);
    let layout = dualpipe_eplb::Layout::of_loads(&m, 4, 1, 1, 1);
    let prev = dualpipe_eplb::PreviousPlacement::from_rows(vec![vec![0, 1, 2, 3]; 2]);
    let e =
        dualpipe_eplb::plan(&m, &layout, &Default::default(), Some(&prev), u64::MAX).unwrap_err();
    assert!(
        matches!(e, EplbError::ExpertBytesOverflow { slots: 8, max, .. } if max == u64::MAX / 8),
        "{e}"
    );
}

#[test]
fn ragged_and_empty_matrices() {
    let e = LoadMatrix::from_rows(vec![vec![1.0, 2.0], vec![3.0]]).unwrap_err();
    assert!(matches!(
        e,
        EplbError::RaggedLoads {
            layer: 1,
            len: 1,
            expected: 2
        }
    ));
    assert!(e
        .to_string()
        .contains("every layer must list the same experts"));
    let e = LoadMatrix::from_rows(vec![]).unwrap_err();
    assert!(matches!(e, EplbError::EmptyLoads { layers: 0, .. }));
    let e = LoadMatrix::from_rows(vec![vec![], vec![]]).unwrap_err();
    assert!(matches!(
        e,
        EplbError::EmptyLoads {
            layers: 2,
            experts: 0
        }
    ));
}
