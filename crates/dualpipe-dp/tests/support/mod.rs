//! Runs a data-parallel group on threads, one exchange per worker.

#![allow(dead_code)]

use std::thread;

use dualpipe_dp::{
    BucketLayout, ChannelTransport, DpError, ExchangeConfig, ExchangeStats, GradExchange,
    GradFloat, GradTransport, LinkTransport, Reordering,
};
use dualpipe_runtime::transport::endpoint::ChannelLink;

/// A deterministic gradient value in about [-1, 1] for (seed, step, worker, index).
pub fn value(seed: u64, step: u64, worker: usize, index: usize) -> f64 {
    let mut z = seed
        ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (worker as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ (index as u64).wrapping_mul(0x1656_67b1_9e37_79f9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Worker `worker`'s gradients of `bucket` at `step` (the values of a flat index space).
pub fn grads<T: GradFloat>(
    layout: &BucketLayout,
    step: u64,
    worker: usize,
    bucket: usize,
) -> Vec<T> {
    let offset: usize = (0..bucket).map(|b| layout.len(b)).sum();
    (0..layout.len(bucket))
        .map(|i| T::from_f64(value(7, step, worker, offset + i) * (1.0 + (i % 5) as f64)))
        .collect()
}

/// Which transport the group runs on.
#[derive(Clone, Copy, Debug)]
pub enum Net {
    /// In-process channels.
    Channels,
    /// Channels behind the reordering wrapper with this seed.
    Reordered(u64),
    /// The runtime's in-memory `ChannelLink` through `LinkTransport`.
    Link,
}

/// The transports of a group of `d`.
pub fn transports(net: Net, d: usize) -> Vec<Box<dyn GradTransport + Send>> {
    match net {
        Net::Channels => ChannelTransport::group(d)
            .into_iter()
            .map(|t| Box::new(t) as Box<dyn GradTransport + Send>)
            .collect(),
        Net::Reordered(seed) => ChannelTransport::group(d)
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                Box::new(Reordering::new(t, seed * 31 + i as u64)) as Box<dyn GradTransport + Send>
            })
            .collect(),
        Net::Link => ChannelLink::world(d)
            .into_iter()
            .map(|l| Box::new(LinkTransport::whole(l)) as Box<dyn GradTransport + Send>)
            .collect(),
    }
}

/// One worker's results: per step, per bucket, the averaged values; and its totals.
pub struct WorkerRun<T> {
    /// `[step][bucket]`.
    pub results: Vec<Vec<Vec<T>>>,
    /// The exchange's totals.
    pub totals: ExchangeStats,
    /// Messages that arrived before the worker reached their step.
    pub early: u64,
}

/// Runs `steps` steps on a group of `d` workers with gradients from [`grads`] (or `input` if
/// given); worker `w` starts its buckets in a worker-dependent order, with progress calls
/// between.
pub fn run<T: GradFloat>(
    net: Net,
    d: usize,
    config: &ExchangeConfig,
    layout: &BucketLayout,
    steps: u64,
) -> Result<Vec<WorkerRun<T>>, DpError> {
    run_with(net, d, config, layout, steps, grads::<T>)
}

/// A gradient generator: (layout, step, worker, bucket) to the bucket's values.
pub type Gen<T> = fn(&BucketLayout, u64, usize, usize) -> Vec<T>;

/// [`run`] with gradients from `gen`.
pub fn run_with<T: GradFloat>(
    net: Net,
    d: usize,
    config: &ExchangeConfig,
    layout: &BucketLayout,
    steps: u64,
    gen: Gen<T>,
) -> Result<Vec<WorkerRun<T>>, DpError> {
    let handles: Vec<_> = transports(net, d)
        .into_iter()
        .enumerate()
        .map(|(w, transport)| {
            let (config, layout) = (config.clone(), layout.clone());
            thread::spawn(move || -> Result<WorkerRun<T>, DpError> {
                let mut ex = GradExchange::<T, _>::new(config, layout.clone(), 0, transport)?;
                let mut results = Vec::new();
                for step in 0..steps {
                    ex.begin_step(step)?;
                    let mut order: Vec<usize> = (0..layout.buckets()).collect();
                    if w % 2 == 1 {
                        order.reverse();
                    }
                    if w % 3 == 2 {
                        order.rotate_left(layout.buckets() / 2);
                    }
                    for b in order {
                        ex.start_bucket(b, &gen(&layout, step, w, b))?;
                        ex.progress()?;
                    }
                    ex.finish()?;
                    results.push(
                        (0..layout.buckets())
                            .map(|b| ex.averaged(b).to_vec())
                            .collect(),
                    );
                }
                Ok(WorkerRun {
                    results,
                    totals: ex.totals(),
                    early: ex.early_arrivals(),
                })
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("a worker panicked"))
        .collect()
}

/// Bit patterns, to compare results exactly (NaN included).
pub fn bits<T: GradFloat>(runs: &[WorkerRun<T>]) -> Vec<Vec<Vec<Vec<u64>>>> {
    runs.iter()
        .map(|r| {
            r.results
                .iter()
                .map(|s| {
                    s.iter()
                        .map(|b| b.iter().map(|v| v.to_f64().to_bits()).collect())
                        .collect()
                })
                .collect()
        })
        .collect()
}
