//! The validator: proves a schedule complete, causal, matched and deadlock-free.
//!
//! [`validate`] checks, in this order:
//!
//! 1. **Shape**: one program per rank, a placement over the schedule's ranks, micro-batches that
//!    split evenly over the directions.
//! 2. **Per op** (rank by rank, op by op): every chunk lies inside the schedule
//!    ([`Rule::ChunkRange`]) and on the rank the placement gives its stage
//!    ([`Rule::Placement`]); no chunk's forward, backward or weight gradient runs twice
//!    ([`Rule::Duplicate`]); every communication op names the right peer and a message some
//!    dependency needs ([`Rule::Peer`]).
//! 3. **Per chunk**: one forward and one full backward (`B`, the backward of an `FB`, or `I`
//!    followed later by `W`) ([`Rule::Missing`], [`Rule::WeightGradient`]); on one rank, the forward
//!    of stage `s` after that of stage `s - 1`, the backward of `s` after that of `s + 1` and after
//!    its own forward ([`Rule::Dependency`]). In a lowered schedule every dependency between two
//!    ranks has its `SEND` after the producing op and its `RECV` before the consuming op
//!    ([`Rule::MissingMessage`], [`Rule::Unmatched`], [`Rule::CommOrder`]).
//! 4. **Execution**: the programs run to completion when sends never block and a compute op waits
//!    for its inputs from other ranks (for a lowered schedule: for the message; `WAIT` waits for
//!    every receive posted before it). This is an event-driven run, O(total ops); when it sticks,
//!    the error names a cycle of waiting ranks and their ops ([`Rule::Deadlock`]).
//!
//! A schedule is *lowered* when it holds any communication op; a compute-only schedule's
//! dependencies between ranks are then waited for directly.

use std::fmt;

mod execution;

use crate::ir::{Neighbour, Peers};
use crate::{Chunk, Op, Schedule};

/// The rule a schedule breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// The schedule's sizes, placement and programs disagree.
    Shape,
    /// A chunk lies outside the schedule's directions, stages or micro-batches.
    ChunkRange,
    /// An op runs on a rank the placement does not give its stage to.
    Placement,
    /// A chunk's forward, backward, weight gradient or message appears more than once.
    Duplicate,
    /// A chunk's forward or full backward never runs.
    Missing,
    /// A `W` without an earlier `I` of the same chunk, or an `I` without a later `W`.
    WeightGradient,
    /// An op runs before an op it depends on, on the same rank.
    Dependency,
    /// A communication op names the wrong peer, or a message that no dependency needs.
    Peer,
    /// A send placed before the op that produces its data, or a receive after the op that
    /// consumes it.
    CommOrder,
    /// A send without its receive, or a receive without its send.
    Unmatched,
    /// A dependency between two ranks of a lowered schedule has no messages at all.
    MissingMessage,
    /// The programs cannot all run to completion.
    Deadlock,
}

impl Rule {
    /// A short name of the rule, as error messages print it.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Shape => "shape",
            Rule::ChunkRange => "chunk range",
            Rule::Placement => "placement",
            Rule::Duplicate => "exactly once",
            Rule::Missing => "completeness",
            Rule::WeightGradient => "W after its I",
            Rule::Dependency => "dependency order",
            Rule::Peer => "message peer",
            Rule::CommOrder => "message order",
            Rule::Unmatched => "send/receive matching",
            Rule::MissingMessage => "messages for cross-rank dependencies",
            Rule::Deadlock => "deadlock freedom",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A broken rule, naming the rank, the op and the rule.
///
/// Displays as `rank R: op I `OP` breaks rule 'RULE': what is wrong and how to fix it`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rank {rank}: {message}")]
pub struct ValidationError {
    /// The rank whose program breaks the rule.
    pub rank: usize,
    /// The index of the offending op in that rank's program, when one op is to blame.
    pub op_index: Option<usize>,
    /// The rule that is broken.
    pub rule: Rule,
    /// What is wrong, naming the op and the rule.
    pub message: String,
}

impl ValidationError {
    /// An error at `rank`, optionally at op `at = (index, op)`, breaking `rule`.
    pub fn new(rank: usize, at: Option<(usize, &Op)>, rule: Rule, detail: &str) -> Self {
        let message = match at {
            Some((i, op)) => format!("op {i} `{op}` breaks rule '{rule}': {detail}"),
            None => format!("breaks rule '{rule}': {detail}"),
        };
        ValidationError {
            rank,
            op_index: at.map(|(i, _)| i),
            rule,
            message,
        }
    }
}

pub(super) const NONE: u32 = u32::MAX;

/// One step of a compute op: a forward, a backward producing the input gradient (`split` when
/// it is an `I` that owes a `W`), or a deferred weight gradient.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Fwd,
    Bwd { split: bool },
    Wgt,
}

/// The compute parts of an op (an `FB` has two).
pub(super) fn parts(op: &Op) -> ([(Part, Chunk); 2], usize) {
    let z = Chunk::new(0, 0, 0);
    match *op {
        Op::F(c) => ([(Part::Fwd, c), (Part::Fwd, z)], 1),
        Op::B(c) => ([(Part::Bwd { split: false }, c), (Part::Fwd, z)], 1),
        Op::I(c) => ([(Part::Bwd { split: true }, c), (Part::Fwd, z)], 1),
        Op::W(c) => ([(Part::Wgt, c), (Part::Fwd, z)], 1),
        Op::FB { f, b } => ([(Part::Fwd, f), (Part::Bwd { split: false }, b)], 2),
        _ => ([(Part::Fwd, z), (Part::Fwd, z)], 0),
    }
}

/// Sizes and lookups shared by the checks.
pub(super) struct Geometry<'a> {
    pub(super) schedule: &'a Schedule,
    pub(super) dirs: usize,
    pub(super) stages: usize,
    pub(super) per_dir: usize,
    /// `rank_of[dir * stages + stage]`.
    rank_of: Vec<usize>,
    /// Every stage's message peers.
    peers: Peers,
}

impl Geometry<'_> {
    pub(super) fn in_range(&self, c: Chunk) -> bool {
        c.dir < self.dirs && c.stage < self.stages && c.mb < self.per_dir
    }

    pub(super) fn id(&self, c: Chunk) -> usize {
        (c.dir * self.stages + c.stage) * self.per_dir + c.mb
    }

    pub(super) fn chunk(&self, id: usize) -> Chunk {
        let ds = id / self.per_dir;
        Chunk::new(ds / self.stages, ds % self.stages, id % self.per_dir)
    }

    pub(super) fn rank(&self, dir: usize, stage: usize) -> usize {
        self.rank_of[dir * self.stages + stage]
    }

    /// The rank of the next stage when it exists and runs on another rank than `c`'s.
    #[inline]
    pub(super) fn remote_next(&self, c: Chunk) -> Option<usize> {
        self.peers.get(c, Neighbour::Next)
    }

    /// The rank of the previous stage when it exists and runs on another rank than `c`'s.
    #[inline]
    pub(super) fn remote_prev(&self, c: Chunk) -> Option<usize> {
        self.peers.get(c, Neighbour::Prev)
    }

    /// The id of a chunk in range on `rank`, or the error of the rule it breaks.
    #[inline(always)]
    fn own(&self, c: Chunk, rank: usize, index: usize, op: &Op) -> Res<usize> {
        if c.dir < self.dirs && c.stage < self.stages && c.mb < self.per_dir {
            let ds = c.dir * self.stages + c.stage;
            if self.rank_of[ds] == rank {
                return Ok(ds * self.per_dir + c.mb);
            }
        }
        Err(self.not_own(c, rank, index, op))
    }

    #[cold]
    #[inline(never)]
    fn not_own(&self, c: Chunk, rank: usize, index: usize, op: &Op) -> Box<ValidationError> {
        let at = Some((index, op));
        if !self.in_range(c) {
            return fail(
                rank,
                at,
                Rule::ChunkRange,
                &format!(
                    "chunk {c} is outside the schedule ({} direction(s), {} stages, {} \
                     micro-batches per direction)",
                    self.dirs, self.stages, self.per_dir
                ),
            );
        }
        fail(
            rank,
            at,
            Rule::Placement,
            &format!(
                "stage {} of direction {} runs on rank {}, not here",
                c.stage,
                c.dir,
                self.rank(c.dir, c.stage)
            ),
        )
    }

    pub(super) fn op(&self, rank: usize, index: u32) -> (usize, &Op) {
        (
            index as usize,
            &self.schedule.programs[rank][index as usize],
        )
    }
}

/// Where each chunk's ops sit (index in the program of the rank the placement gives it).
struct Positions {
    f: Vec<u32>,
    b: Vec<u32>,
    split: Vec<bool>,
    w: Vec<u32>,
    send_f: Vec<u32>,
    recv_f: Vec<u32>,
    send_b: Vec<u32>,
    recv_b: Vec<u32>,
}

/// Checks every rule of a schedule; see the [module documentation](self) for the rules.
pub fn validate(schedule: &Schedule) -> Result<(), ValidationError> {
    let check = || -> Res<()> {
        let geo = check_shape(schedule)?;
        let pos = check_ops(&geo)?;
        let lowered = schedule.is_lowered();
        check_chunks(&geo, &pos, lowered)?;
        execution::check_execution(&geo, lowered)
    };
    check().map_err(|e| *e)
}

/// Internal results carry the (large, rare) error boxed, so the hot paths pass a pointer.
pub(super) type Res<T> = Result<T, Box<ValidationError>>;

/// A boxed [`ValidationError`] (see [`ValidationError::new`]).
#[cold]
#[inline(never)]
pub(super) fn fail(
    rank: usize,
    at: Option<(usize, &Op)>,
    rule: Rule,
    detail: &str,
) -> Box<ValidationError> {
    Box::new(ValidationError::new(rank, at, rule, detail))
}

fn shape_err(rank: usize, detail: &str) -> Box<ValidationError> {
    fail(rank, None, Rule::Shape, detail)
}

pub(super) fn check_shape(schedule: &Schedule) -> Res<Geometry<'_>> {
    let ranks = schedule.ranks;
    let placement = &schedule.placement;
    if ranks == 0 {
        return Err(shape_err(0, "the schedule has no ranks; use at least 1"));
    }
    if schedule.programs.len() != ranks {
        return Err(shape_err(
            0,
            &format!(
                "the schedule has {ranks} ranks but {} programs; give one program per rank",
                schedule.programs.len()
            ),
        ));
    }
    if placement.ranks != ranks {
        return Err(shape_err(
            0,
            &format!(
                "the placement is for {} ranks but the schedule has {ranks}",
                placement.ranks
            ),
        ));
    }
    let dirs = placement.dirs();
    let stages = placement.stages();
    if dirs == 0 || stages == 0 {
        return Err(shape_err(0, "the placement holds no stages"));
    }
    for (dir, row) in placement.rank_of.iter().enumerate() {
        if row.len() != stages {
            return Err(shape_err(
                0,
                &format!(
                    "direction {dir} has {} stages but direction 0 has {stages}; every direction \
                     runs the same stages",
                    row.len()
                ),
            ));
        }
        if let Some((stage, &r)) = row.iter().enumerate().find(|(_, &r)| r >= ranks) {
            return Err(shape_err(
                0,
                &format!(
                    "the placement puts stage {stage} of direction {dir} on rank {r}, but there \
                     are only {ranks} ranks"
                ),
            ));
        }
    }
    if schedule.micro_batches == 0 || !schedule.micro_batches.is_multiple_of(dirs) {
        return Err(shape_err(
            0,
            &format!(
                "{} micro-batches do not split evenly over {dirs} direction(s); use a positive \
                 multiple of {dirs}",
                schedule.micro_batches
            ),
        ));
    }
    let per_dir = schedule.micro_batches / dirs;
    for (rank, program) in schedule.programs.iter().enumerate() {
        if program.len() >= NONE as usize {
            return Err(shape_err(rank, "the program holds more than 2^32 - 2 ops"));
        }
    }
    // Every chunk needs a forward: when the programs hold fewer ops than chunks, find a rank
    // short of forwards before allocating per-chunk tables (the sizes may come from an
    // untrusted file). Otherwise the tables are no bigger than the programs.
    let total_ops: usize = schedule.programs.iter().map(Vec::len).sum();
    let chunks = dirs
        .checked_mul(stages)
        .and_then(|x| x.checked_mul(per_dir));
    if chunks.is_none_or(|n| n > total_ops) {
        let stages_of = placement.parameter_copies();
        for (rank, program) in schedule.programs.iter().enumerate() {
            let forwards = program
                .iter()
                .filter(|op| matches!(op, Op::F(_) | Op::FB { .. }))
                .count();
            let needed = stages_of[rank].checked_mul(per_dir);
            if needed.is_none_or(|n| forwards < n) {
                return Err(fail(
                    rank,
                    None,
                    Rule::Missing,
                    &format!(
                        "the rank runs {forwards} forwards, but its {} stage(s) x {per_dir} \
                         micro-batches need one each; add the missing F ops",
                        stages_of[rank]
                    ),
                ));
            }
        }
    }
    Ok(Geometry {
        schedule,
        dirs,
        stages,
        per_dir,
        rank_of: placement.rank_of.iter().flatten().copied().collect(),
        peers: Peers::new(placement),
    })
}

/// Records a position, failing on a duplicate.
#[inline]
fn record(table: &mut [u32], id: usize, rank: usize, index: usize, op: &Op, what: &str) -> Res<()> {
    if table[id] != NONE {
        return Err(duplicate(table[id], rank, index, op, what));
    }
    table[id] = index as u32;
    Ok(())
}

#[cold]
fn duplicate(earlier: u32, rank: usize, index: usize, op: &Op, what: &str) -> Box<ValidationError> {
    {
        fail(
            rank,
            Some((index, op)),
            Rule::Duplicate,
            &format!("{what} already ran at op {earlier}; each must run exactly once"),
        )
    }
}

fn check_ops(geo: &Geometry<'_>) -> Res<Positions> {
    let n = geo.dirs * geo.stages * geo.per_dir;
    let mut pos = Positions {
        f: vec![NONE; n],
        b: vec![NONE; n],
        split: vec![false; n],
        w: vec![NONE; n],
        send_f: vec![NONE; n],
        recv_f: vec![NONE; n],
        send_b: vec![NONE; n],
        recv_b: vec![NONE; n],
    };
    for (rank, program) in geo.schedule.programs.iter().enumerate() {
        for (index, op) in program.iter().enumerate() {
            match *op {
                Op::F(c) => {
                    let id = geo.own(c, rank, index, op)?;
                    record(&mut pos.f, id, rank, index, op, FORWARD)?;
                }
                Op::B(c) | Op::I(c) => {
                    let id = geo.own(c, rank, index, op)?;
                    record(&mut pos.b, id, rank, index, op, BACKWARD)?;
                    pos.split[id] = matches!(op, Op::I(_));
                }
                Op::W(c) => {
                    let id = geo.own(c, rank, index, op)?;
                    record(&mut pos.w, id, rank, index, op, WEIGHT)?;
                }
                Op::FB { f, b } => {
                    let fid = geo.own(f, rank, index, op)?;
                    let bid = geo.own(b, rank, index, op)?;
                    record(&mut pos.f, fid, rank, index, op, FORWARD)?;
                    record(&mut pos.b, bid, rank, index, op, BACKWARD)?;
                }
                Op::Wait => {}
                Op::SendF { chunk, peer }
                | Op::RecvF { chunk, peer }
                | Op::SendB { chunk, peer }
                | Op::RecvB { chunk, peer } => {
                    let id = geo.own(chunk, rank, index, op)?;
                    let want = op.peer_side().and_then(|side| geo.peers.get(chunk, side));
                    let table = match op {
                        Op::SendF { .. } => &mut pos.send_f,
                        Op::RecvF { .. } => &mut pos.recv_f,
                        Op::SendB { .. } => &mut pos.send_b,
                        _ => &mut pos.recv_b,
                    };
                    if want != Some(peer) {
                        return Err(peer_error(geo, rank, index, op, want));
                    }
                    record(table, id, rank, index, op, "the same message")?;
                }
            }
        }
    }
    Ok(pos)
}

const FORWARD: &str = "the forward of this chunk";
const BACKWARD: &str = "the backward of this chunk";
const WEIGHT: &str = "the weight gradient of this chunk";

/// The error of a comm op whose peer is not `want` (the rank of the neighbouring stage when a
/// message is needed at all).
#[cold]
#[inline(never)]
fn peer_error(
    geo: &Geometry<'_>,
    rank: usize,
    index: usize,
    op: &Op,
    want: Option<usize>,
) -> Box<ValidationError> {
    let at = Some((index, op));
    let (chunk, peer) = (
        op.chunk().unwrap_or(Chunk::new(0, 0, 0)),
        op.peer().unwrap_or(0),
    );
    let what = match op {
        Op::SendF { .. } => "activations to the next stage",
        Op::RecvF { .. } => "activations from the previous stage",
        Op::SendB { .. } => "the input gradient to the previous stage",
        _ => "the output gradient from the next stage",
    };
    let ranks = geo.schedule.ranks;
    if peer >= ranks {
        return fail(
            rank,
            at,
            Rule::Peer,
            &format!("peer {peer} does not exist (the schedule has {ranks} ranks)"),
        );
    }
    match want {
        None => fail(
            rank,
            at,
            Rule::Peer,
            &format!(
                "no message carries {what} of stage {} of direction {}: that stage does not \
                 exist or runs on this same rank (a local exchange); remove the op",
                chunk.stage, chunk.dir
            ),
        ),
        Some(q) => fail(
            rank,
            at,
            Rule::Peer,
            &format!(
                "{what} go to or come from rank {q}, which runs the neighbouring stage, not \
                 rank {peer}"
            ),
        ),
    }
}

/// Checks one dependency between ranks of a lowered schedule: the producer `prod` on rank
/// `p` sends after producing, the consumer `cons` on rank `r` receives before consuming.
#[allow(clippy::too_many_arguments)]
fn check_message(
    geo: &Geometry<'_>,
    (send, recv): (u32, u32),
    (produced, consumed): (u32, u32),
    (p, r): (usize, usize),
    (send_name, recv_name): (&str, &str),
    prod: Chunk,
) -> Res<()> {
    match (send == NONE, recv == NONE) {
        (true, true) => Err(fail(
            r,
            Some(geo.op(r, consumed)),
            Rule::MissingMessage,
            &format!(
                "its input from {prod} on rank {p} never arrives: add {recv_name} before it and \
                 {send_name} on rank {p} after the op that produces it"
            ),
        )),
        (true, false) => Err(fail(
            r,
            Some(geo.op(r, recv)),
            Rule::Unmatched,
            &format!("rank {p} has no matching {send_name} of {prod}; add one"),
        )),
        (false, true) => Err(fail(
            p,
            Some(geo.op(p, send)),
            Rule::Unmatched,
            &format!(
                "rank {r} has no matching {recv_name}; add one before the op that consumes it"
            ),
        )),
        (false, false) => {
            if send <= produced {
                return Err(fail(
                    p,
                    Some(geo.op(p, send)),
                    Rule::CommOrder,
                    &format!(
                        "it sends before op {produced} produces the data; move it after that op"
                    ),
                ));
            }
            if recv >= consumed {
                return Err(fail(
                    r,
                    Some(geo.op(r, recv)),
                    Rule::CommOrder,
                    &format!(
                        "it receives after op {consumed} already consumed the data; move it before \
                         that op"
                    ),
                ));
            }
            Ok(())
        }
    }
}

fn check_chunks(geo: &Geometry<'_>, pos: &Positions, lowered: bool) -> Res<()> {
    let n = geo.dirs * geo.stages * geo.per_dir;
    for id in 0..n {
        let c = geo.chunk(id);
        let r = geo.rank(c.dir, c.stage);
        let (f, b, w) = (pos.f[id], pos.b[id], pos.w[id]);
        if f == NONE {
            return Err(fail(
                r,
                None,
                Rule::Missing,
                &format!("the forward (F) of chunk {c} never runs; add it to rank {r}'s program"),
            ));
        }
        if b == NONE {
            return Err(fail(
                r,
                None,
                Rule::Missing,
                &format!(
                    "the backward of chunk {c} never runs; add B, I and W, or an FB to rank {r}'s \
                     program"
                ),
            ));
        }
        if pos.split[id] {
            if w == NONE {
                return Err(fail(
                    r,
                    Some(geo.op(r, b)),
                    Rule::WeightGradient,
                    "this I defers a weight gradient that no later W computes; add W of the \
                     chunk after it",
                ));
            }
            if w < b {
                return Err(fail(
                    r,
                    Some(geo.op(r, w)),
                    Rule::WeightGradient,
                    &format!("it runs before the chunk's I at op {b}; move it after"),
                ));
            }
        } else if w != NONE {
            return Err(fail(
                r,
                Some(geo.op(r, w)),
                Rule::WeightGradient,
                &format!(
                    "the chunk's backward at op {b} is full (it computes the weight gradient \
                     itself), so there is no deferred weight gradient; remove the W or make the \
                     backward an I"
                ),
            ));
        }
        if b <= f {
            return Err(fail(
                r,
                Some(geo.op(r, b)),
                Rule::Dependency,
                &format!(
                    "the backward of chunk {c} runs before (or in the same op as) its own \
                     forward at op {f}"
                ),
            ));
        }
        if c.stage > 0 {
            let prev = Chunk::new(c.dir, c.stage - 1, c.mb);
            let pid = geo.id(prev);
            let p = geo.rank(c.dir, c.stage - 1);
            if p == r {
                if pos.f[pid] >= f {
                    return Err(fail(
                        r,
                        Some(geo.op(r, f)),
                        Rule::Dependency,
                        &format!(
                            "the forward of {c} needs the forward of {prev} first, which runs \
                             later at op {} on this rank",
                            pos.f[pid]
                        ),
                    ));
                }
            } else if lowered {
                check_message(
                    geo,
                    (pos.send_f[pid], pos.recv_f[id]),
                    (pos.f[pid], f),
                    (p, r),
                    ("SEND_F", "RECV_F"),
                    prev,
                )?;
            }
        }
        if c.stage + 1 < geo.stages {
            let next = Chunk::new(c.dir, c.stage + 1, c.mb);
            let nid = geo.id(next);
            let q = geo.rank(c.dir, c.stage + 1);
            if q == r {
                if pos.b[nid] >= b {
                    return Err(fail(
                        r,
                        Some(geo.op(r, b)),
                        Rule::Dependency,
                        &format!(
                            "the backward of {c} needs the backward of {next} first, which runs \
                             later at op {} on this rank",
                            pos.b[nid]
                        ),
                    ));
                }
            } else if lowered {
                check_message(
                    geo,
                    (pos.send_b[nid], pos.recv_b[id]),
                    (pos.b[nid], b),
                    (q, r),
                    ("SEND_B", "RECV_B"),
                    next,
                )?;
            }
        }
    }
    Ok(())
}
