//! Generate + lower + validate at scale: DualPipe and DualPipeV with 64 ranks and 1024
//! micro-batches (goal: under 50 ms each), and 1F1B for comparison. Each stage is also timed on
//! its own. For scale: torch's `ScheduleDualPipeV` constructor takes about 69 s for the same
//! configuration.

// criterion_group! defines an undocumented public function; the crate's missing_docs lint
// (set in Cargo.toml, so it reaches every target) is for the library.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use dualpipe_schedule::{generate, lower, validate, ScheduleKind};

const RANKS: usize = 64;
const MICRO_BATCHES: usize = 1024;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("schedule_64x1024");
    group.sample_size(20);
    for kind in [
        ScheduleKind::DualPipe,
        ScheduleKind::DualPipeV,
        ScheduleKind::OneFOneB,
    ] {
        let Ok(compute) = generate(kind, RANKS, MICRO_BATCHES, 1) else {
            eprintln!("{kind} is not available; skipped");
            continue;
        };
        group.bench_function(format!("{kind}/generate+lower+validate"), |b| {
            b.iter(|| {
                let s = lower(&generate(kind, RANKS, MICRO_BATCHES, 1).unwrap());
                validate(&s).unwrap();
                black_box(s)
            })
        });
        group.bench_function(format!("{kind}/generate"), |b| {
            b.iter(|| black_box(generate(kind, RANKS, MICRO_BATCHES, 1).unwrap()))
        });
        group.bench_function(format!("{kind}/lower"), |b| {
            b.iter(|| black_box(lower(&compute)))
        });
        let lowered = lower(&compute);
        group.bench_function(format!("{kind}/validate"), |b| {
            b.iter(|| validate(black_box(&lowered)).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
