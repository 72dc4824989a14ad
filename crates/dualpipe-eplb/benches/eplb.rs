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
//!
//! The `scale` group runs the improved policy and the deepseek policy side by side on the sizes
//! where the improved policy's local search used to run away (issue 11 item 4): 65,536 and
//! 1,048,576 replicas of 4 experts (2 layers, 2 groups, 2 nodes, 4 GPUs), 16,384 experts on
//! 16,384 GPUs (32,768 replicas, one group, one node), DeepSeek-V3's shapes, and single-node
//! domains of 64 and 128 GPUs (`support/shapes.rs`). Goal: improved within about 10x of
//! deepseek. `cargo bench -p dualpipe-eplb --bench eplb -- scale` runs only these;
//! `examples/side_by_side.rs` prints the same comparison as one table, in CPU time.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use dualpipe_eplb::{plan, rebalance_experts_with_policy, Layout, Planner, Policy};

#[path = "support/shapes.rs"]
mod shapes;
use shapes::{loads, SCALE};

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

fn scale(c: &mut Criterion) {
    let mut group = c.benchmark_group("scale");
    group.sample_size(10);
    group.warm_up_time(std::time::Duration::from_millis(500));
    group.measurement_time(std::time::Duration::from_secs(3));
    for shape in &SCALE {
        let w = loads(shape.layers, shape.experts, 42);
        let layout = Layout::of_loads(&w, shape.replicas, shape.groups, shape.nodes, shape.gpus);
        for (arm, planner) in [
            ("deepseek", Planner::Reference(Policy::Auto)),
            ("improved", Planner::default()),
        ] {
            group.bench_with_input(BenchmarkId::new(arm, shape.name), &w, |b, w| {
                b.iter(|| plan(w, &layout, &planner, None, 0).expect("valid benchmark shape"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench, scale);
criterion_main!(benches);
