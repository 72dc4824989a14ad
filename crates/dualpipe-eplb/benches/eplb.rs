//! Planning speed on DeepSeek-V3-like shapes.
//!
//! - `hierarchical_58x256_p288_n4_r32`: 58 layers, 256 experts, 288 replicas, 8 groups,
//!   4 nodes, 32 GPUs (hierarchical). Goal: under 1 ms on one core.
//! - `global_58x256_p320_r64`: the same model on 64 GPUs with 320 replicas and one node (the
//!   reference also runs global when the groups do not divide over the nodes). Goal: under
//!   1 ms on one core.
//! - `hierarchical_61x1024_p1152_n8_r128`: 61 layers, 1024 experts, 1152 replicas, 16 groups,
//!   8 nodes, 128 GPUs; parallel over layers.
//!
//! Loads are drawn from a fixed-seed log-normal-like generator, so runs are comparable.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use dualpipe_eplb::{rebalance_experts_with_policy, LoadMatrix, Policy};

/// Deterministic skewed loads (splitmix64 -> exp of a sum of uniforms).
fn loads(layers: usize, experts: usize, seed: u64) -> LoadMatrix {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let data = (0..layers * experts)
        .map(|_| {
            let g: f64 = (0..4).map(|_| next()).sum::<f64>() - 2.0;
            (1.5 * g).exp() * 100.0
        })
        .collect();
    LoadMatrix::from_flat(layers, experts, data).expect("non-empty shape")
}

struct Case {
    name: &'static str,
    layers: usize,
    experts: usize,
    replicas: usize,
    groups: usize,
    nodes: usize,
    gpus: usize,
    policy: Policy,
}

const CASES: [Case; 3] = [
    Case {
        name: "hierarchical_58x256_p288_n4_r32",
        layers: 58,
        experts: 256,
        replicas: 288,
        groups: 8,
        nodes: 4,
        gpus: 32,
        policy: Policy::Hierarchical,
    },
    Case {
        name: "global_58x256_p320_r64",
        layers: 58,
        experts: 256,
        replicas: 320,
        groups: 8,
        nodes: 1,
        gpus: 64,
        policy: Policy::Global,
    },
    Case {
        name: "hierarchical_61x1024_p1152_n8_r128",
        layers: 61,
        experts: 1024,
        replicas: 1152,
        groups: 16,
        nodes: 8,
        gpus: 128,
        policy: Policy::Hierarchical,
    },
];

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("rebalance_experts");
    for case in &CASES {
        let w = loads(case.layers, case.experts, 42);
        group.bench_with_input(BenchmarkId::from_parameter(case.name), &w, |b, w| {
            b.iter(|| {
                rebalance_experts_with_policy(
                    w,
                    case.replicas,
                    case.groups,
                    case.nodes,
                    case.gpus,
                    case.policy,
                )
                .expect("valid benchmark shape")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
