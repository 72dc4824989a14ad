//! Simulating DualPipe at scale: 64 ranks, 1024 micro-batches (goal: under 100 ms).

use criterion::{criterion_group, criterion_main, Criterion};
use dualpipe_schedule::{build, ScheduleKind};
use dualpipe_sim::{metrics, simulate, CommCost, CostModel};

fn bench_simulate(c: &mut Criterion) {
    let cost = CostModel::uniform(1.0, 2.0, 1.0, 2.5);
    let mut group = c.benchmark_group("simulate");
    group.sample_size(10);
    for kind in [ScheduleKind::DualPipe, ScheduleKind::OneFOneB] {
        let schedule = match build(kind, 64, 1024, 1) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("skipping {kind}: {e}");
                continue;
            }
        };
        let ops: usize = schedule.programs.iter().map(Vec::len).sum();
        group.bench_function(
            format!("{kind} 64 ranks x 1024 micro-batches ({ops} ops)"),
            |b| b.iter(|| simulate(&schedule, &cost).expect("simulates")),
        );
        let comm = cost.clone().with_comm(CommCost {
            latency: 0.05,
            bandwidth: Some(1e10),
            message_bytes: 1 << 24,
            blocking: false,
        });
        group.bench_function(format!("{kind} 64 x 1024 with comm, + metrics"), |b| {
            b.iter(|| {
                let t = simulate(&schedule, &comm).expect("simulates");
                metrics(&t, &schedule.placement)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_simulate);
criterion_main!(benches);
