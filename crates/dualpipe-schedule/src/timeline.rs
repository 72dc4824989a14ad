//! Timelines: what ran where and when, simulated or measured.
//!
//! The simulator (`dualpipe-sim`) produces a [`Timeline`]; the runtime records one while it
//! really runs a step. The vocabulary lives here, below both, so the runtime needs no simulator. Metrics, pictures and traces take a timeline, so "predicted vs measured" compares
//! two values of one type. Times are seconds from the start of the step.

use crate::{Chunk, Op};

/// One compute op (F, B, I, W or FB) as it ran on a rank.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputeInterval {
    /// The compute op (never a communication op).
    pub op: Op,
    /// Start time in seconds.
    pub start: f64,
    /// End time in seconds.
    pub end: f64,
}

/// Whether a message carries forward activations or backward gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// Activations of a forward.
    Forward,
    /// Gradients of a backward.
    Backward,
}

/// One message on the wire, from the sender's send to the receiver's arrival.
#[derive(Clone, Debug, PartialEq)]
pub struct MessageInterval {
    /// Sending rank.
    pub src: usize,
    /// Receiving rank.
    pub dst: usize,
    /// Activations or gradients.
    pub kind: MessageKind,
    /// The producer chunk on the sending rank.
    pub src_chunk: Chunk,
    /// The consumer chunk on the receiving rank.
    pub dst_chunk: Chunk,
    /// When the message left (seconds).
    pub start: f64,
    /// When it had fully arrived (seconds).
    pub end: f64,
}

/// Per-rank compute intervals and every message of one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    /// `compute[rank]`: that rank's compute intervals in start order.
    pub compute: Vec<Vec<ComputeInterval>>,
    /// Every message, in no particular order.
    pub messages: Vec<MessageInterval>,
    /// `comm_wait[rank]`: seconds that rank's compute stream spent blocked on a receive.
    pub comm_wait: Vec<f64>,
}

impl Timeline {
    /// An empty timeline for `ranks` ranks.
    pub fn new(ranks: usize) -> Self {
        Timeline {
            compute: vec![Vec::new(); ranks],
            messages: Vec::new(),
            comm_wait: vec![0.0; ranks],
        }
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.compute.len()
    }

    /// The end of the last interval, compute or message (0 for an empty timeline).
    pub fn makespan(&self) -> f64 {
        let compute = self.compute.iter().flatten().map(|i| i.end);
        let messages = self.messages.iter().map(|m| m.end);
        compute.chain(messages).fold(0.0, f64::max)
    }
}
