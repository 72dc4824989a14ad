//! Predicts the pipeline time of an expert-parallel MoE model from measured compute-only op
//! costs and the emulated link of its all-to-alls (`scripts/moe_overlap_measure.sh` feeds it
//! a run's `op_seconds` less the all-to-all waits its `expert_waits` measured).
//!
//! ```text
//! cargo run --release -p dualpipe-sim --example moe_overlap -- \
//!     SCHEDULE OVERLAP RANKS MICRO_BATCHES F B W FB MOE_BLOCKS_PER_STAGE LATENCY HANDOVER
//! ```
//!
//! `OVERLAP` is 1 (an FB pair hides one chunk's waits behind the other's compute) or 0;
//! `HANDOVER` the seconds an overlapped chunk's waits take in all to get the compute back
//! (`ExpertComm::handover`; 0 for none).
//! Prints the simulated pipeline makespan in seconds.

use dualpipe_schedule::{build, ScheduleKind};
use dualpipe_sim::{metrics, simulate, CostModel, ExpertComm};

fn fail(msg: String) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 11 {
        fail(format!(
            "give SCHEDULE OVERLAP RANKS MICRO_BATCHES F B W FB MOE_BLOCKS_PER_STAGE LATENCY \
             HANDOVER (11 values), got {}",
            args.len()
        ));
    }
    let kind: ScheduleKind = args[0]
        .parse()
        .unwrap_or_else(|e| fail(format!("schedule {:?}: {e}", args[0])));
    let num = |i: usize| -> f64 {
        args[i].parse().unwrap_or_else(|_| {
            fail(format!(
                "argument {} ({:?}) is not a number",
                i + 1,
                args[i]
            ))
        })
    };
    let overlap = num(1) != 0.0;
    let (ranks, micro_batches) = (num(2) as usize, num(3) as usize);
    let (f, b) = (num(4), num(5));
    // A measured compute-only F&B can come out below a lone op's (noise); the model needs
    // F&B >= max(F, B).
    let fb = num(7).max(f).max(b);
    let comm = ExpertComm::of_link(num(8) as usize, num(9), None, 0.0, overlap);
    let cost = CostModel::uniform(f, b, num(6), fb).with_expert_comm(comm.with_handover(num(10)));
    let schedule = build(kind, ranks, micro_batches, kind.default_virtual_stages())
        .unwrap_or_else(|e| fail(format!("{kind}: {e}")));
    let timeline = simulate(&schedule, &cost).unwrap_or_else(|e| fail(format!("{kind}: {e}")));
    println!("{:.6}", metrics(&timeline, &schedule.placement).makespan);
}
