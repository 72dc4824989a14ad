//! The validator: proves a schedule complete, causal, matched and deadlock-free.
//!
//! [`validate`] checks, in this order:
//!
//! 1. **Shape** (`shape`): one program per rank, a placement over the schedule's ranks,
//!    micro-batches that split evenly over the directions.
//! 2. **Per op** (`ops`; rank by rank, op by op): every chunk lies inside the schedule
//!    ([`Rule::ChunkRange`]) and on the rank the placement gives its stage ([`Rule::Placement`]);
//!    no chunk's forward, backward or weight gradient runs twice ([`Rule::Duplicate`]); every
//!    communication op names the right peer and a message some dependency needs ([`Rule::Peer`]).
//! 3. **Per chunk** (`chunks`): one forward and one full backward (`B`, the backward of an `FB`, or
//!    `I` followed later by `W`) ([`Rule::Missing`], [`Rule::WeightGradient`]); on one rank, the
//!    forward of stage `s` after that of stage `s - 1`, the backward of `s` after that of `s + 1`
//!    and after its own forward ([`Rule::Dependency`]). In a lowered schedule every dependency
//!    between two ranks has its `SEND` after the producing op and its `RECV` before the consuming
//!    op ([`Rule::MissingMessage`], [`Rule::Unmatched`], [`Rule::CommOrder`]).
//! 4. **Execution** (`execution`): the programs run to completion when sends never block and a
//!    compute op waits for its inputs from other ranks (for a lowered schedule: for the message;
//!    `WAIT` waits for every receive posted before it). This is an event-driven run, O(total ops);
//!    when it sticks, the error names a cycle of waiting ranks and their ops ([`Rule::Deadlock`]).
//!
//! A schedule is *lowered* when it holds any communication op; a compute-only schedule's
//! dependencies between ranks are then waited for directly.

use std::fmt;

mod chunks;
mod execution;
mod ops;
mod shape;

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

/// Checks every rule of a schedule; see the [module documentation](self) for the rules.
pub fn validate(schedule: &Schedule) -> Result<(), ValidationError> {
    let check = || -> Res<()> {
        let geo = shape::check_shape(schedule)?;
        let pos = ops::check_ops(&geo)?;
        let lowered = schedule.is_lowered();
        chunks::check_chunks(&geo, &pos, lowered)?;
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
