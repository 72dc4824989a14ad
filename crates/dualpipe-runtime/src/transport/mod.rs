//! How tensors move between ranks.
//!
//! Two ways, one interface for the executor (the crate-internal `Transport` trait, keyed by
//! the consuming chunk):
//!
//! * `local` (crate-internal): one thread per rank in one process; tensors cross through
//!   in-process channels without being copied or encoded.
//! * [`endpoint`]: one rank per process. An [`Endpoint`](endpoint::Endpoint) stamps, matches
//!   and buffers messages on a [`Link`](endpoint::Link) that only moves bytes;
//!   [`wire`] is the byte format of those messages (stamps, tensors as dtype, shape and bytes);
//!   `mpi` (feature `mpi`) is the link over MPI point-to-point (and `mpi_sum` MPI's own
//!   non-blocking all-reduce, for the data-parallel gradient exchange), and
//!   [`ChannelLink`](endpoint::ChannelLink) an in-memory link for tests.
//!
//! [`peer_watch`] names a lost process: each process of a job watches its peers on the same
//! machine and says which rank ended.

use std::time::{Duration, Instant};

use dualpipe_schedule::Chunk;
use dualpipe_schedule::MessageKind;

use crate::RuntimeError;

pub mod endpoint;
pub(crate) mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "mpi")]
pub mod mpi_peers;
#[cfg(feature = "mpi")]
pub mod mpi_sum;
pub mod peer_watch;
pub mod wire;

/// What a message carries, named by the chunk that consumes it.
///
/// Forward messages are keyed by the receiving forward's chunk, backward messages by the
/// receiving backward's chunk, so (kind, dir, stage, mb) names exactly one message per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    /// Activations or gradients.
    pub kind: MessageKind,
    /// The consumer chunk on the receiving rank.
    pub chunk: Chunk,
}

/// Why a receive ended without its tensor.
pub(crate) enum WaitError {
    /// The step was aborted by another rank.
    Aborted,
    /// The deadline passed.
    TimedOut,
    /// A message with the same key arrived twice.
    Duplicate(Key, usize),
    /// Another process failed and said so (multi-process transports know who).
    PeerFailed {
        /// The failed rank.
        rank: usize,
        /// Its error.
        message: String,
    },
    /// The transport itself failed, or a message was malformed or stale.
    Transport(String),
}

/// What the executor needs from a transport, seen from one rank.
///
/// Two implementations: [`LocalTransport`](local::LocalTransport) (in-process channels, one
/// thread per rank) and the multi-process executor's view of an
/// [`Endpoint`](endpoint::Endpoint) on a [`Link`](endpoint::Link) such as MPI (one process per
/// rank). Sends never block;
/// receives are posted early: what arrives first is buffered by its key.
pub(crate) trait Transport<T> {
    /// Sends `tensor` for `key` to rank `dst`.
    fn send(&mut self, dst: usize, key: Key, tensor: T) -> Result<(), WaitError>;

    /// The tensor for `key` with its sender, if it has already arrived; never waits.
    fn try_take(&mut self, key: Key) -> Result<Option<(usize, T)>, WaitError>;

    /// Waits for the tensor for `key` until `deadline`, waking at least every `poll` to see
    /// whether another rank failed.
    fn take(
        &mut self,
        key: Key,
        deadline: Instant,
        poll: Duration,
    ) -> Result<(usize, T), WaitError>;

    /// Whether another rank failed (a remote transport also picks up arrivals here).
    fn aborted(&mut self) -> bool;

    /// Reports this rank's failure to every rank.
    fn fail(&mut self, err: RuntimeError);

    /// The rank that failed and its message, when the transport knows (a remote transport
    /// learns it from the failed rank's notice; the local one keeps the error itself).
    fn failed_peer(&mut self) -> Option<(usize, String)> {
        None
    }
}
