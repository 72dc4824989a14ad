//! Simulator semantics on hand-built schedules (no generator needed).

mod common;

use dualpipe_schedule::{Chunk, Op, Schedule, ScheduleKind, StagePlacement};
use dualpipe_sim::{metrics, simulate, CommCost, CostModel, SimError};
use proptest::prelude::*;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn one_f_one_b_bubble_is_exactly_pp_minus_one_times_f_plus_b() {
    for (ranks, mbs) in [(2, 4), (4, 8), (4, 9), (8, 16), (8, 20)] {
        let s = common::one_f_one_b(ranks, mbs);
        for (f, b) in [(1.0, 2.0), (1.0, 1.0), (1.5, 2.5)] {
            let t = simulate(&s, &CostModel::uniform(f, b, 0.5, f + b)).unwrap();
            let m = metrics(&t, &s.placement);
            for (r, bubble) in m.bubble_per_rank.iter().enumerate() {
                assert!(
                    close(*bubble, (ranks - 1) as f64 * (f + b)),
                    "rank {r} of 1f1b pp{ranks} mb{mbs} F{f} B{b}: bubble {bubble}"
                );
            }
            assert_eq!(m.peak_activations_per_rank[0], ranks);
            assert_eq!(m.parameter_copies_per_rank, vec![1; ranks]);
        }
    }
}

#[test]
fn gpipe_keeps_every_micro_batch_alive() {
    let s = common::gpipe(4, 6);
    let t = simulate(&s, &CostModel::uniform(1.0, 2.0, 1.0, 3.0)).unwrap();
    let m = metrics(&t, &s.placement);
    assert!(close(m.makespan, (6.0 + 3.0) * 3.0));
    assert_eq!(m.peak_activations_per_rank, vec![6; 4]);
}

#[test]
fn latency_delays_the_critical_path_once_per_hop() {
    let s = common::one_f_one_b(4, 1);
    let comm = CommCost {
        latency: 0.25,
        ..CommCost::FREE
    };
    let t = simulate(&s, &CostModel::uniform(1.0, 2.0, 1.0, 3.0).with_comm(comm)).unwrap();
    // Forward down 4 stages and backward up: 4 (F + B) + 2 x 3 hops x latency.
    assert!(close(t.makespan(), 12.0 + 1.5), "{}", t.makespan());
    assert_eq!(t.messages.len(), 6);
    let m = metrics(&t, &s.placement);
    // Rank 0 waits for the gradient: 3 forwards + 4 backwards downstream and 6 hops.
    assert!(close(m.comm_wait_per_rank[0], 3.0 + 6.0 + 1.5));
}

#[test]
fn bandwidth_serialises_messages_on_the_sender_stream() {
    // Rank 0 runs three quick forwards; each 1 s message queues behind the previous one.
    let s = common::gpipe(2, 3);
    let comm = CommCost {
        latency: 0.0,
        bandwidth: Some(1000.0),
        message_bytes: 1000,
        blocking: false,
    };
    let t = simulate(&s, &CostModel::uniform(0.5, 0.5, 0.0, 1.0).with_comm(comm)).unwrap();
    let mut sends: Vec<(f64, f64)> = t
        .messages
        .iter()
        .filter(|m| m.src == 0)
        .map(|m| (m.start, m.end))
        .collect();
    sends.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(sends, vec![(0.5, 1.5), (1.5, 2.5), (2.5, 3.5)]);
    // The compute stream did not wait: forwards back to back.
    let starts: Vec<f64> = t.compute[0].iter().take(3).map(|i| i.start).collect();
    assert_eq!(starts, vec![0.0, 0.5, 1.0]);
}

#[test]
fn blocking_communication_makes_compute_wait_for_its_sends() {
    let s = common::gpipe(2, 3);
    let comm = CommCost {
        latency: 1.0,
        ..CommCost::FREE
    };
    let cost = CostModel::uniform(1.0, 1.0, 0.0, 2.0);
    let free = simulate(&s, &cost.clone().with_comm(comm)).unwrap();
    let blocking = simulate(
        &s,
        &cost.with_comm(CommCost {
            blocking: true,
            ..comm
        }),
    )
    .unwrap();
    let starts = |t: &dualpipe_sim::Timeline| {
        t.compute[0]
            .iter()
            .take(3)
            .map(|i| i.start)
            .collect::<Vec<_>>()
    };
    assert_eq!(starts(&free), vec![0.0, 1.0, 2.0]);
    assert_eq!(starts(&blocking), vec![0.0, 2.0, 4.0]);
    assert!(blocking.makespan() > free.makespan());
}

#[test]
fn same_inputs_give_identical_timelines() {
    let s = common::golden(ScheduleKind::DualPipe, 4, 10).expect("golden dualpipe-pp4-mb10");
    let cost = CostModel::uniform(1.0, 2.0, 1.0, 2.5).with_comm(CommCost {
        latency: 0.1,
        bandwidth: Some(1e9),
        message_bytes: 1 << 20,
        blocking: false,
    });
    assert_eq!(simulate(&s, &cost).unwrap(), simulate(&s, &cost).unwrap());
}

fn two_rank(programs: Vec<Vec<Op>>) -> Schedule {
    Schedule {
        kind: ScheduleKind::OneFOneB,
        ranks: 2,
        micro_batches: 1,
        virtual_stages: 1,
        placement: common::linear_placement(2),
        programs,
    }
}

#[test]
fn unlowered_schedules_are_refused_with_a_hint() {
    let s = two_rank(common::one_f_one_b_compute(2, 1));
    let err = simulate(&s, &CostModel::default()).unwrap_err();
    assert!(matches!(err, SimError::Schedule(_)));
    assert!(
        err.to_string().contains("no RECV_B") && err.to_string().contains("lower"),
        "{err}"
    );
}

#[test]
fn deadlocks_are_reported_not_hung() {
    let c0 = Chunk::new(0, 0, 0);
    let c1 = Chunk::new(0, 1, 0);
    // Rank 1 waits for a gradient before it ever receives the activations it must send back.
    let s = two_rank(vec![
        vec![
            Op::RecvB { chunk: c0, peer: 1 },
            Op::Wait,
            Op::F(c0),
            Op::SendF { chunk: c0, peer: 1 },
            Op::B(c0),
        ],
        vec![
            Op::RecvF { chunk: c1, peer: 0 },
            Op::F(c1),
            Op::B(c1),
            Op::SendB { chunk: c1, peer: 0 },
        ],
    ]);
    let err = simulate(&s, &CostModel::default()).unwrap_err();
    assert!(err.to_string().contains("deadlock"), "{err}");
}

#[test]
fn broken_programs_name_rank_op_and_rule() {
    let c0 = Chunk::new(0, 0, 0);
    let c1 = Chunk::new(0, 1, 0);
    let send_first = two_rank(vec![
        vec![Op::SendF { chunk: c0, peer: 1 }, Op::F(c0)],
        vec![],
    ]);
    let err = simulate(&send_first, &CostModel::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rank 0, op #0") && err.contains("has not run"),
        "{err}"
    );
    let wrong_rank = two_rank(vec![vec![Op::F(c1)], vec![]]);
    let err = simulate(&wrong_rank, &CostModel::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("on rank 1, not here"), "{err}");
    let wrong_peer = two_rank(vec![
        vec![Op::F(c0), Op::SendF { chunk: c0, peer: 0 }],
        vec![],
    ]);
    let err = simulate(&wrong_peer, &CostModel::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("peer 0"), "{err}");
    let w_without_i = two_rank(vec![vec![Op::W(c0)], vec![]]);
    let err = simulate(&w_without_i, &CostModel::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("earlier I"), "{err}");
    let bad_cost = simulate(&w_without_i, &CostModel::uniform(1.0, 2.0, 1.0, -3.0)).unwrap_err();
    assert!(matches!(bad_cost, SimError::Cost(_)));
}

#[test]
fn split_backward_frees_activations_at_w() {
    // One rank, one stage: F0 F1 I0 I1 W0 W1 keeps two alive until the Ws.
    let c = |mb| Chunk::new(0, 0, mb);
    let s = Schedule {
        kind: ScheduleKind::Zb1p,
        ranks: 1,
        micro_batches: 2,
        virtual_stages: 1,
        placement: StagePlacement {
            ranks: 1,
            rank_of: vec![vec![0]],
        },
        programs: vec![vec![
            Op::F(c(0)),
            Op::F(c(1)),
            Op::I(c(0)),
            Op::I(c(1)),
            Op::W(c(0)),
            Op::W(c(1)),
        ]],
    };
    let t = simulate(&s, &CostModel::uniform(1.0, 2.0, 0.5, 3.0)).unwrap();
    let m = metrics(&t, &s.placement);
    assert!(close(m.makespan, 2.0 + 3.0 + 1.0));
    assert_eq!(m.peak_activations, 2);
    assert_eq!(m.bubble_per_rank, vec![0.0]);
}

/// DualPipe and DualPipeV from the golden (reference) programs: the README's table.
#[test]
fn golden_dualpipe_programs_meet_the_readme_formulas() {
    let mut checked = 0;
    for (kind, cases) in [
        (
            ScheduleKind::DualPipe,
            vec![(4, 8), (4, 20), (8, 16), (8, 20), (8, 32)],
        ),
        (
            ScheduleKind::DualPipeV,
            vec![(2, 10), (4, 8), (4, 10), (4, 33)],
        ),
    ] {
        for (ranks, mbs) in cases {
            let s = common::golden(kind, ranks, mbs)
                .unwrap_or_else(|| panic!("golden {kind} pp{ranks} mb{mbs} is missing"));
            for cost in [
                CostModel::uniform(1.0, 2.0, 1.0, 2.5),
                CostModel::uniform(1.0, 2.0, 0.5, 3.0),
                CostModel::uniform(2.0, 3.0, 1.0, 4.0),
            ] {
                let t = simulate(&s, &cost).unwrap();
                let m = metrics(&t, &s.placement);
                let f = dualpipe_sim::formula::readme_formula(kind, ranks, &cost.compute).unwrap();
                assert!(
                    m.bubble_max <= f.bubble + 1e-9,
                    "{kind} pp{ranks} mb{mbs}: {} > {}",
                    m.bubble_max,
                    f.bubble
                );
                assert_eq!(m.peak_activations_per_rank, vec![f.activations; ranks]);
                assert_eq!(m.parameter_copies_per_rank, vec![2; ranks]);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 27);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// 1F1B with free communication: every rank idles exactly (PP-1)(F+B), for any sizes and
    /// durations with B >= F; latency only ever lengthens the step.
    #[test]
    fn one_f_one_b_bubble_holds_for_random_configs(
        ranks in 1usize..7,
        mbs in 1usize..12,
        f in 0.1f64..3.0,
        extra in 0.0f64..3.0,
        latency in 0.0f64..0.5,
    ) {
        let b = f + extra;
        let s = common::one_f_one_b(ranks, mbs);
        let cost = CostModel::uniform(f, b, 0.0, f + b);
        let t = simulate(&s, &cost).unwrap();
        let m = metrics(&t, &s.placement);
        let expected = (ranks - 1) as f64 * (f + b);
        for bubble in &m.bubble_per_rank {
            prop_assert!(close(*bubble, expected), "bubble {} expected {}", bubble, expected);
        }
        prop_assert!(close(m.makespan, (mbs + ranks - 1) as f64 * (f + b)));
        let slow = simulate(&s, &cost.with_comm(CommCost { latency, ..CommCost::FREE })).unwrap();
        prop_assert!(slow.makespan() >= t.makespan() - 1e-9);
        for (r, intervals) in slow.compute.iter().enumerate() {
            for pair in intervals.windows(2) {
                prop_assert!(pair[0].end <= pair[1].start + 1e-12, "rank {} overlaps", r);
            }
        }
    }
}

/// A ZB-H1 order written in the tests (unit-time list scheduling, W deferred into the gaps)
/// meets the README's ZB1P row: bubble (PP-1)(F+B-2W) when F = I = W, peak activations PP.
#[test]
fn hand_built_zb_h1_meets_the_readme_bound() {
    for (ranks, mbs) in [(2, 4), (4, 8), (4, 12), (8, 16), (8, 24)] {
        let s = common::zb_h1(ranks, mbs);
        for (f, b, w) in [(1.0, 2.0, 1.0), (2.0, 4.0, 2.0)] {
            let cost = CostModel::uniform(f, b, w, f + b);
            let t = simulate(&s, &cost).unwrap();
            let m = metrics(&t, &s.placement);
            let readme = (ranks - 1) as f64 * (f + b - 2.0 * w);
            // F = I = W: the bound is reached on every rank.
            for bubble in &m.bubble_per_rank {
                assert!(
                    close(*bubble, readme),
                    "zb-h1 pp{ranks} mb{mbs}: {bubble} vs {readme}"
                );
            }
            assert_eq!(m.peak_activations, ranks, "zb-h1 pp{ranks} mb{mbs}");
        }
    }
}

#[test]
fn costs_whose_sums_overflow_are_an_error_not_an_infinite_makespan() {
    let schedule = dualpipe_schedule::build(ScheduleKind::DualPipe, 4, 8, 1).unwrap();
    let huge = CostModel::uniform(1e308, 1e308, 1e308, 1e308);
    huge.check().expect("every cost alone is finite");
    let err = simulate(&schedule, &huge).unwrap_err();
    assert!(matches!(err, SimError::Overflow(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("overflow") && msg.contains("rank"), "{msg}");
    // Large but summable costs still simulate.
    let large = CostModel::uniform(1e300, 2e300, 1e300, 3e300);
    let t = simulate(&schedule, &large).unwrap();
    assert!(t.makespan().is_finite() && t.makespan() > 1e300);
}
