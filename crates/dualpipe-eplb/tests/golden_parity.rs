//! Parity with DeepSeek's `eplb.py`: every case in `testdata/golden/eplb` (produced by running
//! the reference) must come out index for index the same, and no layer's hottest GPU may be
//! hotter than in the reference's plan.

use std::path::{Path, PathBuf};

use dualpipe_eplb::{rebalance_experts, ExpertPlan, LoadMatrix, Matrix};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    weight: Vec<Vec<f64>>,
    distribution: String,
    num_replicas: usize,
    num_groups: usize,
    num_nodes: usize,
    num_gpus: usize,
    phy2log: Vec<Vec<i64>>,
    log2phy: Vec<Vec<Vec<i64>>>,
    logcnt: Vec<Vec<i64>>,
}

fn golden_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/golden/eplb"
    ))
}

fn cases() -> Vec<(String, Case)> {
    let dir = golden_dir();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let case: Case =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name(p), case)
        })
        .collect()
}

fn name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// Hottest GPU load of each layer for a placement given as `phy2log` and `logcnt`.
fn hottest(loads: &LoadMatrix, phy2log: &[Vec<i64>], logcnt: &[Vec<i64>], gpus: usize) -> Vec<f64> {
    (0..loads.rows())
        .map(|l| {
            let per_gpu = phy2log[l].len() / gpus;
            let mut g = vec![0.0f64; gpus];
            for (slot, &e) in phy2log[l].iter().enumerate() {
                g[slot / per_gpu] += loads[(l, e as usize)] / logcnt[l][e as usize] as f64;
            }
            g.into_iter().fold(0.0, f64::max)
        })
        .collect()
}

fn plan_for(case: &Case) -> (LoadMatrix, ExpertPlan) {
    let loads = LoadMatrix::from_rows(case.weight.clone()).unwrap();
    let plan = rebalance_experts(
        &loads,
        case.num_replicas,
        case.num_groups,
        case.num_nodes,
        case.num_gpus,
    )
    .unwrap();
    (loads, plan)
}

#[test]
fn golden_cases_match_the_reference_exactly() {
    let cases = cases();
    assert!(
        cases.len() >= 40,
        "expected the 40 golden cases, found {}",
        cases.len()
    );
    let mut mismatched = Vec::new();
    for (name, case) in &cases {
        let (_, plan) = plan_for(case);
        let same = plan.phy2log.to_rows() == case.phy2log
            && plan.log2phy.to_nested() == case.log2phy
            && plan.logcnt.to_rows() == case.logcnt;
        if !same {
            mismatched.push(format!("{name} ({})", case.distribution));
        }
    }
    assert!(
        mismatched.is_empty(),
        "differ from the reference: {mismatched:?}"
    );
}

#[test]
fn hottest_gpu_never_worse_than_the_reference() {
    for (name, case) in cases() {
        let (loads, plan) = plan_for(&case);
        let ours = hottest(
            &loads,
            &plan.phy2log.to_rows(),
            &plan.logcnt.to_rows(),
            case.num_gpus,
        );
        let theirs = hottest(&loads, &case.phy2log, &case.logcnt, case.num_gpus);
        for (layer, (o, t)) in ours.iter().zip(&theirs).enumerate() {
            assert!(
                *o <= *t * (1.0 + 1e-12),
                "{name} layer {layer}: hottest GPU {o} > reference {t}"
            );
        }
        // The stats helper agrees with the hand computation.
        let after: Vec<f64> = plan
            .stats(&loads)
            .unwrap()
            .after
            .layers
            .iter()
            .map(|l| l.max_load)
            .collect();
        for (a, o) in after.iter().zip(&ours) {
            assert!(
                (a - o).abs() <= 1e-9 * o.max(1.0),
                "{name}: stats {a} vs {o}"
            );
        }
    }
}

#[test]
fn plans_are_consistent() {
    for (name, case) in cases() {
        let (_, plan) = plan_for(&case);
        for l in 0..plan.num_layers() {
            // Every expert appears logcnt times, with ranks 0..logcnt, and log2phy inverts phy2log.
            let mut seen: Matrix<i64> = Matrix::filled(1, plan.num_experts(), 0);
            for (slot, &e) in plan.phy2log.row(l).iter().enumerate() {
                let rank = plan.phyrank[(l, slot)] as usize;
                assert_eq!(
                    plan.log2phy.vector(l, e as usize)[rank],
                    slot as i64,
                    "{name}"
                );
                seen.row_mut(0)[e as usize] += 1;
            }
            assert_eq!(seen.row(0), plan.logcnt.row(l), "{name} layer {l}");
        }
    }
}

/// The example from the reference's README: 2 layers x 12 experts, 16 replicas, 4 groups,
/// 2 nodes, 8 GPUs. Expected `phy2log` as printed in that README.
#[test]
fn readme_example() {
    let loads = LoadMatrix::from_rows(vec![
        vec![
            90., 132., 40., 61., 104., 165., 39., 4., 73., 56., 183., 86.,
        ],
        vec![
            20., 107., 104., 64., 19., 197., 187., 157., 172., 86., 16., 27.,
        ],
    ])
    .unwrap();
    let plan = rebalance_experts(&loads, 16, 4, 2, 8).unwrap();
    assert_eq!(
        plan.phy2log.to_rows(),
        vec![
            vec![5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
            vec![7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
        ]
    );
    assert_eq!(plan.policy, dualpipe_eplb::Policy::Hierarchical);
}
