//! What a stage keeps alive at its peak: the chunks between their forward and their input
//! backward (what recomputation shrinks) and between their input backward and their weight
//! backward (the inputs and output gradients the weight gradients need, which recomputation
//! does not shrink), counted along a rank's program, and the bytes they hold.

use dualpipe_schedule::Op;
use dualpipe_sim::ChunkBytes;

/// The live chunks of a rank at the moments its activation memory can peak. Each pair is
/// (chunks past their forward but not their input backward, chunks past their input backward
/// but not their weight backward), taken after every op that adds a chunk or moves one from the
/// first count to the second; only the pairs that no other pair matches or exceeds in both
/// counts are kept, so the peak of any per-chunk byte sizes is the largest over these pairs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveChunks(Vec<(usize, usize)>);

impl LiveChunks {
    /// The counts along one rank's program (its compute ops, in execution order), taken where
    /// the simulator's walk ([`dualpipe_sim::peak_activation_bytes`]) samples: a `B` (full
    /// backward) is counted between its input and its weight half, then frees its chunk; an
    /// `FB` counts its forward's chunk, then its backward's chunk between its halves.
    pub fn of_program<'a>(ops: impl IntoIterator<Item = &'a Op>) -> LiveChunks {
        let (mut before_i, mut before_w) = (0usize, 0usize);
        let mut points = Vec::new();
        for op in ops {
            match op {
                Op::F(_) => {
                    before_i += 1;
                    points.push((before_i, before_w));
                }
                Op::I(_) => {
                    before_i = before_i.saturating_sub(1);
                    before_w += 1;
                    points.push((before_i, before_w));
                }
                Op::W(_) => before_w = before_w.saturating_sub(1),
                Op::B(_) => {
                    // Between its input and its weight half the chunk holds what W needs.
                    points.push((before_i.saturating_sub(1), before_w + 1));
                    before_i = before_i.saturating_sub(1);
                }
                Op::FB { .. } => {
                    points.push((before_i + 1, before_w));
                    points.push((before_i, before_w + 1));
                }
                _ => {}
            }
        }
        LiveChunks::from_points(points)
    }

    /// `n` chunks alive from their forward to their backward, none waiting for a weight
    /// backward (a schedule without split backwards, or a hand-made slot).
    pub fn uniform(n: usize) -> LiveChunks {
        LiveChunks::from_points(vec![(n, 0)])
    }

    /// The pairs of both (a stage held by several ranks holds what the busiest of them does).
    pub fn merge(&self, other: &LiveChunks) -> LiveChunks {
        LiveChunks::from_points(self.0.iter().chain(&other.0).copied().collect())
    }

    /// The peak bytes: `per_chunk.forward` for each chunk before its input backward,
    /// `per_chunk.backward` for each after it, at the worst kept moment, plus `transient` (a
    /// recomputing stage's one chunk whose dropped tensors are rebuilt for its input backward).
    pub fn bytes(&self, per_chunk: ChunkBytes, transient: f64) -> f64 {
        let peak = self
            .0
            .iter()
            .map(|&(a, b)| a as f64 * per_chunk.forward + b as f64 * per_chunk.backward)
            .fold(0.0, f64::max);
        peak + transient.max(0.0)
    }

    fn from_points(mut points: Vec<(usize, usize)>) -> LiveChunks {
        // Sorted by the first count descending (ties: the second descending), a pair is kept
        // when its second count exceeds every second count kept before it.
        points.sort_unstable_by(|x, y| y.cmp(x));
        let mut kept: Vec<(usize, usize)> = Vec::new();
        for p in points {
            if kept.last().is_none_or(|&(_, b)| p.1 > b) {
                kept.push(p);
            }
        }
        LiveChunks(kept)
    }
}

/// A rank's peak activation bytes as the planner counts them: the simulator's walk of its
/// program (`ops`, compute ops in execution order) with what one chunk of each stage keeps
/// after its forward and after its input backward (`per_stage(stage).0`), plus the largest
/// transient of a recomputing stage on the rank (`per_stage(stage).1`: the tensors one chunk
/// rebuilds for its input backward, which the walk does not sample).
pub fn rank_activation_bytes<'a>(
    ops: impl IntoIterator<Item = &'a Op> + Clone,
    per_stage: impl Fn(usize) -> (ChunkBytes, f64),
) -> f64 {
    let walk = dualpipe_sim::peak_activation_bytes(ops.clone(), |s| per_stage(s).0);
    let transient = ops
        .into_iter()
        .filter_map(|op| match op {
            Op::F(c) | Op::I(c) | Op::W(c) | Op::B(c) => Some(c.stage),
            Op::FB { f, .. } => Some(f.stage),
            _ => None,
        })
        .map(|s| per_stage(s).1)
        .fold(0.0, f64::max);
    walk + transient
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualpipe_schedule::Chunk;

    /// The most chunks alive at once, whatever their state.
    fn most(live: &LiveChunks) -> usize {
        live.0.iter().map(|&(a, b)| a + b).max().unwrap_or(0)
    }

    #[test]
    fn split_backwards_move_chunks_to_the_weight_count() {
        let c = |mb| Chunk::new(0, 0, mb);
        let ops = [
            Op::F(c(0)),
            Op::F(c(1)),
            Op::I(c(0)),
            Op::F(c(2)),
            Op::I(c(1)),
            Op::W(c(0)),
            Op::W(c(1)),
        ];
        let live = LiveChunks::of_program(&ops);
        // Points: (1,0) (2,0) (1,1) (2,1) (1,2): (2,1) covers (2,0), (1,1) and (1,0).
        assert_eq!(live.0, vec![(2, 1), (1, 2)]);
        assert_eq!(most(&live), 3);
        let bytes = |forward, backward| ChunkBytes { forward, backward };
        // Recomputation keeps 1 per chunk before I, 10 after: the two deferred chunks decide.
        assert_eq!(live.bytes(bytes(1.0, 10.0), 0.0), 21.0);
        // Without it, 10 before I and 11 after: (2, 1) gives 31, (1, 2) gives 32.
        assert_eq!(live.bytes(bytes(10.0, 11.0), 0.0), 32.0);
        assert_eq!(live.bytes(bytes(1.0, 10.0), 9.0), 30.0);
    }

    #[test]
    fn agrees_with_the_simulators_walk_on_every_schedule() {
        use dualpipe_schedule::{build, ScheduleKind};
        for kind in ScheduleKind::ALL {
            let schedule = build(kind, 4, 8, kind.default_virtual_stages()).unwrap();
            for program in &schedule.programs {
                let ops: Vec<&Op> = program.iter().filter(|op| op.is_compute()).collect();
                let live = LiveChunks::of_program(ops.iter().copied());
                for per_chunk in [
                    ChunkBytes {
                        forward: 3.0,
                        backward: 7.0,
                    },
                    ChunkBytes {
                        forward: 7.0,
                        backward: 3.0,
                    },
                ] {
                    // One stage per rank's bytes: equal sizes for every stage of the rank.
                    let walk =
                        dualpipe_sim::peak_activation_bytes(ops.iter().copied(), |_| per_chunk);
                    assert_eq!(live.bytes(per_chunk, 0.0), walk, "{kind:?}");
                }
                assert_eq!(
                    most(&live),
                    dualpipe_sim::metrics::peak_activations(ops.iter().copied()),
                    "{kind:?}"
                );
            }
        }
    }
}
