//! The schedule IR: chunks, ops, placements, programs and schedules.
//!
//! A [`Chunk`] is one micro-batch at one pipeline stage of one direction. A [`StagePlacement`] says
//! which rank runs which (direction, stage). A program is one rank's ordered list of [`Op`]s; a
//! [`Schedule`] bundles the kind, the sizes, the placement and every rank's program.
//!
//! Stages are numbered along their own direction's pipeline (0 = first). Every direction runs
//! the same model: stage `s` of direction 0 and stage `s` of direction 1 hold the same layers
//! (DualPipe keeps two copies of every stage and sums their gradients after the step).

use std::fmt;

/// One micro-batch at one stage of one direction's pipeline.
///
/// `dir` is 0 for single-direction schedules; DualPipe uses 0 (enters at rank 0) and 1 (enters
/// at the last rank). `mb` counts within the direction: `0 .. micro_batches / dirs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Chunk {
    /// Direction of the pipeline this chunk flows along.
    pub dir: usize,
    /// Position along the direction's pipeline (0 = first stage).
    pub stage: usize,
    /// Micro-batch index within the direction.
    pub mb: usize,
}

impl Chunk {
    /// A chunk from its three coordinates.
    pub const fn new(dir: usize, stage: usize, mb: usize) -> Self {
        Chunk { dir, stage, mb }
    }

    /// The same micro-batch `delta` stages further along its direction's pipeline, or `None`
    /// before stage 0. Whether that stage exists is the placement's to say
    /// ([`StagePlacement::neighbour`]).
    pub const fn shifted(self, delta: isize) -> Option<Chunk> {
        match self.stage.checked_add_signed(delta) {
            Some(stage) => Some(Chunk::new(self.dir, stage, self.mb)),
            None => None,
        }
    }
}

/// One of a stage's two neighbours along its direction's pipeline.
///
/// Activations come from the previous stage and go to the next; gradients flow the other way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Neighbour {
    /// Stage `s - 1`: the forward's input comes from it, the backward's input gradient goes to it.
    Prev,
    /// Stage `s + 1`: the forward's output goes to it, the backward's output gradient comes from it.
    Next,
}

impl Neighbour {
    /// How many stages away the neighbour is: -1 or +1.
    pub const fn delta(self) -> isize {
        match self {
            Neighbour::Prev => -1,
            Neighbour::Next => 1,
        }
    }
}

impl fmt::Display for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "(dir {}, stage {}, mb {})",
            self.dir, self.stage, self.mb
        )
    }
}

/// The kind of a compute or communication op, without its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Forward.
    F,
    /// Full backward (input and weight gradients).
    B,
    /// Backward for the input gradient only; the weight gradient is deferred to a later `W`.
    I,
    /// Deferred weight gradient of an earlier `I` of the same chunk.
    W,
    /// A forward overlapped with a full backward of another chunk.
    FB,
    /// Activations of a forward leave this rank.
    SendF,
    /// Activations of a forward arrive at this rank.
    RecvF,
    /// Gradients of a backward leave this rank.
    SendB,
    /// Gradients of a backward arrive at this rank.
    RecvB,
    /// Every communication posted so far completes here.
    Wait,
}

impl OpKind {
    /// The name used in the JSON format (`"F"`, `"SEND_F"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::F => "F",
            OpKind::B => "B",
            OpKind::I => "I",
            OpKind::W => "W",
            OpKind::FB => "FB",
            OpKind::SendF => "SEND_F",
            OpKind::RecvF => "RECV_F",
            OpKind::SendB => "SEND_B",
            OpKind::RecvB => "RECV_B",
            OpKind::Wait => "WAIT",
        }
    }

    /// Whether the op computes (F, B, I, W, FB) rather than communicates.
    pub fn is_compute(self) -> bool {
        matches!(
            self,
            OpKind::F | OpKind::B | OpKind::I | OpKind::W | OpKind::FB
        )
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One step of a rank's program.
///
/// Communication ops name the *local* chunk: for `SendF` the producer on this rank, for
/// `RecvF` the consumer on this rank (likewise for the backward messages), and the `peer` rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Forward of a chunk.
    F(Chunk),
    /// Full backward of a chunk.
    B(Chunk),
    /// Input-gradient backward of a chunk (weight gradient deferred).
    I(Chunk),
    /// Deferred weight gradient of a chunk whose `I` ran earlier.
    W(Chunk),
    /// Forward of `f` overlapped with the full backward of `b`.
    FB {
        /// The chunk whose forward runs.
        f: Chunk,
        /// The chunk whose full backward runs.
        b: Chunk,
    },
    /// Send forward activations of `chunk` (produced here) to `peer`.
    SendF {
        /// Local producer chunk.
        chunk: Chunk,
        /// Receiving rank.
        peer: usize,
    },
    /// Receive forward activations for `chunk` (consumed here) from `peer`.
    RecvF {
        /// Local consumer chunk.
        chunk: Chunk,
        /// Sending rank.
        peer: usize,
    },
    /// Send the input gradient computed by `chunk`'s backward to `peer`.
    SendB {
        /// Local producer chunk.
        chunk: Chunk,
        /// Receiving rank.
        peer: usize,
    },
    /// Receive the output gradient for `chunk`'s backward from `peer`.
    RecvB {
        /// Local consumer chunk.
        chunk: Chunk,
        /// Sending rank.
        peer: usize,
    },
    /// Every communication posted so far completes here.
    Wait,
}

impl Op {
    /// The op's kind.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::F(_) => OpKind::F,
            Op::B(_) => OpKind::B,
            Op::I(_) => OpKind::I,
            Op::W(_) => OpKind::W,
            Op::FB { .. } => OpKind::FB,
            Op::SendF { .. } => OpKind::SendF,
            Op::RecvF { .. } => OpKind::RecvF,
            Op::SendB { .. } => OpKind::SendB,
            Op::RecvB { .. } => OpKind::RecvB,
            Op::Wait => OpKind::Wait,
        }
    }

    /// Whether the op computes (F, B, I, W, FB).
    pub fn is_compute(&self) -> bool {
        self.kind().is_compute()
    }

    /// The chunk of a single-chunk op (`None` for `FB` and `Wait`).
    pub fn chunk(&self) -> Option<Chunk> {
        match *self {
            Op::F(c) | Op::B(c) | Op::I(c) | Op::W(c) => Some(c),
            Op::SendF { chunk, .. }
            | Op::RecvF { chunk, .. }
            | Op::SendB { chunk, .. }
            | Op::RecvB { chunk, .. } => Some(chunk),
            Op::FB { .. } | Op::Wait => None,
        }
    }

    /// The neighbouring stage a communication op exchanges with: the next one for `SEND_F`
    /// and `RECV_B`, the previous one for `RECV_F` and `SEND_B`; `None` for the other ops.
    pub fn peer_side(&self) -> Option<Neighbour> {
        match self {
            Op::SendF { .. } | Op::RecvB { .. } => Some(Neighbour::Next),
            Op::RecvF { .. } | Op::SendB { .. } => Some(Neighbour::Prev),
            _ => None,
        }
    }

    /// The peer rank of a communication op.
    pub fn peer(&self) -> Option<usize> {
        match *self {
            Op::SendF { peer, .. }
            | Op::RecvF { peer, .. }
            | Op::SendB { peer, .. }
            | Op::RecvB { peer, .. } => Some(peer),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Op::FB { f: fc, b } => write!(f, "FB(f {fc}, b {b})"),
            Op::Wait => f.write_str("WAIT"),
            _ => {
                let c = self.chunk().expect("single-chunk op");
                match self.peer() {
                    Some(p) => write!(f, "{} {c} peer {p}", self.kind()),
                    None => write!(f, "{} {c}", self.kind()),
                }
            }
        }
    }
}

/// The schedule families we generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    /// All forwards, then all backwards.
    GPipe,
    /// One forward, one backward, after a warm-up.
    OneFOneB,
    /// 1F1B over `virtual_stages` stages per rank (Megatron's interleaved schedule).
    Interleaved,
    /// Zero-bubble ZB-H1: 1F1B with the backward split into `I` and deferred `W`.
    Zb1p,
    /// DeepSeek's bidirectional DualPipe.
    DualPipe,
    /// DeepSeek's V-shaped DualPipeV (one pipeline of 2 x ranks stages folded over the ranks).
    DualPipeV,
}

impl ScheduleKind {
    /// Every kind, in the order tables list them.
    pub const ALL: [ScheduleKind; 6] = [
        ScheduleKind::GPipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::Interleaved,
        ScheduleKind::Zb1p,
        ScheduleKind::DualPipe,
        ScheduleKind::DualPipeV,
    ];

    /// The name used on the command line and in JSON (`"dualpipe"`, `"1f1b"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::GPipe => "gpipe",
            ScheduleKind::OneFOneB => "1f1b",
            ScheduleKind::Interleaved => "interleaved",
            ScheduleKind::Zb1p => "zb1p",
            ScheduleKind::DualPipe => "dualpipe",
            ScheduleKind::DualPipeV => "dualpipev",
        }
    }

    /// The `virtual_stages` (stages per rank per direction) every schedule of this kind has:
    /// 2 for `dualpipev` (the two arms of the V), 1 for the other fixed kinds, and `None` for
    /// `interleaved`, where the caller chooses it.
    pub fn fixed_virtual_stages(self) -> Option<usize> {
        match self {
            ScheduleKind::Interleaved => None,
            ScheduleKind::DualPipeV => Some(2),
            _ => Some(1),
        }
    }

    /// The `virtual_stages` to generate with when the user names none: 2 for `interleaved`, 1
    /// otherwise (every generator accepts 1).
    pub fn default_virtual_stages(self) -> usize {
        if self == ScheduleKind::Interleaved {
            2
        } else {
            1
        }
    }

    /// Parses a name as printed by [`ScheduleKind::name`] (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        Self::ALL.into_iter().find(|k| k.name() == lower)
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ScheduleKind {
    type Err = UnknownScheduleKind;

    /// Parses a name as [`ScheduleKind::from_name`] does; the error lists the valid names.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        ScheduleKind::from_name(name).ok_or_else(|| UnknownScheduleKind {
            name: name.to_string(),
        })
    }
}

/// A name that is no [`ScheduleKind`]; displays as `unknown schedule 'NAME': use one of
/// gpipe, 1f1b, ...`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown schedule '{name}': use one of {}",
    UnknownScheduleKind::valid()
)]
pub struct UnknownScheduleKind {
    /// The name as given.
    pub name: String,
}

impl UnknownScheduleKind {
    /// The valid names, comma-separated, in [`ScheduleKind::ALL`]'s order.
    pub fn valid() -> String {
        let names: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
        names.join(", ")
    }
}

/// Which rank runs which (direction, stage).
///
/// All directions hold the same `stages` model stages; stage `s` of every direction shares
/// weights, so a rank that holds `(0, s)` and another that holds `(1, s)` keep two copies of
/// one stage whose gradients are summed after the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagePlacement {
    /// Number of ranks.
    pub ranks: usize,
    /// `rank_of[dir][stage]`: the rank that runs that stage of that direction.
    pub rank_of: Vec<Vec<usize>>,
}

impl StagePlacement {
    /// The placement every generator of `kind` uses.
    ///
    /// * `dualpipe`: two directions; rank `r` runs stage `r` of direction 0 and stage
    ///   `ranks - 1 - r` of direction 1;
    /// * `dualpipev`: one direction of `2 x ranks` stages folded into a V: stage `s` runs on
    ///   rank `s` for `s < ranks`, else on rank `2 x ranks - 1 - s`;
    /// * the others: one direction of `ranks x virtual_stages` stages, stage `s` on rank
    ///   `s % ranks` (`virtual_stages` is 1 except for `interleaved`).
    pub fn for_kind(kind: ScheduleKind, ranks: usize, virtual_stages: usize) -> StagePlacement {
        let rank_of = match kind {
            ScheduleKind::DualPipe => vec![(0..ranks).collect(), (0..ranks).rev().collect()],
            ScheduleKind::DualPipeV => vec![(0..2 * ranks)
                .map(|s| if s < ranks { s } else { 2 * ranks - 1 - s })
                .collect()],
            _ => vec![(0..ranks * virtual_stages)
                .map(|s| s % ranks.max(1))
                .collect()],
        };
        StagePlacement { ranks, rank_of }
    }

    /// Number of directions (1, or 2 for DualPipe).
    pub fn dirs(&self) -> usize {
        self.rank_of.len()
    }

    /// Number of stages along each direction's pipeline.
    pub fn stages(&self) -> usize {
        self.rank_of.first().map_or(0, Vec::len)
    }

    /// The rank that runs stage `stage` of direction `dir`.
    pub fn rank(&self, dir: usize, stage: usize) -> usize {
        self.rank_of[dir][stage]
    }

    /// The rank that runs stage `stage` of direction `dir`, or `None` when the placement has
    /// no such stage.
    pub fn try_rank(&self, dir: usize, stage: usize) -> Option<usize> {
        self.rank_of.get(dir)?.get(stage).copied()
    }

    /// The chunk of the same micro-batch at the neighbouring stage of `chunk`'s direction, when
    /// that stage exists (`None` before the first stage and after the last).
    pub fn neighbour(&self, chunk: Chunk, side: Neighbour) -> Option<Chunk> {
        let n = chunk.shifted(side.delta())?;
        (n.stage < self.rank_of.get(n.dir)?.len()).then_some(n)
    }

    /// The rank that holds the neighbouring stage of `chunk` (see [`StagePlacement::neighbour`]).
    pub fn neighbour_rank(&self, chunk: Chunk, side: Neighbour) -> Option<usize> {
        let n = self.neighbour(chunk, side)?;
        self.try_rank(n.dir, n.stage)
    }

    /// The rank a message between `chunk` and its neighbouring stage crosses to: the
    /// neighbour's rank when that stage exists and runs on another rank than `chunk`'s;
    /// `None` when there is no neighbour or it runs on the same rank (a local hand-over).
    pub fn peer(&self, chunk: Chunk, side: Neighbour) -> Option<usize> {
        let here = self.try_rank(chunk.dir, chunk.stage)?;
        self.neighbour_rank(chunk, side).filter(|&q| q != here)
    }

    /// The (dir, stage) pairs a rank runs, in (dir, stage) order.
    pub fn stages_of(&self, rank: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (dir, row) in self.rank_of.iter().enumerate() {
            for (stage, &r) in row.iter().enumerate() {
                if r == rank {
                    out.push((dir, stage));
                }
            }
        }
        out
    }

    /// How many stage copies (parameter copies) each rank holds.
    pub fn parameter_copies(&self) -> Vec<usize> {
        let mut counts = vec![0; self.ranks];
        for row in &self.rank_of {
            for &r in row {
                counts[r] += 1;
            }
        }
        counts
    }
}

/// Every stage's message peers ([`StagePlacement::peer`] on both sides), precomputed for the passes
/// that ask once per op (lowering, the validator).
pub(crate) struct Peers {
    stages: usize,
    /// Per `dir * stages + stage`: the peer of the previous and of the next stage
    /// ([`Peers::NONE`] when no message crosses).
    table: Vec<[usize; 2]>,
}

impl Peers {
    const NONE: usize = usize::MAX;

    /// The peers of every (dir, stage) of `placement` (rows past the first row's length are
    /// not looked up).
    pub(crate) fn new(placement: &StagePlacement) -> Self {
        let stages = placement.stages();
        let table = (0..placement.dirs())
            .flat_map(|dir| {
                (0..stages).map(move |stage| {
                    let c = Chunk::new(dir, stage, 0);
                    [Neighbour::Prev, Neighbour::Next]
                        .map(|side| placement.peer(c, side).unwrap_or(Peers::NONE))
                })
            })
            .collect();
        Peers { stages, table }
    }

    /// [`StagePlacement::peer`] of `chunk` (`None` also for chunks outside the placement).
    #[inline]
    pub(crate) fn get(&self, chunk: Chunk, side: Neighbour) -> Option<usize> {
        if chunk.stage >= self.stages {
            return None;
        }
        let i = chunk
            .dir
            .checked_mul(self.stages)?
            .checked_add(chunk.stage)?;
        let q = self.table.get(i)?[usize::from(side == Neighbour::Next)];
        (q != Peers::NONE).then_some(q)
    }
}

/// A complete schedule: kind, sizes, placement and one program per rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Which family generated it.
    pub kind: ScheduleKind,
    /// Number of ranks.
    pub ranks: usize,
    /// Total micro-batches in the step, over all directions.
    pub micro_batches: usize,
    /// Stages per rank per direction: the caller's choice for `interleaved`, 2 for `dualpipev`
    /// (the two arms of the V), 1 otherwise (see [`ScheduleKind::fixed_virtual_stages`]).
    pub virtual_stages: usize,
    /// Which rank runs which (dir, stage).
    pub placement: StagePlacement,
    /// `programs[rank]`: that rank's ops in execution order.
    pub programs: Vec<Vec<Op>>,
}

impl Schedule {
    /// Micro-batches that flow along each direction.
    pub fn micro_batches_per_dir(&self) -> usize {
        self.micro_batches / self.placement.dirs().max(1)
    }

    /// The index of a chunk's micro-batch in the whole step (`dir * per_dir + mb`), so every
    /// schedule can feed the same data to the same micro-batch.
    pub fn global_mb(&self, chunk: Chunk) -> usize {
        chunk.dir * self.micro_batches_per_dir() + chunk.mb
    }

    /// A copy of everything but the programs (which are left empty), for passes that rebuild
    /// the programs without cloning them first.
    pub fn clone_without_programs(&self) -> Schedule {
        Schedule {
            kind: self.kind,
            ranks: self.ranks,
            micro_batches: self.micro_batches,
            virtual_stages: self.virtual_stages,
            placement: self.placement.clone(),
            programs: Vec::new(),
        }
    }

    /// The schedule with only its compute ops (F, B, I, W, FB): communication and `WAIT`
    /// removed, as generators emit it and the CSV format holds it.
    pub fn compute_only(&self) -> Schedule {
        Schedule {
            programs: self
                .programs
                .iter()
                .map(|p| p.iter().copied().filter(Op::is_compute).collect())
                .collect(),
            ..self.clone_without_programs()
        }
    }

    /// Every compute op of every rank, counted.
    pub fn compute_ops(&self) -> usize {
        self.programs
            .iter()
            .flatten()
            .filter(|op| op.is_compute())
            .count()
    }

    /// Whether any program holds communication ops (i.e. it was lowered).
    pub fn is_lowered(&self) -> bool {
        self.programs
            .iter()
            .flatten()
            .any(|op| !op.is_compute() && *op != Op::Wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_and_peers_follow_the_placement() {
        use Neighbour::{Next, Prev};
        // DualPipeV over 3 ranks: stages 0..6 on ranks 0 1 2 2 1 0.
        let v = StagePlacement::for_kind(ScheduleKind::DualPipeV, 3, 2);
        let c = |stage| Chunk::new(0, stage, 4);
        assert_eq!(v.neighbour(c(0), Prev), None);
        assert_eq!(v.neighbour(c(0), Next), Some(c(1)));
        assert_eq!(v.neighbour(c(5), Next), None);
        assert_eq!(v.neighbour_rank(c(4), Next), Some(0));
        // Stages 2 and 3 share rank 2: a local hand-over, no message peer.
        assert_eq!(v.neighbour_rank(c(2), Next), Some(2));
        assert_eq!(v.peer(c(2), Next), None);
        assert_eq!(v.peer(c(3), Prev), None);
        assert_eq!(v.peer(c(3), Next), Some(1));
        // Outside the placement: nothing.
        assert_eq!(v.peer(Chunk::new(1, 0, 0), Next), None);
        assert_eq!(v.try_rank(0, 6), None);
        // DualPipe's second direction runs the ranks backwards.
        let d = StagePlacement::for_kind(ScheduleKind::DualPipe, 4, 1);
        assert_eq!(d.peer(Chunk::new(1, 0, 0), Next), Some(2));
        assert_eq!(d.peer(Chunk::new(1, 3, 0), Prev), Some(1));
        // The cached table agrees with the placement everywhere, also past its edges.
        for p in [&v, &d] {
            let peers = Peers::new(p);
            for dir in 0..3 {
                for stage in 0..8 {
                    for side in [Prev, Next] {
                        let c = Chunk::new(dir, stage, 0);
                        assert_eq!(peers.get(c, side), p.peer(c, side), "{c} {side:?}");
                    }
                }
            }
        }
        assert_eq!(Chunk::new(0, 0, 1).shifted(-1), None);
        assert_eq!(Chunk::new(0, 2, 1).shifted(-2), Some(Chunk::new(0, 0, 1)));
    }

    #[test]
    fn kinds_parse_from_their_names() {
        for kind in ScheduleKind::ALL {
            assert_eq!(kind.name().parse(), Ok(kind));
            assert_eq!(kind.name().to_uppercase().parse(), Ok(kind));
        }
        let err = "dualpip".parse::<ScheduleKind>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown schedule 'dualpip': use one of gpipe, 1f1b, interleaved, zb1p, dualpipe, \
             dualpipev"
        );
    }

    #[test]
    fn communication_ops_name_their_side() {
        let c = Chunk::new(0, 1, 0);
        let side = |op: Op| op.peer_side();
        assert_eq!(side(Op::SendF { chunk: c, peer: 2 }), Some(Neighbour::Next));
        assert_eq!(side(Op::RecvB { chunk: c, peer: 2 }), Some(Neighbour::Next));
        assert_eq!(side(Op::RecvF { chunk: c, peer: 0 }), Some(Neighbour::Prev));
        assert_eq!(side(Op::SendB { chunk: c, peer: 0 }), Some(Neighbour::Prev));
        assert_eq!(side(Op::F(c)), None);
        assert_eq!(side(Op::Wait), None);
    }
}
