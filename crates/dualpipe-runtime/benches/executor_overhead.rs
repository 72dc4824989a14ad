//! The executor's own cost: one DualPipe step (8 ranks, 20 micro-batches) on stages that do
//! nothing, so the time is thread start-up, message hand-over and bookkeeping alone. Divide by
//! the number of ops in the schedule for the overhead per op.

use criterion::{criterion_group, criterion_main, Criterion};
use dualpipe_runtime::{run_step, ExecOptions, SleepCosts, SleepStage};
use dualpipe_schedule::{build, ScheduleKind};

fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("executor_overhead");
    for (kind, ranks, micro_batches) in [
        (ScheduleKind::DualPipe, 8, 20),
        (ScheduleKind::OneFOneB, 8, 20),
    ] {
        let schedule = build(kind, ranks, micro_batches, 1).expect("schedule builds");
        let free = SleepCosts::from_millis(0.0, 0.0, 0.0, 0.0);
        group.bench_function(format!("{kind}_{ranks}x{micro_batches}"), |b| {
            b.iter(|| {
                let mut stages = SleepStage::ranks_for(&schedule, free);
                run_step(&schedule, &mut stages, &ExecOptions::default()).expect("step runs")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
