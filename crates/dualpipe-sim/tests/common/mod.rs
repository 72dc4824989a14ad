//! Shared helpers of the integration tests: hand-built schedules, a naive lowering, and a
//! reader for the golden DualPipe/DualPipeV programs (used as oracles only).
#![allow(dead_code)]

use std::path::PathBuf;

use dualpipe_schedule::{Chunk, Op, Schedule, ScheduleKind, StagePlacement};

/// The placement of a single-direction pipeline with one stage per rank.
pub fn linear_placement(ranks: usize) -> StagePlacement {
    StagePlacement {
        ranks,
        rank_of: vec![(0..ranks).collect()],
    }
}

/// DualPipe's placement: rank r runs stage r of direction 0 and stage ranks-1-r of direction 1.
pub fn dualpipe_placement(ranks: usize) -> StagePlacement {
    StagePlacement {
        ranks,
        rank_of: vec![(0..ranks).collect(), (0..ranks).rev().collect()],
    }
}

/// DualPipeV's placement: one pipeline of 2 x ranks stages folded into a V.
pub fn dualpipev_placement(ranks: usize) -> StagePlacement {
    StagePlacement {
        ranks,
        rank_of: vec![(0..2 * ranks)
            .map(|s| if s < ranks { s } else { 2 * ranks - 1 - s })
            .collect()],
    }
}

/// Compute-only 1F1B programs, written out by hand (warm-up forwards, 1F1B, cool-down).
pub fn one_f_one_b_compute(ranks: usize, micro_batches: usize) -> Vec<Vec<Op>> {
    (0..ranks)
        .map(|r| {
            let c = |mb| Chunk::new(0, r, mb);
            let warmup = (ranks - 1 - r).min(micro_batches);
            let mut ops: Vec<Op> = (0..warmup).map(|mb| Op::F(c(mb))).collect();
            for i in 0..micro_batches - warmup {
                ops.push(Op::F(c(warmup + i)));
                ops.push(Op::B(c(i)));
            }
            for i in micro_batches - warmup..micro_batches {
                ops.push(Op::B(c(i)));
            }
            ops
        })
        .collect()
}

/// Compute-only GPipe programs: every forward, then every backward.
pub fn gpipe_compute(ranks: usize, micro_batches: usize) -> Vec<Vec<Op>> {
    (0..ranks)
        .map(|r| {
            let c = |mb| Chunk::new(0, r, mb);
            let mut ops: Vec<Op> = (0..micro_batches).map(|mb| Op::F(c(mb))).collect();
            ops.extend((0..micro_batches).map(|mb| Op::B(c(mb))));
            ops
        })
        .collect()
}

/// A naive lowering: a RECV right before each consumer of a remote input, a SEND right after
/// each producer of an output consumed on another rank.
pub fn lower_naively(placement: &StagePlacement, programs: &[Vec<Op>]) -> Vec<Vec<Op>> {
    let stages = placement.stages();
    let rank = |c: Chunk| placement.rank(c.dir, c.stage);
    programs
        .iter()
        .enumerate()
        .map(|(r, program)| {
            let mut out = Vec::new();
            for &op in program {
                let (fwd, bwd) = match op {
                    Op::F(c) => (Some(c), None),
                    Op::B(c) | Op::I(c) => (None, Some(c)),
                    Op::FB { f, b } => (Some(f), Some(b)),
                    _ => (None, None),
                };
                if let Some(c) = fwd {
                    if c.stage > 0 && rank(Chunk::new(c.dir, c.stage - 1, c.mb)) != r {
                        let peer = rank(Chunk::new(c.dir, c.stage - 1, c.mb));
                        out.push(Op::RecvF { chunk: c, peer });
                    }
                }
                if let Some(c) = bwd {
                    if c.stage + 1 < stages && rank(Chunk::new(c.dir, c.stage + 1, c.mb)) != r {
                        let peer = rank(Chunk::new(c.dir, c.stage + 1, c.mb));
                        out.push(Op::RecvB { chunk: c, peer });
                    }
                }
                out.push(op);
                if let Some(c) = fwd {
                    if c.stage + 1 < stages && rank(Chunk::new(c.dir, c.stage + 1, c.mb)) != r {
                        let peer = rank(Chunk::new(c.dir, c.stage + 1, c.mb));
                        out.push(Op::SendF { chunk: c, peer });
                    }
                }
                if let Some(c) = bwd {
                    if c.stage > 0 && rank(Chunk::new(c.dir, c.stage - 1, c.mb)) != r {
                        let peer = rank(Chunk::new(c.dir, c.stage - 1, c.mb));
                        out.push(Op::SendB { chunk: c, peer });
                    }
                }
            }
            out
        })
        .collect()
}

/// A lowered hand-built 1F1B schedule.
pub fn one_f_one_b(ranks: usize, micro_batches: usize) -> Schedule {
    let placement = linear_placement(ranks);
    let programs = lower_naively(&placement, &one_f_one_b_compute(ranks, micro_batches));
    Schedule {
        kind: ScheduleKind::OneFOneB,
        ranks,
        micro_batches,
        virtual_stages: 1,
        placement,
        programs,
    }
}

/// A lowered hand-built GPipe schedule.
pub fn gpipe(ranks: usize, micro_batches: usize) -> Schedule {
    let placement = linear_placement(ranks);
    let programs = lower_naively(&placement, &gpipe_compute(ranks, micro_batches));
    Schedule {
        kind: ScheduleKind::GPipe,
        ranks,
        micro_batches,
        virtual_stages: 1,
        placement,
        programs,
    }
}

/// Where the golden oracles live (`testdata/golden/dualpipe` in the repository).
pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/dualpipe")
}

fn chunk(v: &serde_json::Value) -> Chunk {
    let get = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0) as usize;
    Chunk::new(get("dir"), get("stage"), get("mb"))
}

/// Reads a golden DualPipe / DualPipeV program file into a schedule (None if absent).
pub fn golden(kind: ScheduleKind, ranks: usize, micro_batches: usize) -> Option<Schedule> {
    let name = format!("{}-pp{ranks}-mb{micro_batches}.json", kind.name());
    let text = std::fs::read_to_string(golden_dir().join(name)).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).expect("golden file is JSON");
    let placement = match kind {
        ScheduleKind::DualPipe => dualpipe_placement(ranks),
        ScheduleKind::DualPipeV => dualpipev_placement(ranks),
        _ => panic!("no golden programs for {kind}"),
    };
    let programs = json["programs"]
        .as_array()
        .expect("programs")
        .iter()
        .map(|p| {
            p.as_array()
                .expect("program")
                .iter()
                .map(|o| {
                    let c = chunk(o);
                    let peer = o.get("peer").and_then(|x| x.as_u64()).unwrap_or(0) as usize;
                    match o["op"].as_str().expect("op") {
                        "F" => Op::F(c),
                        "B" => Op::B(c),
                        "I" => Op::I(c),
                        "W" => Op::W(c),
                        "FB" => Op::FB {
                            f: chunk(&o["f"]),
                            b: chunk(&o["b"]),
                        },
                        "SEND_F" => Op::SendF { chunk: c, peer },
                        "RECV_F" => Op::RecvF { chunk: c, peer },
                        "SEND_B" => Op::SendB { chunk: c, peer },
                        "RECV_B" => Op::RecvB { chunk: c, peer },
                        "WAIT" => Op::Wait,
                        other => panic!("unknown golden op {other}"),
                    }
                })
                .collect()
        })
        .collect();
    Some(Schedule {
        kind,
        ranks,
        micro_batches,
        virtual_stages: 1,
        placement,
        programs,
    })
}

/// Compute-only ZB-H1 programs, written by hand: rank `i` runs `ranks - i` warm-up forwards,
/// then for every micro-batch its `I`, a `W` only when `ranks` activations are alive (1F1B's
/// memory) or no forward is left, then the next forward; the deferred `W`s run at the end.
/// Independent of the generators, to check the simulator against the README's ZB1P row.
pub fn zb_h1_compute(ranks: usize, micro_batches: usize) -> Vec<Vec<Op>> {
    (0..ranks)
        .map(|r| {
            let c = |mb| Chunk::new(0, r, mb);
            let warmup = (ranks - r).min(micro_batches);
            let mut ops: Vec<Op> = (0..warmup).map(|mb| Op::F(c(mb))).collect();
            let (mut next_f, mut next_w) = (warmup, 0);
            for j in 0..micro_batches {
                ops.push(Op::I(c(j)));
                if next_f - next_w == ranks || next_f == micro_batches {
                    ops.push(Op::W(c(next_w)));
                    next_w += 1;
                }
                if next_f < micro_batches {
                    ops.push(Op::F(c(next_f)));
                    next_f += 1;
                }
            }
            ops.extend((next_w..micro_batches).map(|mb| Op::W(c(mb))));
            ops
        })
        .collect()
}

/// A lowered hand-built ZB-H1 schedule.
pub fn zb_h1(ranks: usize, micro_batches: usize) -> Schedule {
    let placement = linear_placement(ranks);
    let programs = lower_naively(&placement, &zb_h1_compute(ranks, micro_batches));
    Schedule {
        kind: ScheduleKind::Zb1p,
        ranks,
        micro_batches,
        virtual_stages: 1,
        placement,
        programs,
    }
}
