//! Invariants of simulated timelines over random configurations of every generator.

use std::collections::HashMap;

use dualpipe_schedule::{build, Chunk, Op, ScheduleKind};
use dualpipe_sim::{metrics, simulate, CommCost, CostModel, MessageKind};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn timelines_respect_streams_dependencies_and_costs(
        kind_index in 0usize..ScheduleKind::ALL.len(),
        ranks in 1usize..7,
        mbs in 1usize..17,
        f in 0.2f64..2.0,
        b_extra in 0.0f64..2.0,
        w_frac in 0.0f64..1.0,
        fb_frac in 0.0f64..1.0,
        latency in 0.0f64..0.3,
        blocking in any::<bool>(),
    ) {
        let kind = ScheduleKind::ALL[kind_index];
        let v = if kind == ScheduleKind::Interleaved { 2 } else { 1 };
        let Ok(schedule) = build(kind, ranks, mbs, v) else {
            return Ok(()); // the kind rejects this size
        };
        let b = f + b_extra;
        let w = b * w_frac;
        let fb = b.max(f) + fb_frac * f.min(b);
        let cost = CostModel::uniform(f, b, w, fb).with_comm(CommCost {
            latency,
            bandwidth: None,
            message_bytes: 0,
            blocking,
        });
        let t = simulate(&schedule, &cost).unwrap();
        let m = metrics(&t, &schedule.placement);
        // One compute stream per rank: intervals in order, no overlap, durations from the model.
        let mut forward_start: HashMap<Chunk, f64> = HashMap::new();
        let mut backward_start: HashMap<Chunk, f64> = HashMap::new();
        for (r, intervals) in t.compute.iter().enumerate() {
            let program: Vec<Op> = schedule.programs[r].iter().copied().filter(Op::is_compute).collect();
            prop_assert_eq!(intervals.iter().map(|i| i.op).collect::<Vec<_>>(), program);
            let mut busy = 0.0;
            for (k, iv) in intervals.iter().enumerate() {
                prop_assert!((iv.end - iv.start - cost.duration(&iv.op)).abs() < 1e-9);
                if k > 0 {
                    prop_assert!(intervals[k - 1].end <= iv.start + 1e-9);
                }
                busy += iv.end - iv.start;
                match iv.op {
                    Op::F(c) => { forward_start.insert(c, iv.start); }
                    Op::B(c) | Op::I(c) => { backward_start.insert(c, iv.start); }
                    Op::FB { f, b } => {
                        forward_start.insert(f, iv.start);
                        backward_start.insert(b, iv.start);
                    }
                    _ => {}
                }
            }
            prop_assert!((m.busy_per_rank[r] - busy).abs() < 1e-9);
            prop_assert!(m.makespan >= busy - 1e-9);
        }
        // Every message takes its latency and arrives before its consumer starts.
        for msg in &t.messages {
            prop_assert!((msg.end - msg.start - latency).abs() < 1e-9);
            let consumer = match msg.kind {
                MessageKind::Forward => forward_start[&msg.dst_chunk],
                MessageKind::Backward => backward_start[&msg.dst_chunk],
            };
            prop_assert!(consumer >= msg.end - 1e-9, "{:?} consumed at {} before arrival {}", msg, consumer, msg.end);
        }
        prop_assert!(m.bubble_ratio >= 0.0 && m.bubble_ratio < 1.0);
        prop_assert_eq!(m.parameter_copies_per_rank, schedule.placement.parameter_copies());
        // Deterministic.
        prop_assert_eq!(simulate(&schedule, &cost).unwrap(), t);
    }
}
