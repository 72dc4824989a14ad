//! Time of one training step of the MLP model, per schedule.
//!
//! `cargo bench -p dualpipe-train --bench train_step`. Goal: on 2 cores, the default
//! `dualpipe train` run (600 steps, see `TrainConfig::DEFAULT`) stays near a minute, i.e. a
//! default step near 0.25 s; the small configuration here should keep DualPipe's step time
//! within 1.5x of 1F1B's on the same 4 ranks (DualPipe holds two copies of every stage but
//! overlaps both directions).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use dualpipe_schedule::ScheduleKind;
use dualpipe_train::{ModelSection, ScheduleSection};
use dualpipe_train::{TrainConfig, Trainer};

fn small(schedule: ScheduleKind, ranks: usize) -> TrainConfig {
    TrainConfig {
        model: ModelSection {
            hidden: 64,
            layers_per_stage: 1,
            ..TrainConfig::MLP.model
        },
        schedule: ScheduleSection {
            kind: schedule,
            ranks,
            micro_batches: 8,
            micro_batch_size: 32,
            ..TrainConfig::MLP.schedule
        },
        ..TrainConfig::MLP
    }
}

fn train_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("train_step");
    group.sample_size(10);
    for (kind, ranks) in [
        (ScheduleKind::OneFOneB, 4),
        (ScheduleKind::DualPipe, 4),
        (ScheduleKind::DualPipeV, 2),
    ] {
        let mut trainer = Trainer::new(small(kind, ranks)).expect("the bench configuration builds");
        group.bench_function(BenchmarkId::new(kind.name(), ranks), |b| {
            b.iter(|| trainer.step().expect("a training step"))
        });
    }
    group.finish();
}

criterion_group!(benches, train_step);
criterion_main!(benches);
