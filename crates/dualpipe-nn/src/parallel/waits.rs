//! Process-wide tallies of where an expert-parallel step's time goes around the all-to-alls,
//! for measuring the overlap against the simulator (`scripts/moe_overlap_measure.sh` reads
//! them from the run's JSON, `expert_waits`): the time each all-to-all's receive waited
//! (its peers' parts, then the emulated link's delivery), split by direction (forward or
//! input backward) and by whether it ran inside an overlapped FB pair, and the part of it
//! the link itself imposed (`due`: from its own send to the last peer part's delivery, the
//! latency plus how late the peers sent); the time an overlapped chunk held the pair's
//! compute token; and the time a chunk whose wait was over waited to get the token back (the
//! hand-over), both per chunk (the pair's forward or backward), and the time a chunk waited
//! for the token before its first compute (the other chunk computes first); per pair, the
//! start of its forward chunk's thread and the pair's span (to its later chunk's end).
//!
//! The tallies are global to the process (runs at the same time in one process add into the
//! same sums); [`reset`] starts them over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where an all-to-all ran: its direction and whether inside an overlapped pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitKind {
    /// A forward's dispatch or combine outside an overlapped pair.
    Forward,
    /// An input backward's dispatch or combine outside an overlapped pair.
    Backward,
    /// A forward's all-to-all inside an overlapped pair.
    PairForward,
    /// A backward's all-to-all inside an overlapped pair.
    PairBackward,
}

/// Which chunk of an overlapped FB pair a thread computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairChunk {
    /// The forward chunk.
    Forward,
    /// The backward chunk.
    Backward,
}

/// A sum of durations and how many were added.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    /// Total seconds.
    pub seconds: f64,
    /// How many durations.
    pub count: u64,
}

impl Tally {
    /// The mean duration in seconds (0 when nothing was added).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.seconds / self.count as f64
        }
    }

    /// Both tallies together.
    pub fn plus(self, other: Tally) -> Tally {
        Tally {
            seconds: self.seconds + other.seconds,
            count: self.count + other.count,
        }
    }
}

/// A snapshot of the tallies (see the module's doc).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Waits {
    /// All-to-all receives of lone forwards.
    pub forward: Tally,
    /// All-to-all receives of lone input backwards.
    pub backward: Tally,
    /// All-to-all receives of forwards inside overlapped pairs.
    pub pair_forward: Tally,
    /// All-to-all receives of backwards inside overlapped pairs.
    pub pair_backward: Tally,
    /// Token holds: one per chunk of an overlapped pair, the seconds it computed (both
    /// chunks: `held_forward` plus `held_backward`).
    pub token_held: Tally,
    /// Token hand-overs: one per all-to-all inside a pair, the seconds from the end of its
    /// wait to getting the token back (both chunks).
    pub token_regain: Tally,
    /// [`Waits::token_held`] of the pairs' forward chunks.
    pub held_forward: Tally,
    /// [`Waits::token_held`] of the pairs' backward chunks.
    pub held_backward: Tally,
    /// [`Waits::token_regain`] of the pairs' forward chunks' all-to-alls.
    pub regain_forward: Tally,
    /// [`Waits::token_regain`] of the pairs' backward chunks' all-to-alls.
    pub regain_backward: Tally,
    /// Per forward chunk of an overlapped pair: the seconds it waited for the token before
    /// it first computed (the backward chunk had it).
    pub start_forward: Tally,
    /// [`Waits::start_forward`] of the backward chunks.
    pub start_backward: Tally,
    /// Per overlapped pair: the seconds from the pair's start until its forward chunk's
    /// thread ran (the backward chunk runs on the calling thread).
    pub thread_start: Tally,
    /// Per overlapped pair: the seconds from its start to the end of its later chunk.
    pub pair_span: Tally,
    /// Per all-to-all of a lone forward over an emulated link: the link's own part of the
    /// wait, from this worker's send to the delivery of the last peer part (the latency
    /// plus how much later than this worker the last peer sent; 0 when everything was
    /// already delivered). The rest of the wait is the receiving thread's own lateness.
    pub forward_due: Tally,
    /// [`Waits::forward_due`] of lone input backwards.
    pub backward_due: Tally,
    /// [`Waits::forward_due`] of the forward chunks of overlapped pairs.
    pub pair_forward_due: Tally,
    /// [`Waits::forward_due`] of the backward chunks of overlapped pairs.
    pub pair_backward_due: Tally,
}

struct Sum {
    nanos: AtomicU64,
    count: AtomicU64,
}

impl Sum {
    const fn new() -> Self {
        Sum {
            nanos: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    fn add(&self, d: Duration) {
        self.nanos.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> Tally {
        Tally {
            seconds: self.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            count: self.count.load(Ordering::Relaxed),
        }
    }

    fn reset(&self) {
        self.nanos.store(0, Ordering::Relaxed);
        self.count.store(0, Ordering::Relaxed);
    }
}

static SUMS: [Sum; 16] = [const { Sum::new() }; 16];
/// Where each tally lives in [`SUMS`]: the waits by [`WaitKind`] first, then the link's
/// part of them by kind, the holds, the hand-overs and the first waits for the token by
/// chunk, then the pairs' thread starts and spans.
const DUE: usize = 4;
const HELD: usize = 8;
const REGAIN: usize = 10;
const START: usize = 12;
const THREAD: usize = 14;
const SPAN: usize = 15;

/// Adds one all-to-all receive's wait.
pub(crate) fn add_wait(kind: WaitKind, d: Duration) {
    SUMS[kind as usize].add(d);
}

/// Adds the link's own part of one all-to-all receive's wait, in seconds.
pub(crate) fn add_due(kind: WaitKind, seconds: f64) {
    SUMS[DUE + kind as usize].add(Duration::from_secs_f64(seconds));
}

pub(crate) fn add_held(chunk: PairChunk, d: Duration) {
    SUMS[HELD + chunk as usize].add(d);
}

pub(crate) fn add_regain(chunk: PairChunk, d: Duration) {
    SUMS[REGAIN + chunk as usize].add(d);
}

pub(crate) fn add_start(chunk: PairChunk, d: Duration) {
    SUMS[START + chunk as usize].add(d);
}

pub(crate) fn add_thread_start(d: Duration) {
    SUMS[THREAD].add(d);
}

pub(crate) fn add_pair_span(d: Duration) {
    SUMS[SPAN].add(d);
}

/// The tallies so far.
pub fn snapshot() -> Waits {
    let get = |i: usize| SUMS[i].get();
    Waits {
        forward: get(0),
        backward: get(1),
        pair_forward: get(2),
        pair_backward: get(3),
        token_held: get(HELD).plus(get(HELD + 1)),
        token_regain: get(REGAIN).plus(get(REGAIN + 1)),
        held_forward: get(HELD),
        held_backward: get(HELD + 1),
        regain_forward: get(REGAIN),
        regain_backward: get(REGAIN + 1),
        start_forward: get(START),
        start_backward: get(START + 1),
        thread_start: get(THREAD),
        pair_span: get(SPAN),
        forward_due: get(DUE),
        backward_due: get(DUE + 1),
        pair_forward_due: get(DUE + 2),
        pair_backward_due: get(DUE + 3),
    }
}

/// Starts every tally over at zero.
pub fn reset() {
    SUMS.iter().for_each(Sum::reset);
}
