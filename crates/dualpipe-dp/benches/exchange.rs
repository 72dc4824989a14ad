//! One step of the gradient exchange per compression: 4 worker threads, 1 Mi f32 gradients
//! in 4 buckets (4 MiB per worker), over in-process channels. Measures the exchange's own
//! cost (compression, reduction, decoding, channel moves); on a real network the bytes saved
//! are what matters (see the byte counts in docs/distributed.md).
//!
//! `cargo bench -p dualpipe-dp --bench exchange` (about 20 s).

use std::thread;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use dualpipe_dp::{BucketLayout, ChannelTransport, Compression, ExchangeConfig, GradExchange};

const WORKERS: usize = 4;
const VALUES: usize = 1 << 20;

fn one_step(config: &ExchangeConfig, layout: &BucketLayout, grads: &[Vec<f32>]) {
    let handles: Vec<_> = ChannelTransport::group(WORKERS)
        .into_iter()
        .zip(grads.iter().cloned())
        .map(|(t, g)| {
            let (config, layout) = (config.clone(), layout.clone());
            thread::spawn(move || {
                let mut ex = GradExchange::<f32, _>::new(config, layout.clone(), 0, t).unwrap();
                ex.begin_step(0).unwrap();
                let mut at = 0;
                for b in 0..layout.buckets() {
                    let n = layout.len(b);
                    ex.start_bucket(b, &g[at..at + n]).unwrap();
                    at += n;
                }
                ex.finish().unwrap();
                ex.averaged(0)[0]
            })
        })
        .collect();
    for h in handles {
        std::hint::black_box(h.join().unwrap());
    }
}

fn bench(c: &mut Criterion) {
    let layout = BucketLayout::new(&[VALUES / 4; 4], VALUES, 4).unwrap();
    let grads: Vec<Vec<f32>> = (0..WORKERS)
        .map(|w| {
            (0..VALUES)
                .map(|i| ((i * 7 + w * 13) % 1000) as f32 * 1e-3 - 0.5)
                .collect()
        })
        .collect();
    let mut group = c.benchmark_group("exchange_4x1Mi_f32");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_millis(500));
    for compression in Compression::ALL {
        let config = ExchangeConfig {
            compression,
            ..ExchangeConfig::default()
        };
        group.bench_function(compression.name(), |b| {
            b.iter(|| one_step(&config, &layout, &grads))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
