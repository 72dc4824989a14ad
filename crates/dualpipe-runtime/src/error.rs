//! The runtime's error type: one clear message naming the rank, the op and the cause.

use std::any::Any;
use std::time::Duration;

/// Why a step could not run or did not finish.
///
/// Every variant that happens while ranks run names the rank and the op, so one line tells
/// where the step broke and why. When one rank fails, every other rank stops too and
/// [`run_step`](crate::run_step) returns the first failure only.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuntimeError {
    /// The schedule and the stages handed to the executor do not fit together (wrong number
    /// of ranks, a missing stage, a schedule that was not lowered, a peer that does not match
    /// the placement). Nothing ran.
    #[error("invalid setup: {0}")]
    Setup(String),
    /// A stage returned an error.
    #[error("rank {rank}: {op} failed: {cause}")]
    StageFailed {
        /// The rank whose stage failed.
        rank: usize,
        /// The op, e.g. `F (dir 0, stage 2, mb 3)`.
        op: String,
        /// The stage's own message.
        cause: String,
    },
    /// A stage panicked; the panic was caught and turned into this error.
    #[error("rank {rank}: {op} panicked: {message}")]
    StagePanicked {
        /// The rank whose stage panicked.
        rank: usize,
        /// The op, e.g. `B (dir 1, stage 0, mb 2)`.
        op: String,
        /// The panic message.
        message: String,
    },
    /// A message a compute op needs never arrived.
    #[error(
        "rank {rank}: timed out after {timeout:?} waiting for {what} from rank {peer} \
         (a peer is slow or its program never sends it; raise recv_timeout \
         if stages are slow)"
    )]
    Timeout {
        /// The waiting rank.
        rank: usize,
        /// What it waited for, e.g. `RECV_F (dir 0, stage 1, mb 0)`.
        what: String,
        /// The rank that should have sent it.
        peer: usize,
        /// How long it waited.
        timeout: Duration,
    },
    /// The program broke the message protocol while running (a send of something not yet
    /// computed, a duplicate message, an input that can never arrive, a stage output of the
    /// wrong kind). A validated schedule and a correct stage never cause this.
    #[error("rank {rank}: {op}: {message}")]
    Protocol {
        /// The rank whose program broke the protocol.
        rank: usize,
        /// The op being run.
        op: String,
        /// What went wrong.
        message: String,
    },
    /// Another process of a multi-process run failed; this rank stopped because of it.
    #[error("rank {rank}: stopped because rank {failed_rank} failed: {message}")]
    PeerFailed {
        /// The rank that stopped.
        rank: usize,
        /// The rank that failed.
        failed_rank: usize,
        /// The failed rank's own error.
        message: String,
    },
    /// The transport between processes failed, or a message was malformed or out of step.
    #[error("rank {rank}: {op}: transport failure: {message}")]
    Transport {
        /// The rank that saw the failure.
        rank: usize,
        /// The op being run (or the collective, e.g. `loss reduction`).
        op: String,
        /// What went wrong.
        message: String,
    },
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}
