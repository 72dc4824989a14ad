//! DualPipe and DualPipeV against DeepSeek's reference (the golden op orders), and an
//! executability check of every schedule we generate, inside and beyond the reference's range.

use std::collections::BTreeSet;
use std::path::Path;

use dualpipe_schedule::{generate, lower, validate, Chunk, Op, Schedule, ScheduleKind};
use proptest::prelude::*;
use serde_json::Value;

const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../testdata/golden/dualpipe"
);

/// One golden file, parsed into our op type.
struct Golden {
    name: String,
    kind: ScheduleKind,
    ranks: usize,
    micro_batches: usize,
    programs: Vec<Vec<Op>>,
}

fn field(v: &Value, key: &str, file: &str) -> usize {
    v.get(key)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{file}: missing number `{key}` in {v}")) as usize
}

/// A chunk; DualPipeV files have no `dir` (one direction).
fn chunk(v: &Value, file: &str) -> Chunk {
    let dir = v.get("dir").and_then(Value::as_u64).unwrap_or(0) as usize;
    Chunk::new(dir, field(v, "stage", file), field(v, "mb", file))
}

fn op(v: &Value, file: &str) -> Op {
    let name = v["op"]
        .as_str()
        .unwrap_or_else(|| panic!("{file}: no op in {v}"));
    let c = || chunk(v, file);
    let peer = || field(v, "peer", file);
    match name {
        "F" => Op::F(c()),
        "B" => Op::B(c()),
        "I" => Op::I(c()),
        "W" => Op::W(c()),
        "FB" => Op::FB {
            f: chunk(&v["f"], file),
            b: chunk(&v["b"], file),
        },
        "SEND_F" => Op::SendF {
            chunk: c(),
            peer: peer(),
        },
        "RECV_F" => Op::RecvF {
            chunk: c(),
            peer: peer(),
        },
        "SEND_B" => Op::SendB {
            chunk: c(),
            peer: peer(),
        },
        "RECV_B" => Op::RecvB {
            chunk: c(),
            peer: peer(),
        },
        "WAIT" => Op::Wait,
        other => panic!("{file}: unknown op {other}"),
    }
}

fn load_golden() -> Vec<Golden> {
    let dir = Path::new(GOLDEN);
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read the golden directory {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(path).expect("read golden file");
            let v: Value = serde_json::from_str(&text).expect("golden file is JSON");
            let kind = ScheduleKind::from_name(v["schedule"].as_str().expect("schedule name"))
                .expect("known schedule kind");
            let programs = v["programs"]
                .as_array()
                .expect("programs")
                .iter()
                .map(|p| {
                    p.as_array()
                        .expect("program")
                        .iter()
                        .map(|e| op(e, &name))
                        .collect()
                })
                .collect();
            Golden {
                kind,
                ranks: field(&v, "ranks", &name),
                micro_batches: field(&v, "micro_batches", &name),
                programs,
                name,
            }
        })
        .collect()
}

fn generated(g: &Golden) -> Schedule {
    generate(g.kind, g.ranks, g.micro_batches, 1)
        .unwrap_or_else(|e| panic!("{}: generation failed: {e}", g.name))
}

#[test]
fn compute_ops_match_the_reference_exactly() {
    let golden = load_golden();
    assert!(
        golden.len() >= 30,
        "expected the full golden set, found {} files",
        golden.len()
    );
    let mut failures = Vec::new();
    for g in &golden {
        let s = generated(g);
        assert_eq!(s.programs.len(), g.programs.len(), "{}", g.name);
        for (rank, (ours, theirs)) in s.programs.iter().zip(&g.programs).enumerate() {
            let ours: Vec<Op> = ours.iter().copied().filter(Op::is_compute).collect();
            let theirs: Vec<Op> = theirs.iter().copied().filter(Op::is_compute).collect();
            if ours != theirs {
                let at = ours.iter().zip(&theirs).take_while(|(a, b)| a == b).count();
                failures.push(format!(
                    "{} rank {rank}: first difference at compute op {at}: ours {:?}, reference {:?} \
                     (lengths {} vs {})",
                    g.name,
                    ours.get(at).map(ToString::to_string),
                    theirs.get(at).map(ToString::to_string),
                    ours.len(),
                    theirs.len()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

type CommEvent = (&'static str, usize, Chunk);

fn comm_set(program: &[Op]) -> BTreeSet<CommEvent> {
    program
        .iter()
        .filter_map(|op| Some((op.kind().name(), op.peer()?, op.chunk()?)))
        .collect()
}

/// Needs the lowering pass: each rank must post the same sends and receives as the reference.
#[test]
fn communication_matches_the_reference_as_sets() {
    let mut failures = Vec::new();
    for g in &load_golden() {
        let lowered = lower(&generated(g));
        for (rank, (ours, theirs)) in lowered.programs.iter().zip(&g.programs).enumerate() {
            let (ours, theirs) = (comm_set(ours), comm_set(theirs));
            assert!(
                g.ranks == 1 || !theirs.is_empty(),
                "{}: the reference has no communication",
                g.name
            );
            if ours != theirs {
                let missing: Vec<_> = theirs.difference(&ours).take(3).collect();
                let extra: Vec<_> = ours.difference(&theirs).take(3).collect();
                failures.push(format!(
                    "{} rank {rank}: {} events vs {} in the reference; missing e.g. {missing:?}, \
                     extra e.g. {extra:?}",
                    g.name,
                    ours.len(),
                    theirs.len()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Dense per-chunk flags, indexed by (dir, stage, mb).
struct Flags {
    stages: usize,
    mbs: usize,
    bits: Vec<bool>,
}

impl Flags {
    fn new(dirs: usize, stages: usize, mbs: usize) -> Self {
        Flags {
            stages,
            mbs,
            bits: vec![false; dirs * stages * mbs],
        }
    }
    fn idx(&self, c: Chunk) -> usize {
        (c.dir * self.stages + c.stage) * self.mbs + c.mb
    }
    fn get(&self, c: Chunk) -> bool {
        self.bits[self.idx(c)]
    }
    /// Sets the flag; false if it was already set.
    fn set(&mut self, c: Chunk) -> bool {
        let i = self.idx(c);
        !std::mem::replace(&mut self.bits[i], true)
    }
}

/// An independent checker for compute-only schedules: every op names a chunk of this schedule on
/// the rank that holds it; each chunk gets exactly one F and one backward (B, FB's b, or I then
/// W); and the ranks, run in lock-step where an op starts once its inputs exist (the previous
/// stage's forward; the next stage's input gradient and its own forward; its own I), all finish.
/// Returns the number of lock-step rounds (the makespan with unit-time ops).
fn check_executable(s: &Schedule) -> Result<usize, String> {
    let dirs = s.placement.dirs();
    let stages = s.placement.stages();
    let mbs = s.micro_batches_per_dir();
    if dirs == 0 || stages == 0 || mbs == 0 || s.programs.len() != s.ranks {
        return Err("empty or malformed schedule".into());
    }
    for (rank, program) in s.programs.iter().enumerate() {
        for op in program {
            if !op.is_compute() {
                return Err(format!(
                    "rank {rank}: communication op {op} in a compute-only schedule"
                ));
            }
            let chunks = match *op {
                Op::FB { f, b } => vec![f, b],
                _ => vec![op.chunk().expect("single-chunk op")],
            };
            for c in chunks {
                if c.dir >= dirs || c.stage >= stages || c.mb >= mbs {
                    return Err(format!(
                        "rank {rank}: {op} names a chunk outside the schedule"
                    ));
                }
                if s.placement.rank(c.dir, c.stage) != rank {
                    return Err(format!(
                        "rank {rank}: {op} belongs on rank {}",
                        s.placement.rank(c.dir, c.stage)
                    ));
                }
            }
        }
    }
    let mut forward = Flags::new(dirs, stages, mbs);
    let mut grad = Flags::new(dirs, stages, mbs); // input gradient computed (B, FB's b, or I)
    let mut owed = Flags::new(dirs, stages, mbs); // I ran, W not yet
    let mut weight = Flags::new(dirs, stages, mbs); // weight gradient done (B, FB's b, or W)
    let mut pc = vec![0usize; s.ranks];
    let total: usize = s.programs.iter().map(Vec::len).sum();
    let (mut done, mut rounds) = (0, 0);
    let f_ready =
        |fw: &Flags, c: Chunk| c.stage == 0 || fw.get(Chunk::new(c.dir, c.stage - 1, c.mb));
    let b_ready = |fw: &Flags, gr: &Flags, c: Chunk| {
        fw.get(c) && (c.stage + 1 == stages || gr.get(Chunk::new(c.dir, c.stage + 1, c.mb)))
    };
    while done < total {
        // Decide against the state at the start of the round, then apply.
        let runnable: Vec<(usize, Op)> = (0..s.ranks)
            .filter_map(|r| s.programs[r].get(pc[r]).map(|&op| (r, op)))
            .filter(|&(_, op)| match op {
                Op::F(c) => f_ready(&forward, c),
                Op::B(c) | Op::I(c) => b_ready(&forward, &grad, c),
                Op::W(c) => owed.get(c),
                Op::FB { f, b } => f_ready(&forward, f) && b_ready(&forward, &grad, b),
                _ => false,
            })
            .collect();
        if runnable.is_empty() {
            let blocked: Vec<String> = (0..s.ranks)
                .filter_map(|r| {
                    s.programs[r]
                        .get(pc[r])
                        .map(|op| format!("rank {r} at {op}"))
                })
                .collect();
            return Err(format!(
                "deadlock after {rounds} rounds: {}",
                blocked.join("; ")
            ));
        }
        for (rank, op) in runnable {
            let twice = |what: &str, c: Chunk| format!("rank {rank}: second {what} of {c}");
            match op {
                Op::F(c) => forward
                    .set(c)
                    .then_some(())
                    .ok_or_else(|| twice("forward", c))?,
                Op::B(c) => {
                    grad.set(c)
                        .then_some(())
                        .ok_or_else(|| twice("backward", c))?;
                    weight.set(c);
                }
                Op::I(c) => {
                    grad.set(c)
                        .then_some(())
                        .ok_or_else(|| twice("backward", c))?;
                    owed.set(c);
                }
                Op::W(c) => {
                    let i = owed.idx(c);
                    owed.bits[i] = false;
                    weight
                        .set(c)
                        .then_some(())
                        .ok_or_else(|| twice("weight gradient", c))?;
                }
                Op::FB { f, b } => {
                    forward
                        .set(f)
                        .then_some(())
                        .ok_or_else(|| twice("forward", f))?;
                    grad.set(b)
                        .then_some(())
                        .ok_or_else(|| twice("backward", b))?;
                    weight.set(b);
                }
                _ => unreachable!(),
            }
            pc[rank] += 1;
            done += 1;
        }
        rounds += 1;
    }
    for (name, flags) in [
        ("forward", &forward),
        ("backward", &grad),
        ("weight gradient", &weight),
    ] {
        if let Some(i) = flags.bits.iter().position(|&b| !b) {
            let c = Chunk::new(i / (stages * mbs), i / mbs % stages, i % mbs);
            return Err(format!("{c} never gets its {name}"));
        }
    }
    Ok(rounds)
}

fn check(kind: ScheduleKind, ranks: usize, micro_batches: usize) -> usize {
    let s = generate(kind, ranks, micro_batches, 1)
        .unwrap_or_else(|e| panic!("{kind} {ranks}x{micro_batches}: {e}"));
    assert_eq!(
        (s.kind, s.ranks, s.micro_batches),
        (kind, ranks, micro_batches)
    );
    let rounds = check_executable(&s)
        .unwrap_or_else(|e| panic!("{kind} ranks {ranks} micro-batches {micro_batches}: {e}"));
    validate(&lower(&s)).unwrap_or_else(|e| {
        panic!("{kind} ranks {ranks} micro-batches {micro_batches}: validator: {e}")
    });
    rounds
}

#[test]
fn the_checker_catches_broken_schedules() {
    let good = generate(ScheduleKind::DualPipeV, 2, 5, 1).unwrap();
    assert!(check_executable(&good).is_ok());
    // Swapping the first two ops of rank 1 makes stage 2's forward run before stage 1's.
    let mut bad = good.clone();
    bad.programs[1].swap(0, 1);
    assert!(check_executable(&bad).unwrap_err().contains("deadlock"));
    // A lost op leaves a chunk without its backward.
    let mut bad = good.clone();
    let at = bad.programs[0]
        .iter()
        .position(|op| matches!(op, Op::B(_)))
        .unwrap();
    bad.programs[0].remove(at);
    assert!(check_executable(&bad).is_err());
    // A W before its I can never run.
    let mut bad = good.clone();
    let last = bad.programs[0].len() - 1;
    bad.programs[0].swap(last - 1, last);
    assert!(check_executable(&bad).is_err());
    // An op on the wrong rank.
    let mut bad = good;
    let op = bad.programs[0].pop().unwrap();
    bad.programs[1].push(op);
    assert!(check_executable(&bad)
        .unwrap_err()
        .contains("belongs on rank 0"));
}

/// Every rank count up to 16, every micro-batch count from 1 (or 2) to past the reference's
/// minimum of 2 x ranks, and a few larger ones.
#[test]
fn every_small_configuration_is_complete_and_executable() {
    for ranks in 1..=16 {
        let mut counts: BTreeSet<usize> = (1..=2 * ranks + 3).collect();
        counts.extend([3 * ranks + 1, 4 * ranks, 64]);
        for &m in &counts {
            check(ScheduleKind::DualPipeV, ranks, m);
            if ranks % 2 == 0 && m % 2 == 0 {
                check(ScheduleKind::DualPipe, ranks, m);
            }
        }
    }
}

/// Below 2 x ranks micro-batches the schedules are cut from the one for 2 x ranks, so (with
/// unit-time ops) fewer micro-batches never take longer.
#[test]
fn short_batches_are_no_slower_than_the_full_warm_up() {
    for ranks in [2, 4, 8] {
        let rounds: Vec<usize> = (2..=2 * ranks)
            .step_by(2)
            .map(|m| check(ScheduleKind::DualPipe, ranks, m))
            .collect();
        assert!(
            rounds.windows(2).all(|w| w[0] <= w[1]),
            "dualpipe {ranks}: {rounds:?}"
        );
        let rounds: Vec<usize> = (1..=2 * ranks)
            .map(|m| check(ScheduleKind::DualPipeV, ranks, m))
            .collect();
        assert!(
            rounds.windows(2).all(|w| w[0] <= w[1]),
            "dualpipev {ranks}: {rounds:?}"
        );
    }
}

#[test]
fn impossible_configurations_are_refused() {
    for (kind, ranks, m, needle) in [
        (ScheduleKind::DualPipe, 3, 8, "ranks = 2 or ranks = 4"),
        (ScheduleKind::DualPipe, 0, 8, "at least 2 ranks"),
        (ScheduleKind::DualPipe, 4, 0, "at least 2 micro-batches"),
        (
            ScheduleKind::DualPipe,
            4,
            9,
            "micro_batches = 8 or micro_batches = 10",
        ),
        (ScheduleKind::DualPipeV, 0, 8, "at least 1 rank"),
        (ScheduleKind::DualPipeV, 4, 0, "at least 1 micro-batch"),
    ] {
        match generate(kind, ranks, m, 1) {
            Err(dualpipe_schedule::ScheduleError::InvalidConfig(e)) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(needle) && !msg.contains('\n'),
                    "{kind} {ranks}x{m}: {msg}"
                )
            }
            other => panic!("{kind} {ranks}x{m}: expected InvalidConfig, got {other:?}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_dualpipev_configurations_execute(ranks in 1usize..=24, m in 1usize..=80) {
        check(ScheduleKind::DualPipeV, ranks, m);
    }

    #[test]
    fn random_dualpipe_configurations_execute(half in 1usize..=12, half_m in 1usize..=40) {
        check(ScheduleKind::DualPipe, 2 * half, 2 * half_m);
    }
}
