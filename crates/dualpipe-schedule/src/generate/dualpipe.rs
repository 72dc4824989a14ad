//! The `dualpipe` generator: DeepSeek's bidirectional DualPipe, op for op.
//!
//! Two pipelines run over the same ranks at once: direction 0 enters at rank 0, direction 1 at
//! the last rank. Rank `r` runs stage `r` of direction 0 and stage `ranks - 1 - r` of direction 1.
//!
//! # How a rank's program is built
//!
//! Each rank sees its two stages from its own side: its *near* stage is the one of the direction
//! that enters at its own end of the pipeline (direction 0 for the first half of the ranks,
//! direction 1 for the second half) and sits `k` hops from that end, where `k` is the distance of
//! the rank from the nearer end; its *far* stage is the other direction's, `2n - 1 - k` hops in
//! (with `n = ranks / 2`). The rank then walks eight phases, each a fixed pattern repeated a
//! number of times that depends on `k` only (see [`eight_phase_program`]). DualPipeV folds one
//! pipeline of `2n` stages into a V over `n` ranks and walks exactly the same eight phases, so
//! [`crate::generate::dualpipev`] reuses this code.
//!
//! # Beyond the reference
//!
//! The reference refuses fewer than `2 x ranks` micro-batches. We generate the reference schedule
//! for `2 x ranks` micro-batches and drop every op of the micro-batches that do not exist (an `FB`
//! that loses one half becomes a plain `F` or `B`). Dropping whole micro-batches removes waits but
//! adds none, so the result is as complete and deadlock-free as the reference schedule it came
//! from; it is simply a shorter warm-up and cool-down.

use std::collections::VecDeque;

use crate::{Chunk, ConfigError, Knob, Op, Schedule, ScheduleError, ScheduleKind, StagePlacement};

/// Upper bound on the ops of one generated schedule, so an absurd request fails with a message
/// instead of exhausting memory.
pub(super) const MAX_OPS: usize = 1 << 27;

/// Generates the compute-only `dualpipe` schedule.
///
/// `ranks` must be even and at least 2; `micro_batches` even and at least 2 (half flow in
/// each direction). With at least `2 x ranks` micro-batches the programs are exactly those of
/// DeepSeek's reference `DualPipe.step()`; with fewer, see the module documentation.
pub fn generate(ranks: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    check_config(ranks, micro_batches)?;
    let half_ranks = ranks / 2;
    let per_dir = micro_batches / 2;
    let programs = (0..ranks)
        .map(|rank| {
            let in_second_half = rank >= half_ranks;
            let pos = rank.min(ranks - 1 - rank);
            // Near stage: the direction entering at this rank's end; far stage: the other one.
            let near_dir = usize::from(in_second_half);
            let legs = [(near_dir, pos), (1 - near_dir, ranks - 1 - pos)];
            eight_phase_program(half_ranks, pos, per_dir, legs)
        })
        .collect();
    Ok(Schedule {
        kind: ScheduleKind::DualPipe,
        ranks,
        micro_batches,
        virtual_stages: 1,
        placement: StagePlacement::for_kind(ScheduleKind::DualPipe, ranks, 1),
        programs,
    })
}

/// Rejects configurations for which no DualPipe schedule exists, naming the nearest valid ones.
fn check_config(ranks: usize, micro_batches: usize) -> Result<(), ScheduleError> {
    let bad = |e: ConfigError| Err(ScheduleError::InvalidConfig(e));
    if ranks == 0 {
        return bad(
            ConfigError::new("dualpipe needs at least 2 ranks, got 0: use ")
                .setting(Knob::Ranks, 2),
        );
    }
    if ranks % 2 == 1 {
        let e = ConfigError::new(format!(
            "dualpipe needs an even number of ranks (one pipeline per direction folds over them), \
             got {ranks}: use "
        ));
        return bad(
            even_neighbours(e, Knob::Ranks, ranks).text(" (or dualpipev, which takes any number)")
        );
    }
    if micro_batches == 0 {
        return bad(ConfigError::new(
            "dualpipe needs at least 2 micro-batches (one per direction), got 0: use ",
        )
        .setting(Knob::MicroBatches, 2));
    }
    if micro_batches % 2 == 1 {
        let e = ConfigError::new(format!(
            "dualpipe needs an even number of micro-batches (half flow in each direction), \
             got {micro_batches}: use "
        ));
        return bad(even_neighbours(e, Knob::MicroBatches, micro_batches));
    }
    check_size("dualpipe", ranks, micro_batches)
}

/// `error` followed by the even values next to an odd `value`: "ranks = 2 or ranks = 4" (no 0,
/// no overflow).
fn even_neighbours(error: ConfigError, knob: Knob, value: usize) -> ConfigError {
    let options = [
        value.checked_sub(1).filter(|&v| v > 0),
        value.checked_add(1),
    ];
    options
        .into_iter()
        .flatten()
        .enumerate()
        .fold(error, |e, (i, v)| {
            let e = if i > 0 { e.text(" or ") } else { e };
            e.setting(knob, v)
        })
}

/// Fails when generating would walk more than [`MAX_OPS`] ops. The walk covers at least
/// `2 x ranks` micro-batches (see the module documentation), and a rank runs at most six ops
/// per micro-batch (two stages, each `F`, `I` and `W`).
pub(super) fn check_size(
    name: &str,
    ranks: usize,
    micro_batches: usize,
) -> Result<(), ScheduleError> {
    let walked = micro_batches.max(ranks.saturating_mul(2));
    let ops = ranks.checked_mul(walked).and_then(|x| x.checked_mul(6));
    match ops {
        Some(ops) if ops <= MAX_OPS => Ok(()),
        _ => Err(ScheduleError::InvalidConfig(
            ConfigError::new(format!(
                "{name} with {ranks} ranks and {micro_batches} micro-batches is too large to \
                 generate (over {MAX_OPS} ops): use fewer "
            ))
            .name(Knob::Ranks)
            .text(" or ")
            .name(Knob::MicroBatches),
        )),
    }
}

/// Builds one rank's program by walking the eight phases of DeepSeek's DualPipe step.
///
/// * `n`: positions along one leg of the fold (`ranks / 2` for DualPipe, `ranks` for DualPipeV);
/// * `k`: this rank's position, `0 .. n` (0 = the rank where its near leg starts);
/// * `micro_batches`: micro-batches that flow through each of the rank's two stages;
/// * `legs`: the (dir, stage) of the rank's near stage (the reference's phase 0) and far stage
///   (phase 1).
///
/// The phase lengths assume at least `2n` micro-batches per stage; with fewer, the schedule for
/// `2n` is walked and the ops of missing micro-batches are dropped.
pub(super) fn eight_phase_program(
    n: usize,
    k: usize,
    micro_batches: usize,
    legs: [(usize, usize); 2],
) -> Vec<Op> {
    debug_assert!(k < n);
    let walked = micro_batches.max(2 * n);
    let mut w = Walker::new(legs, micro_batches);
    let far_from_middle = n - k - 1;
    let near_middle = k + 1;

    // 1. Fill: forwards of the near stage only, two per hop still to the middle.
    for _ in 0..2 * far_from_middle {
        w.forward(0);
    }
    // 2. Alternate near and far forwards until the far stage has work.
    for _ in 0..near_middle {
        w.forward(0);
        w.forward(1);
    }
    // 3. Far stage: input-gradient backward, the weight gradient at once, one more forward.
    for _ in 0..far_from_middle {
        w.backward(1, true);
        w.weight();
        w.forward(1);
    }
    // 4. Steady state: overlapped (near F, far B) then (far F, near B). The middle rank runs the
    //    very first pair apart, forward first, to shorten the bubble.
    for i in 0..walked - 2 * n + k + 1 {
        if i == 0 && k == n - 1 {
            w.forward(0);
            w.backward(1, false);
        } else {
            w.forward_backward(0, 1);
        }
        w.forward_backward(1, 0);
    }
    // 5. Near forwards are done: a far backward, then an overlapped (far F, near B).
    for _ in 0..far_from_middle {
        w.backward(1, false);
        w.forward_backward(1, 0);
    }
    // 6. Drain both backwards alternately, far then near. From the middle iteration on they
    //    defer W; with an odd k (an even number of iterations) the split starts at the far
    //    backward, otherwise at the near one, so exactly k + 1 of the 2(k + 1) are split.
    let odd = k % 2 == 1;
    let mid = near_middle / 2;
    for i in 0..near_middle {
        w.backward(1, i > mid || (i == mid && odd));
        w.backward(0, i >= mid);
    }
    // 7. Near backwards (split), each after one deferred weight gradient.
    for _ in 0..far_from_middle {
        w.weight();
        w.backward(0, true);
    }
    // 8. The remaining deferred weight gradients.
    for _ in 0..near_middle {
        w.weight();
    }
    debug_assert!(w.deferred.is_empty());
    w.ops
}

/// Walks a rank's two stages, numbering micro-batches per stage in order and emitting ops,
/// except for micro-batches at or past `keep` (the ones that only exist in the walked pattern).
struct Walker {
    legs: [(usize, usize); 2],
    keep: usize,
    next_f: [usize; 2],
    next_b: [usize; 2],
    /// Chunks whose `I` ran and whose `W` is still owed, oldest first.
    deferred: VecDeque<Chunk>,
    ops: Vec<Op>,
}

impl Walker {
    fn new(legs: [(usize, usize); 2], keep: usize) -> Self {
        Walker {
            legs,
            keep,
            next_f: [0; 2],
            next_b: [0; 2],
            deferred: VecDeque::new(),
            // Two stages, each with one F and at most two backward ops per micro-batch.
            ops: Vec::with_capacity(6 * keep),
        }
    }

    /// The next chunk of `leg` from `counter`, and whether it exists.
    fn take(&self, leg: usize, counter: &mut [usize; 2]) -> (Chunk, bool) {
        let (dir, stage) = self.legs[leg];
        let mb = counter[leg];
        counter[leg] += 1;
        (Chunk::new(dir, stage, mb), mb < self.keep)
    }

    fn next_forward(&mut self, leg: usize) -> (Chunk, bool) {
        let mut c = self.next_f;
        let out = self.take(leg, &mut c);
        self.next_f = c;
        out
    }

    fn next_backward(&mut self, leg: usize) -> (Chunk, bool) {
        let mut c = self.next_b;
        let out = self.take(leg, &mut c);
        self.next_b = c;
        out
    }

    fn forward(&mut self, leg: usize) {
        let (chunk, real) = self.next_forward(leg);
        if real {
            self.ops.push(Op::F(chunk));
        }
    }

    /// A backward of `leg`; `split` runs only the input gradient and owes a `W`.
    fn backward(&mut self, leg: usize, split: bool) {
        let (chunk, real) = self.next_backward(leg);
        if split {
            self.deferred.push_back(chunk);
        }
        if real {
            self.ops
                .push(if split { Op::I(chunk) } else { Op::B(chunk) });
        }
    }

    /// The oldest owed weight gradient.
    fn weight(&mut self) {
        if let Some(chunk) = self.deferred.pop_front() {
            if chunk.mb < self.keep {
                self.ops.push(Op::W(chunk));
            }
        }
    }

    /// Forward of `f_leg` overlapped with a full backward of `b_leg`.
    fn forward_backward(&mut self, f_leg: usize, b_leg: usize) {
        let (f, f_real) = self.next_forward(f_leg);
        let (b, b_real) = self.next_backward(b_leg);
        match (f_real, b_real) {
            (true, true) => self.ops.push(Op::FB { f, b }),
            (true, false) => self.ops.push(Op::F(f)),
            (false, true) => self.ops.push(Op::B(b)),
            (false, false) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(r: Result<Schedule, ScheduleError>) -> String {
        match r {
            Err(ScheduleError::InvalidConfig(m)) => m.to_string(),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn rejects_impossible_configurations_with_one_line() {
        let m = message(generate(3, 8));
        assert!(
            m.contains("even number of ranks") && m.contains("ranks = 2 or ranks = 4"),
            "{m}"
        );
        let m = message(generate(1, 8));
        assert!(m.contains("ranks = 2") && !m.contains("ranks = 0"), "{m}");
        let m = message(generate(0, 8));
        assert!(m.contains("at least 2 ranks"), "{m}");
        let m = message(generate(4, 0));
        assert!(m.contains("at least 2 micro-batches"), "{m}");
        let m = message(generate(4, 7));
        assert!(m.contains("micro_batches = 6 or micro_batches = 8"), "{m}");
        let m = message(generate(4, 1));
        assert!(
            m.contains("micro_batches = 2") && !m.contains("micro_batches = 0"),
            "{m}"
        );
        let m = message(generate(usize::MAX - 1, 2));
        assert!(m.contains("use fewer ranks"), "{m}");
        let m = message(generate(usize::MAX, 2));
        assert!(m.contains(&format!("ranks = {}", usize::MAX - 1)), "{m}");
        let m = message(generate(2, usize::MAX));
        assert!(
            m.contains(&format!("micro_batches = {}", usize::MAX - 1)),
            "{m}"
        );
        for m in [message(generate(3, 8)), message(generate(4, 7))] {
            assert!(!m.contains('\n'), "{m}");
        }
    }

    #[test]
    fn metadata_and_placement() {
        let s = generate(4, 10).unwrap();
        assert_eq!(s.kind, ScheduleKind::DualPipe);
        assert_eq!((s.ranks, s.micro_batches, s.virtual_stages), (4, 10, 1));
        assert_eq!(
            s.placement.rank_of,
            vec![vec![0, 1, 2, 3], vec![3, 2, 1, 0]]
        );
        assert_eq!(s.programs.len(), 4);
        assert!(s.programs.iter().flatten().all(Op::is_compute));
    }

    /// Every rank runs one F and one backward (B, FB's b, or I) per micro-batch and stage it
    /// holds, and exactly one W per I, after it.
    #[test]
    fn every_rank_covers_its_chunks_once() {
        for ranks in [2, 4, 6, 8] {
            for micro_batches in (2..=3 * ranks + 2).step_by(2) {
                let s = generate(ranks, micro_batches).unwrap();
                for (rank, program) in s.programs.iter().enumerate() {
                    let mut fwd = Vec::new();
                    let mut bwd = Vec::new();
                    let mut owed = VecDeque::new();
                    for op in program {
                        match *op {
                            Op::F(c) => fwd.push(c),
                            Op::B(c) => bwd.push(c),
                            Op::I(c) => {
                                bwd.push(c);
                                owed.push_back(c);
                            }
                            Op::W(c) => assert_eq!(owed.pop_front(), Some(c)),
                            Op::FB { f, b } => {
                                fwd.push(f);
                                bwd.push(b);
                            }
                            _ => unreachable!(),
                        }
                    }
                    assert!(owed.is_empty());
                    let mut want: Vec<Chunk> = s
                        .placement
                        .stages_of(rank)
                        .into_iter()
                        .flat_map(|(d, st)| {
                            (0..micro_batches / 2).map(move |mb| Chunk::new(d, st, mb))
                        })
                        .collect();
                    want.sort();
                    fwd.sort();
                    bwd.sort();
                    assert_eq!(fwd, want, "ranks {ranks} mb {micro_batches} rank {rank}");
                    assert_eq!(bwd, want, "ranks {ranks} mb {micro_batches} rank {rank}");
                }
            }
        }
    }

    /// With two ranks and four micro-batches the schedule is small enough to derive by hand
    /// from the eight phases (rank 0: n = 1, k = 0, so phases 1, 3, 5, 7 are empty).
    #[test]
    fn two_ranks_four_micro_batches_by_hand() {
        let s = generate(2, 4).unwrap();
        let c = Chunk::new;
        let rank0 = vec![
            Op::F(c(0, 0, 0)), // phase 2
            Op::F(c(1, 1, 0)), //
            Op::F(c(0, 0, 1)), // phase 4, i = 0, middle rank: apart
            Op::B(c(1, 1, 0)), //
            Op::FB {
                f: c(1, 1, 1),
                b: c(0, 0, 0),
            }, //
            Op::B(c(1, 1, 1)), // phase 6 (k = 0: near side split)
            Op::I(c(0, 0, 1)), //
            Op::W(c(0, 0, 1)), // phase 8
        ];
        assert_eq!(s.programs[0], rank0);
        // Rank 1 mirrors rank 0 with the directions swapped.
        let mirror: Vec<Op> = rank0
            .iter()
            .map(|op| {
                let m = |x: Chunk| c(1 - x.dir, x.stage, x.mb);
                match *op {
                    Op::F(x) => Op::F(m(x)),
                    Op::B(x) => Op::B(m(x)),
                    Op::I(x) => Op::I(m(x)),
                    Op::W(x) => Op::W(m(x)),
                    Op::FB { f, b } => Op::FB { f: m(f), b: m(b) },
                    other => other,
                }
            })
            .collect();
        assert_eq!(s.programs[1], mirror);
    }

    /// Fewer micro-batches than the reference allows: the same walk with the missing
    /// micro-batches' ops dropped.
    #[test]
    fn short_batches_drop_missing_micro_batches() {
        let s = generate(2, 2).unwrap();
        let c = Chunk::new;
        assert_eq!(
            s.programs[0],
            vec![
                Op::F(c(0, 0, 0)),
                Op::F(c(1, 1, 0)),
                Op::B(c(1, 1, 0)),
                Op::B(c(0, 0, 0)),
            ]
        );
    }
}
