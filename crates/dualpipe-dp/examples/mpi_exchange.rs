//! The gradient exchange between MPI processes, checked against the same group on threads.
//!
//! `mpiexec -n 4 target/debug/examples/mpi_exchange` (built with `--features mpi`; run by
//! `scripts/dp_mpi_test.sh`). Every process runs two groups over `LinkTransport`: the whole
//! world, and its half of the world (even or odd ranks: a data-parallel group inside a larger
//! grid, over its own communicator). For every compression it exchanges 3 steps of gradients
//! that every process can compute for every worker, then runs the same group on threads in
//! this process over `ChannelTransport` and requires its own results to be bit-identical.
//! Then the uncompressed exchange on MPI's own all-reduce (`NativeExchange` over the world's
//! `MpiSum`) against the same threads: bit-identical for two processes (IEEE addition
//! commutes), within 1e-6 of the largest value for more (MPI adds in its own order; the
//! line says which).
//! Prints one line per check and exits 1 if any differs.

use std::process::ExitCode;
use std::thread;

use dualpipe_dp::{
    BucketExchange, BucketLayout, ChannelTransport, Compression, DpError, ExchangeConfig,
    GradExchange, GradTransport, LinkTransport, NativeExchange, Rounding,
};
use dualpipe_runtime::transport::mpi::MpiWorld;

const STEPS: u64 = 3;

/// A worker's results as bit patterns, `[step][bucket][value]`.
type Bits = Vec<Vec<Vec<u32>>>;

fn grad(step: u64, worker: usize, bucket: usize, i: usize) -> f32 {
    let x =
        (step as f32 + 1.0) * 0.37 + worker as f32 * 1.91 + bucket as f32 * 0.11 + i as f32 * 0.013;
    x.sin() * (1.0 + (i % 7) as f32)
}

/// This worker's results, `[step][bucket]` as bit patterns, and its bytes sent.
fn exchange<X: GradTransport>(
    transport: X,
    config: &ExchangeConfig,
    layout: &BucketLayout,
) -> Result<(Bits, u64), DpError> {
    let worker = transport.rank();
    let mut ex = GradExchange::<f32, _>::new(config.clone(), layout.clone(), 0, transport)?;
    steps(&mut ex, worker, layout)
}

/// [`STEPS`] steps of worker `worker` on `ex`: its results and its bytes sent.
fn steps(
    ex: &mut dyn BucketExchange<f32>,
    worker: usize,
    layout: &BucketLayout,
) -> Result<(Bits, u64), DpError> {
    let mut out = Vec::new();
    for step in 0..STEPS {
        ex.begin_step(step)?;
        for b in (0..layout.buckets()).rev() {
            let g: Vec<f32> = (0..layout.len(b))
                .map(|i| grad(step, worker, b, i))
                .collect();
            ex.start_bucket(b, &g)?;
        }
        ex.finish()?;
        out.push(
            (0..layout.buckets())
                .map(|b| ex.averaged(b).iter().map(|v| v.to_bits()).collect())
                .collect(),
        );
    }
    Ok((out, ex.totals().grad_bytes_sent))
}

/// The same group on threads; the results of worker `worker`.
fn on_threads(
    size: usize,
    worker: usize,
    config: &ExchangeConfig,
    layout: &BucketLayout,
) -> Result<Bits, DpError> {
    let handles: Vec<_> = ChannelTransport::group(size)
        .into_iter()
        .map(|t| {
            let (config, layout) = (config.clone(), layout.clone());
            thread::spawn(move || exchange(t, &config, &layout))
        })
        .collect();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.join().expect("a thread panicked")?.0);
    }
    Ok(results.swap_remove(worker))
}

fn main() -> ExitCode {
    let world = match MpiWorld::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("mpi_exchange: {e}");
            return ExitCode::from(2);
        }
    };
    let (rank, size) = (world.info().rank, world.info().world_size);
    let layout = BucketLayout::new(&[700, 33, 1000, 5, 260], 2048, 4).expect("layout");
    let mut failed = false;
    for compression in Compression::ALL {
        let config = ExchangeConfig {
            compression,
            chunk_values: 64,
            rounding: Rounding::Stochastic { seed: 5 },
            ..ExchangeConfig::default()
        };
        // Both links are created by every rank, in the same order (duplicating a communicator
        // is collective); each rank keeps the one of its half.
        let whole = world.link();
        let halves = [world.link(), world.link()];
        let members: Vec<usize> = (rank % 2..size).step_by(2).collect();
        let [even, odd] = halves;
        let half = if rank % 2 == 0 { even } else { odd };
        let groups = [
            ("whole world", LinkTransport::whole(whole)),
            (
                "half",
                LinkTransport::new(half, members.clone()).expect("members"),
            ),
        ];
        for (name, transport) in groups {
            let (group_rank, group_size) = (transport.rank(), transport.size());
            let got = exchange(transport, &config, &layout);
            let expected = on_threads(group_size, group_rank, &config, &layout);
            match (got, expected) {
                (Ok((got, sent)), Ok(expected)) if got == expected => println!(
                    "rank {rank}: {compression} over the {name} ({group_size} workers): \
                     bit-identical to threads, {sent} bytes sent"
                ),
                (Ok(_), Ok(_)) => {
                    println!("rank {rank}: {compression} over the {name}: DIFFERS from threads");
                    failed = true;
                }
                (Err(e), _) | (_, Err(e)) => {
                    println!("rank {rank}: {compression} over the {name}: error: {e}");
                    failed = true;
                }
            }
        }
    }
    // MPI's own all-reduce over the whole world, uncompressed.
    let config = ExchangeConfig::default();
    let native = NativeExchange::<f32>::new(
        config.clone(),
        layout.clone(),
        0,
        Box::new(world.split_sum(0)),
    )
    .and_then(|mut ex| steps(&mut ex, rank, &layout));
    let expected = on_threads(size, rank, &config, &layout);
    let name = format!("rank {rank}: none over MPI's all-reduce ({size} workers)");
    match (native, expected) {
        (Ok((got, _)), Ok(expected)) if got == expected => {
            println!("{name}: bit-identical to threads")
        }
        (Ok((got, _)), Ok(expected)) => {
            // The largest difference, relative to the largest value (values near zero
            // after cancellation have no meaningful relative error of their own).
            let value = |b: &u32| f64::from(f32::from_bits(*b));
            let values = || expected.iter().flatten().flatten().map(value);
            let largest = values().map(f64::abs).fold(0.0, f64::max);
            let worst = got
                .iter()
                .flatten()
                .flatten()
                .map(value)
                .zip(values())
                .map(|(g, e)| (g - e).abs() / largest)
                .fold(0.0, f64::max);
            if size > 2 && worst <= 1e-6 {
                println!("{name}: within {worst:.1e} relative of threads (MPI's order)");
            } else {
                println!("{name}: DIFFERS from threads by {worst:.1e} relative");
                failed = true;
            }
        }
        (Err(e), _) | (_, Err(e)) => {
            println!("{name}: error: {e}");
            failed = true;
        }
    }
    drop(world);
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
