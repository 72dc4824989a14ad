//! Message latency and bandwidth of our MPI transport against a bare MPI ping-pong.
//!
//! Run with two processes (feature `mpi`):
//!
//! ```text
//! cargo bench -p dualpipe-runtime --features mpi --bench mpi_pingpong --no-run
//! mpirun -n 2 target/release/deps/mpi_pingpong-<hash>
//! ```
//!
//! For each message size, rank 0 and rank 1 bounce one buffer back and forth, first with bare
//! blocking `MPI_Send` / `MPI_Recv` on a preallocated buffer, then through an
//! [`Endpoint`] on an [`MpiLink`] (stamped header, non-blocking send, matched probe, buffer
//! handed over without a copy). One-way time is half the median round trip over several
//! rounds; bandwidth is the size over the one-way time. Prints a Markdown table.

use std::time::{Duration, Instant};

use dualpipe_runtime::transport::endpoint::Endpoint;
use dualpipe_runtime::transport::mpi::MpiWorld;
use dualpipe_runtime::transport::wire::{Class, Stamp, WireDType, WireData};
use mpi::collective::CommunicatorCollectives;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::Communicator;

const SIZES: [usize; 8] = [
    8,
    1 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
];
const ROUNDS: usize = 7;

fn iterations(size: usize) -> usize {
    ((64 << 20) / size.max(1)).clamp(20, 2000)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` runs every bench binary with `--bench`; without a launcher there is nothing
    // to measure.
    let world = match MpiWorld::init() {
        Ok(world) => world,
        Err(err) => {
            eprintln!("mpi_pingpong: {err}");
            std::process::exit(1);
        }
    };
    let comm = mpi::topology::SimpleCommunicator::world();
    let rank = comm.rank();
    if comm.size() < 2 {
        eprintln!("mpi_pingpong: run it with two processes: mpirun -n 2 <this binary>");
        return;
    }
    let mut endpoint = Endpoint::new(world.link());
    if let Ok(us) = std::env::var("SPIN_US") {
        endpoint.set_spin(Duration::from_micros(us.parse().unwrap()));
    }
    let deadline = || Instant::now() + Duration::from_secs(60);
    if rank == 0 {
        println!("| size | bare MPI one-way | ours one-way | bare MPI bandwidth | ours bandwidth | ours / bare time |");
        println!("|---:|---:|---:|---:|---:|---:|");
    }
    let mut mb = 0usize;
    for size in SIZES {
        let iters = iterations(size);
        let mut bare = Vec::new();
        let mut ours = Vec::new();
        let mut buffer = vec![7u8; size];
        for _ in 0..ROUNDS {
            if rank > 1 {
                continue;
            }
            let peer = comm.process_at_rank(1 - rank);
            // Bare MPI.
            comm.barrier();
            let t0 = Instant::now();
            for _ in 0..iters {
                if rank == 0 {
                    peer.send_with_tag(&buffer[..], 1);
                    peer.receive_into_with_tag(&mut buffer[..], 1);
                } else {
                    peer.receive_into_with_tag(&mut buffer[..], 1);
                    peer.send_with_tag(&buffer[..], 1);
                }
            }
            bare.push(t0.elapsed().as_secs_f64() / iters as f64 / 2.0);
            // Ours.
            comm.barrier();
            let mut payload = Some(WireData {
                dtype: WireDType::U8,
                shape: vec![size],
                bytes: std::mem::take(&mut buffer),
            });
            let t0 = Instant::now();
            for _ in 0..iters {
                let stamp = Stamp::chunk(0, Class::Forward, 0, 1, mb);
                let back = Stamp::chunk(0, Class::Backward, 0, 0, mb);
                mb += 1;
                if rank == 0 {
                    endpoint
                        .send(1, stamp, vec![payload.take().unwrap()])
                        .unwrap();
                    let (_, mut got) = endpoint.take(back, deadline()).unwrap();
                    payload = got.pop();
                } else {
                    let (_, mut got) = endpoint.take(stamp, deadline()).unwrap();
                    endpoint.send(0, back, vec![got.pop().unwrap()]).unwrap();
                }
            }
            ours.push(t0.elapsed().as_secs_f64() / iters as f64 / 2.0);
            endpoint.flush(deadline()).unwrap();
            if rank == 1 {
                // Rank 1's last payload went back to rank 0; make a fresh buffer.
                payload = Some(WireData {
                    dtype: WireDType::U8,
                    shape: vec![size],
                    bytes: vec![7u8; size],
                });
            }
            buffer = payload
                .take()
                .map(|p| p.bytes)
                .unwrap_or_else(|| vec![7u8; size]);
        }
        if rank == 0 {
            let (b, o) = (median(bare), median(ours));
            let gbs = |t: f64| size as f64 / t / 1e9;
            println!(
                "| {} | {:.2} µs | {:.2} µs | {:.2} GB/s | {:.2} GB/s | {:.2} |",
                human(size),
                b * 1e6,
                o * 1e6,
                gbs(b),
                gbs(o),
                o / b
            );
        }
    }
    comm.barrier();
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}
