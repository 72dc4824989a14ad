//! Predicts the step of an expert-parallel MoE model under DualPipe with and without the FB
//! pair's overlap, and under 1F1B, from measured op costs and the emulated link
//! (`scripts/moe_overlap_measure.sh` feeds it a run's `op_seconds`).
//!
//! ```text
//! cargo run --release -p dualpipe-sim --example moe_overlap -- \
//!     RANKS MICRO_BATCHES F B W FB MOE_BLOCKS_PER_STAGE LATENCY
//! ```
//!
//! Prints one line per schedule: its name and the simulated pipeline makespan in seconds.

use dualpipe_schedule::{build, ScheduleKind};
use dualpipe_sim::{metrics, simulate, CostModel, ExpertComm};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 8 {
        eprintln!(
            "error: give RANKS MICRO_BATCHES F B W FB MOE_BLOCKS_PER_STAGE LATENCY (8 numbers), \
             got {}",
            args.len()
        );
        std::process::exit(2);
    }
    let num = |i: usize| -> f64 {
        args[i].parse().unwrap_or_else(|_| {
            eprintln!("error: argument {} ({:?}) is not a number", i + 1, args[i]);
            std::process::exit(2)
        })
    };
    let (ranks, micro_batches) = (num(0) as usize, num(1) as usize);
    let (f, b, w, fb) = (num(2), num(3), num(4), num(5));
    let (blocks, latency) = (num(6) as usize, num(7));
    let base = CostModel::uniform(f, b, w, fb);
    let runs = [
        ("dualpipe_overlap", ScheduleKind::DualPipe, true),
        ("dualpipe_no_overlap", ScheduleKind::DualPipe, false),
        ("1f1b", ScheduleKind::OneFOneB, false),
    ];
    for (name, kind, overlap) in runs {
        let comm = ExpertComm::of_link(blocks, latency, None, 0.0, overlap);
        let cost = base.clone().with_expert_comm(comm);
        let schedule = build(kind, ranks, micro_batches, kind.default_virtual_stages())
            .unwrap_or_else(|e| {
                eprintln!("error: {kind}: {e}");
                std::process::exit(2)
            });
        match simulate(&schedule, &cost) {
            Ok(t) => println!("{name} {:.6}", metrics(&t, &schedule.placement).makespan),
            Err(e) => {
                eprintln!("error: {name}: {e}");
                std::process::exit(2)
            }
        }
    }
}
