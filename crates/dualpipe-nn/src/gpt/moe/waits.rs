//! Process-wide tallies of where an expert-parallel step's time goes around the all-to-alls,
//! for measuring the overlap against the simulator (`scripts/moe_overlap_measure.sh` reads
//! them from the run's JSON, `expert_waits`): the time each all-to-all's receive waited
//! (its peers' parts, then the emulated link's delivery), split by direction (forward or
//! input backward) and by whether it ran inside an overlapped FB pair; the time an
//! overlapped chunk held the pair's compute token; and the time a chunk whose wait was over
//! waited to get the token back (the hand-over).
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
    /// Token holds: one per chunk of an overlapped pair, the seconds it computed.
    pub token_held: Tally,
    /// Token hand-overs: one per all-to-all inside a pair, the seconds from the end of its
    /// wait to getting the token back.
    pub token_regain: Tally,
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

static SUMS: [Sum; 6] = [
    Sum::new(),
    Sum::new(),
    Sum::new(),
    Sum::new(),
    Sum::new(),
    Sum::new(),
];
const HELD: usize = 4;
const REGAIN: usize = 5;

/// Adds one all-to-all receive's wait.
pub(crate) fn add_wait(kind: WaitKind, d: Duration) {
    SUMS[kind as usize].add(d);
}

pub(crate) fn add_held(d: Duration) {
    SUMS[HELD].add(d);
}

pub(crate) fn add_regain(d: Duration) {
    SUMS[REGAIN].add(d);
}

/// The tallies so far.
pub fn snapshot() -> Waits {
    Waits {
        forward: SUMS[0].get(),
        backward: SUMS[1].get(),
        pair_forward: SUMS[2].get(),
        pair_backward: SUMS[3].get(),
        token_held: SUMS[HELD].get(),
        token_regain: SUMS[REGAIN].get(),
    }
}

/// Starts every tally over at zero.
pub fn reset() {
    SUMS.iter().for_each(Sum::reset);
}
