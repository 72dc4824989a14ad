//! Predicts the pipeline time of an expert-parallel MoE model from measured compute-only op
//! costs and the all-to-all waits inside them (`scripts/moe_overlap_measure.sh` feeds it a
//! run's `op_seconds` less the all-to-all waits its `expert_waits` measured).
//!
//! ```text
//! cargo run --release -p dualpipe-sim --example moe_overlap -- \
//!     SCHEDULE OVERLAP RANKS MICRO_BATCHES F B W FB FORWARD_WAIT BACKWARD_WAIT HANDOVER \
//!     [PAIR_F PAIR_F_WAIT PAIR_F_HANDOVER PAIR_B PAIR_B_WAIT PAIR_B_HANDOVER]
//! ```
//!
//! `OVERLAP` is 1 (an FB pair hides one chunk's waits behind the other's compute) or 0;
//! `FORWARD_WAIT` and `BACKWARD_WAIT` the seconds a lone forward and a lone input backward
//! wait on their all-to-alls, all together; `HANDOVER` the seconds an overlapped chunk's
//! waits take in all to get the compute back (`ExpertComm::handover`; 0 for none). The six
//! optional values give an overlapped pair's forward and backward chunk as they cost inside
//! the pair: compute, waits and hand-overs (`ExpertComm::pair_chunks`).
//! Prints the simulated pipeline makespan in seconds.

use dualpipe_schedule::{build, ScheduleKind};
use dualpipe_sim::{metrics, simulate, CostModel, ExpertComm, PairChunkCost};

fn fail(msg: String) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 11 && args.len() != 17 {
        fail(format!(
            "give SCHEDULE OVERLAP RANKS MICRO_BATCHES F B W FB FORWARD_WAIT BACKWARD_WAIT \
             HANDOVER (11 values), then optionally PAIR_F PAIR_F_WAIT PAIR_F_HANDOVER PAIR_B \
             PAIR_B_WAIT PAIR_B_HANDOVER (17 in all), got {}",
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
    let mut comm = ExpertComm {
        forward: num(8),
        backward: num(9),
        overlap,
        ..ExpertComm::default()
    }
    .with_handover(num(10));
    if args.len() == 17 {
        let chunk = |i: usize| PairChunkCost {
            compute: num(i),
            wait: num(i + 1),
            handover: num(i + 2),
        };
        comm = comm.with_pair_chunks(chunk(11), chunk(14));
    }
    let cost = CostModel::uniform(f, b, num(6), fb).with_expert_comm(comm);
    if let Err(e) = cost.check() {
        fail(e.to_string());
    }
    let schedule = build(kind, ranks, micro_batches, kind.default_virtual_stages())
        .unwrap_or_else(|e| fail(format!("{kind}: {e}")));
    let timeline = simulate(&schedule, &cost).unwrap_or_else(|e| fail(format!("{kind}: {e}")));
    println!("{:.6}", metrics(&timeline, &schedule.placement).makespan);
}
