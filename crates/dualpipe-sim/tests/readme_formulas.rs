//! The DualPipe README's "Pipeline Bubbles and Memory Usage Comparison" table, checked on the
//! real generators (`dualpipe_schedule::build`) with free communication.
//!
//! Reading of "bubble": the idle time of one rank's compute stream over the step (makespan
//! minus its busy time). 1F1B idles exactly (PP-1)(F+B) on every rank; for ZB1P, DualPipe and
//! DualPipeV the README's value bounds the most idle rank ([`Metrics::bubble_max`]) and is
//! reached by it when W is large enough to fill the cool-down (see docs/simulator.md).

use dualpipe_schedule::{build, ScheduleKind};
use dualpipe_sim::formula::readme_formula;
use dualpipe_sim::{metrics, simulate, CostModel, Metrics};

/// Durations where every term of every formula matters: F != B, W > 0, F&B < F + B.
const COSTS: [(f64, f64, f64, f64); 4] = [
    (1.0, 2.0, 1.0, 2.5),
    (1.0, 2.0, 0.5, 3.0),
    (2.0, 3.0, 1.0, 4.0),
    (1.0, 3.0, 1.5, 3.5),
];

fn simulate_kind(kind: ScheduleKind, ranks: usize, mbs: usize, cost: &CostModel) -> Metrics {
    let s = build(kind, ranks, mbs, 1).unwrap_or_else(|e| panic!("{kind} pp{ranks} mb{mbs}: {e}"));
    let t = simulate(&s, cost).unwrap_or_else(|e| panic!("{kind} pp{ranks} mb{mbs}: {e}"));
    metrics(&t, &s.placement)
}

#[test]
fn one_f_one_b_bubble_and_memory_are_exact() {
    for (ranks, mbs) in [(2, 4), (4, 8), (4, 13), (8, 16), (8, 32)] {
        for (f, b, w, fb) in COSTS {
            let cost = CostModel::uniform(f, b, w, fb);
            let m = simulate_kind(ScheduleKind::OneFOneB, ranks, mbs, &cost);
            let formula = readme_formula(ScheduleKind::OneFOneB, ranks, &cost.compute).unwrap();
            for (r, bubble) in m.bubble_per_rank.iter().enumerate() {
                assert!(
                    (bubble - formula.bubble).abs() < 1e-9,
                    "1f1b pp{ranks} mb{mbs} {:?} rank {r}: bubble {bubble}, README {}",
                    (f, b, w, fb),
                    formula.bubble
                );
            }
            assert_eq!(
                m.peak_activations, formula.activations,
                "1f1b pp{ranks} mb{mbs}"
            );
            assert_eq!(m.peak_activations_per_rank[0], ranks);
            assert_eq!(m.parameter_copies_per_rank, vec![1; ranks]);
        }
    }
}

/// The README's ZB1P row assumes `W <= F` (the zero-bubble papers' `F = W` convention): rank 0
/// runs PP forwards and then waits `(PP-1) I` for the first gradient to come back down the
/// chain of `I`s, so whatever the order its bubble is at least `(PP-1)(B - W)`, which exceeds
/// `(PP-1)(F+B-2W)` exactly when `W > F`. Both sides are checked.
#[test]
fn zb1p_bubble_is_at_most_the_readme_value() {
    for (ranks, mbs) in [(2, 4), (4, 8), (4, 13), (8, 16), (8, 32)] {
        for (f, b, w, fb) in COSTS {
            let cost = CostModel::uniform(f, b, w, fb);
            let m = simulate_kind(ScheduleKind::Zb1p, ranks, mbs, &cost);
            let formula = readme_formula(ScheduleKind::Zb1p, ranks, &cost.compute).unwrap();
            let tag = format!("zb1p pp{ranks} mb{mbs} {:?}", (f, b, w, fb));
            let lower = (ranks - 1) as f64 * (b - w);
            assert!(
                m.bubble_max >= lower - 1e-9,
                "{tag}: {} < {lower}",
                m.bubble_max
            );
            if w == f {
                // F = W: the bound is reached on every rank.
                for bubble in &m.bubble_per_rank {
                    assert!(
                        (bubble - formula.bubble).abs() < 1e-9,
                        "{tag}: {bubble} vs {}",
                        formula.bubble
                    );
                }
            }
            if w <= f {
                assert!(
                    m.bubble_max <= formula.bubble + 1e-9,
                    "{tag}: max bubble {} > README {}",
                    m.bubble_max,
                    formula.bubble
                );
            } else if ranks > 1 {
                assert!(
                    m.bubble_max > formula.bubble,
                    "{tag}: {} <= {}",
                    m.bubble_max,
                    formula.bubble
                );
            }
            assert_eq!(m.peak_activations, formula.activations, "{tag}");
            assert_eq!(m.parameter_copies_per_rank, vec![1; ranks]);
        }
    }
}

#[test]
fn dualpipe_and_dualpipev_meet_the_readme_table() {
    let cases = [
        (
            ScheduleKind::DualPipe,
            vec![(2, 4), (4, 8), (4, 20), (6, 12), (8, 16), (8, 20), (8, 64)],
        ),
        (
            ScheduleKind::DualPipeV,
            vec![(2, 4), (2, 10), (3, 7), (4, 8), (4, 10), (4, 33), (8, 16)],
        ),
    ];
    for (kind, sizes) in cases {
        for (ranks, mbs) in sizes {
            for (f, b, w, fb) in COSTS {
                let cost = CostModel::uniform(f, b, w, fb);
                let m = simulate_kind(kind, ranks, mbs, &cost);
                let formula = readme_formula(kind, ranks, &cost.compute).unwrap();
                let tag = format!(
                    "{kind} ranks {ranks} (PP {}) mb{mbs} {:?}",
                    formula.pp,
                    (f, b, w, fb)
                );
                assert!(
                    m.bubble_max <= formula.bubble + 1e-9,
                    "{tag}: max bubble {} > README {}",
                    m.bubble_max,
                    formula.bubble
                );
                assert_eq!(m.peak_activations, formula.activations, "{tag}");
                assert_eq!(m.parameter_copies_per_rank, vec![2; ranks], "{tag}");
            }
        }
    }
}

/// With W = B/2 and F&B = F + B - W the most idle DualPipe rank reaches the bound exactly, so
/// the check above is tight (a simulator that dropped a term would fail one of them).
#[test]
fn dualpipe_reaches_the_readme_bound_on_its_middle_ranks() {
    for (kind, ranks, mbs) in [
        (ScheduleKind::DualPipe, 8, 20),
        (ScheduleKind::DualPipe, 4, 10),
        (ScheduleKind::DualPipeV, 4, 10),
        (ScheduleKind::DualPipeV, 2, 10),
    ] {
        let cost = CostModel::uniform(1.0, 2.0, 1.0, 2.5);
        let m = simulate_kind(kind, ranks, mbs, &cost);
        let formula = readme_formula(kind, ranks, &cost.compute).unwrap();
        assert!(
            (m.bubble_max - formula.bubble).abs() < 1e-9,
            "{kind} pp{ranks} mb{mbs}: {} vs {}",
            m.bubble_max,
            formula.bubble
        );
    }
}

/// The README's DualPipe bound assumes `F + 3W <= 2B` (true for the zero-bubble papers'
/// convention `F = W = B/2`, where it is tight). Whatever the durations, the middle rank
/// waits `(PP/2-1) F` for its first input and `(PP/2-1)(F&B - B)` in the cool-down, so the
/// most idle rank idles at least (for every duration tried here) `(PP/2-1)(F + F&B - B)`, which exceeds the README's
/// value exactly when `F + 3W > 2B` (e.g. F = B, or W > B/2).
#[test]
fn dualpipe_bubble_lower_bound_explains_where_the_readme_bound_stops() {
    for (kind, ranks, mbs) in [
        (ScheduleKind::DualPipe, 8, 20),
        (ScheduleKind::DualPipe, 6, 24),
        (ScheduleKind::DualPipeV, 4, 10),
    ] {
        for (f, b, w, fb) in [
            (2.0, 2.0, 1.0, 3.0),
            (1.0, 2.0, 1.5, 2.5),
            (1.0, 2.0, 1.0, 2.5),
            (0.5, 2.0, 1.0, 2.5),
            (1.0, 3.0, 1.0, 3.5),
        ] {
            let cost = CostModel::uniform(f, b, w, fb);
            let m = simulate_kind(kind, ranks, mbs, &cost);
            let formula = readme_formula(kind, ranks, &cost.compute).unwrap();
            let k = (formula.pp / 2 - 1) as f64;
            let lower = k * (f + fb - b);
            let tag = format!("{kind} pp{} mb{mbs} {:?}", formula.pp, (f, b, w, fb));
            assert!(
                m.bubble_max >= lower - 1e-9,
                "{tag}: {} < {lower}",
                m.bubble_max
            );
            if f + 3.0 * w > 2.0 * b {
                assert!(
                    m.bubble_max > formula.bubble + 1e-9,
                    "{tag}: {} <= {}",
                    m.bubble_max,
                    formula.bubble
                );
            } else {
                assert!(
                    m.bubble_max <= formula.bubble + 1e-9,
                    "{tag}: {} > {}",
                    m.bubble_max,
                    formula.bubble
                );
            }
        }
    }
}
