//! The exchange over groups of threads: exact sums in a fixed order, bit-identical workers,
//! any arrival order, every transport, compression bounds and byte counts.

mod support;

use dualpipe_dp::{BucketLayout, Compression, ExchangeConfig, Reduce, Rounding};
use support::{bits, grads, run, Net};

fn layout() -> BucketLayout {
    // 9 parameters, 1 KiB buckets of f32 (256 values): several buckets, odd sizes.
    BucketLayout::new(&[100, 7, 300, 1, 250, 3, 64, 0, 129], 1024, 4).unwrap()
}

fn config(compression: Compression) -> ExchangeConfig {
    ExchangeConfig {
        compression,
        chunk_values: 32,
        ..ExchangeConfig::default()
    }
}

#[test]
fn uncompressed_means_are_the_fixed_order_sum_for_every_group_size() {
    let layout = layout();
    assert!(layout.buckets() >= 4, "{layout:?}");
    for d in 1..=4 {
        let runs = run::<f64>(Net::Channels, d, &config(Compression::None), &layout, 3).unwrap();
        for (w, r) in runs.iter().enumerate() {
            for step in 0..3u64 {
                for b in 0..layout.buckets() {
                    // The documented order: ((g0 + g1) + g2) + g3, then / D.
                    let mut acc = grads::<f64>(&layout, step, 0, b);
                    for other in 1..d {
                        for (a, v) in acc.iter_mut().zip(grads::<f64>(&layout, step, other, b)) {
                            *a += v;
                        }
                    }
                    acc.iter_mut().for_each(|a| *a /= d as f64);
                    assert_eq!(
                        r.results[step as usize][b], acc,
                        "D {d}, worker {w}, step {step}, bucket {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn two_workers_match_one_worker_with_both_halves_of_the_batch() {
    // D = 2 with mean reduction vs D = 1 that averages the same two "micro-batch" gradients:
    // equal to 1e-12 relative in f64 (here exactly: (a + b) / 2 both ways).
    let layout = layout();
    let two = run::<f64>(Net::Channels, 2, &config(Compression::None), &layout, 2).unwrap();
    for step in 0..2u64 {
        for b in 0..layout.buckets() {
            let a = grads::<f64>(&layout, step, 0, b);
            let c = grads::<f64>(&layout, step, 1, b);
            for (i, v) in two[0].results[step as usize][b].iter().enumerate() {
                let one = (a[i] + c[i]) / 2.0;
                assert!(
                    (v - one).abs() <= 1e-12 * one.abs().max(1e-300),
                    "{v} vs {one}"
                );
            }
        }
    }
}

#[test]
fn the_sum_reduction_skips_the_division() {
    let layout = BucketLayout::from_bucket_lens(&[10]);
    let cfg = ExchangeConfig {
        reduce: Reduce::Sum,
        ..config(Compression::None)
    };
    let runs = run::<f32>(Net::Channels, 3, &cfg, &layout, 1).unwrap();
    let expected: Vec<f32> = (0..10)
        .map(|i| {
            grads::<f32>(&layout, 0, 0, 0)[i]
                + grads::<f32>(&layout, 0, 1, 0)[i]
                + grads::<f32>(&layout, 0, 2, 0)[i]
        })
        .collect();
    assert_eq!(runs[2].results[0][0], expected);
}

#[test]
fn dualpipe_copies_join_the_exchange_and_divide_by_the_replicas() {
    // 2 replicas x 2 stage copies = 4 members, listed replica by replica: the result is
    // ((r0 dir0 + r0 dir1) + r1 dir0) + r1 dir1, over 2.
    let layout = BucketLayout::from_bucket_lens(&[33, 8]);
    let cfg = ExchangeConfig {
        reduce: Reduce::Divide(2),
        ..config(Compression::None)
    };
    let runs = run::<f64>(Net::Channels, 4, &cfg, &layout, 1).unwrap();
    for b in 0..2 {
        let g: Vec<Vec<f64>> = (0..4).map(|w| grads::<f64>(&layout, 0, w, b)).collect();
        let expected: Vec<f64> = (0..layout.len(b))
            .map(|i| (((g[0][i] + g[1][i]) + g[2][i]) + g[3][i]) / 2.0)
            .collect();
        for r in &runs {
            assert_eq!(r.results[0][b], expected);
        }
    }
    let bad = ExchangeConfig {
        reduce: Reduce::Divide(0),
        ..cfg
    };
    assert!(run::<f64>(Net::Channels, 2, &bad, &layout, 1).is_err());
}

#[test]
fn every_worker_ends_bit_identical_for_every_compression() {
    let layout = layout();
    for c in Compression::ALL {
        for d in [2, 3, 4] {
            let runs = run::<f32>(Net::Channels, d, &config(c), &layout, 3).unwrap();
            let b = bits(&runs);
            for w in 1..d {
                assert_eq!(b[w], b[0], "{c}, D {d}, worker {w}");
            }
        }
    }
}

#[test]
fn delayed_and_reordered_messages_give_bit_identical_results() {
    let layout = layout();
    for c in Compression::ALL {
        let mut cfg = config(c);
        if c == Compression::Int8 {
            cfg.rounding = Rounding::Stochastic { seed: 11 };
        }
        let in_order = bits(&run::<f32>(Net::Channels, 3, &cfg, &layout, 4).unwrap());
        let mut early = 0;
        for seed in 0..4 {
            let runs = run::<f32>(Net::Reordered(seed), 3, &cfg, &layout, 4).unwrap();
            early += runs.iter().map(|r| r.early).sum::<u64>();
            assert_eq!(bits(&runs), in_order, "{c}, seed {seed}");
        }
        // The scrambling really delivered messages of a step to workers still in the one before.
        println!("{c}: {early} early arrivals over 4 seeded runs");
        assert!(early > 0, "{c}: no message ever arrived early");
    }
}

#[test]
fn the_link_transport_gives_the_same_results_and_counts_headers() {
    let layout = layout();
    for c in [Compression::None, Compression::OneBit] {
        let channels = run::<f64>(Net::Channels, 4, &config(c), &layout, 2).unwrap();
        let link = run::<f64>(Net::Link, 4, &config(c), &layout, 2).unwrap();
        assert_eq!(bits(&link), bits(&channels), "{c}");
        let (a, b) = (channels[1].totals, link[1].totals);
        assert_eq!(a.grad_bytes_sent, b.grad_bytes_sent);
        assert_eq!(a.messages, b.messages);
        assert_eq!(a.header_bytes_sent, 0);
        assert_eq!(b.header_bytes_sent, 46 * b.messages);
    }
}

/// Max absolute error of every compressed result against the exact mean, relative to the
/// largest magnitude of the mean.
fn worst_error(c: Compression, d: usize, error_feedback: bool) -> f64 {
    let layout = layout();
    let cfg = ExchangeConfig {
        error_feedback,
        ..config(c)
    };
    let exact = run::<f64>(Net::Channels, d, &config(Compression::None), &layout, 1).unwrap();
    let lossy = run::<f64>(Net::Channels, d, &cfg, &layout, 1).unwrap();
    let mut worst = 0.0f64;
    let mut scale = 0.0f64;
    for b in 0..layout.buckets() {
        for (x, y) in exact[0].results[0][b].iter().zip(&lossy[0].results[0][b]) {
            worst = worst.max((x - y).abs());
            scale = scale.max(x.abs());
        }
    }
    worst / scale
}

#[test]
fn each_compression_stays_within_its_error_bound() {
    // Two roundings per value (worker and owner). bf16: 2^-8 relative each; int8: 4.33% of
    // the value each (its logarithmic levels are 2^(1/8) apart); 1bit: no per-value bound beyond (|x| + mean |x|) per rounding, so the result
    // is within 4x the largest magnitude (error feedback repairs it over steps, below).
    assert_eq!(worst_error(Compression::None, 3, true), 0.0);
    let bf16 = worst_error(Compression::Bf16, 3, true);
    assert!(
        bf16 > 0.0 && bf16 <= 2.0 * 2f64.powi(-8) * 5.0,
        "bf16 {bf16}"
    );
    let int8 = worst_error(Compression::Int8, 3, true);
    assert!(int8 > 0.0 && int8 <= 2.0 * 0.0434 * 5.0, "int8 {int8}");
    let onebit = worst_error(Compression::OneBit, 3, true);
    println!("worst error of one step, relative to the largest mean: bf16 {bf16:.2e}, int8 {int8:.2e}, 1bit {onebit:.3}");
    assert!(onebit > 0.0 && onebit <= 4.0, "1bit {onebit}");
}

#[test]
fn warm_up_steps_are_exact_and_compression_starts_after() {
    let layout = layout();
    let cfg = ExchangeConfig {
        compression_warmup: 2,
        ..config(Compression::OneBit)
    };
    let exact = run::<f32>(Net::Channels, 2, &config(Compression::None), &layout, 3).unwrap();
    let warm = run::<f32>(Net::Channels, 2, &cfg, &layout, 3).unwrap();
    assert_eq!(warm[0].results[..2], exact[0].results[..2]);
    assert_ne!(warm[0].results[2], exact[0].results[2]);
}

#[test]
fn byte_counts_meet_the_compression_goals_for_f32_gradients() {
    // One bucket of 1 Mi values (4 MiB of f32) over 4 workers, default chunk of 2048 values.
    let layout = BucketLayout::from_bucket_lens(&[1 << 20]);
    let mut sent = Vec::new();
    for c in Compression::ALL {
        let cfg = ExchangeConfig {
            compression: c,
            ..ExchangeConfig::default()
        };
        let runs = run::<f32>(Net::Channels, 4, &cfg, &layout, 1).unwrap();
        let bytes: u64 = runs.iter().map(|r| r.totals.grad_bytes_sent).sum();
        let plain: u64 = runs.iter().map(|r| r.totals.grad_bytes_uncompressed).sum();
        // Each worker sends 3/4 of the bucket in each half: 2 * 3/4 * 4 MiB.
        assert_eq!(plain, 4 * 2 * 3 * (1 << 20), "{c}");
        sent.push((c, bytes, 1.0 - bytes as f64 / plain as f64));
        println!(
            "{c}: {bytes} bytes sent, {plain} uncompressed, {:.2}% fewer",
            100.0 * (1.0 - bytes as f64 / plain as f64)
        );
    }
    assert_eq!(sent[0].2, 0.0);
    assert!(sent[1].2 >= 0.50, "bf16 {:?}", sent[1]);
    assert!(sent[2].2 >= 0.74, "int8 {:?}", sent[2]);
    assert!(sent[3].2 >= 0.96, "1bit {:?}", sent[3]);
}
