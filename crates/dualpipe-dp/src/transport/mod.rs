//! Point-to-point bytes between the members of a data-parallel group.
//!
//! A [`GradTransport`] only moves (header, body) pairs and counts what it sends; the logical
//! clock (buffering early arrivals, refusing stale and duplicate ones) sits above it, in the
//! exchange, so every transport gets the same rules. Three implementations:
//!
//! - [`ChannelTransport`]: threads of one process, over in-process channels;
//! - [`LinkTransport`]: over any runtime [`Link`](dualpipe_runtime::Link) (MPI with the
//!   runtime's `mpi` feature, or its in-memory `ChannelLink`), the header encoded as bytes;
//! - [`Reordering`]: a wrapper that delays and reorders another transport's messages with a
//!   seeded generator (for tests of the clock).

mod channel;
mod link;
mod reorder;

use std::time::Duration;

pub use channel::ChannelTransport;
pub use link::LinkTransport;
pub use reorder::Reordering;

use crate::message::MsgHeader;

/// A message as it arrived: the sender (its index in the group), header and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// The sender's index in the group.
    pub from: usize,
    /// The header.
    pub header: MsgHeader,
    /// The encoded values.
    pub body: Vec<u8>,
}

/// What a transport has sent so far (counted as it sends, not computed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Messages sent.
    pub messages: u64,
    /// Body bytes sent: the encoded gradients (`grad_bytes_sent`).
    pub body_bytes: u64,
    /// Header bytes sent (46 per message where the header crosses as bytes, 0 in-process).
    pub header_bytes: u64,
}

/// A failure of the transport itself (a peer that has gone, a link error, a foreign message).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TransportError(pub String);

/// Moves gradient messages between the `size()` members of one data-parallel group.
pub trait GradTransport {
    /// This worker's index in the group.
    fn rank(&self) -> usize;

    /// Number of workers in the group.
    fn size(&self) -> usize;

    /// Starts sending `body` under `header` to member `to`; never waits for the receiver.
    fn send(&mut self, to: usize, header: MsgHeader, body: Vec<u8>) -> Result<(), TransportError>;

    /// The next message that has arrived, waiting at most `timeout` (`None` when none came).
    fn recv(&mut self, timeout: Duration) -> Result<Option<Incoming>, TransportError>;

    /// What has been sent so far.
    fn stats(&self) -> TransportStats;

    /// Releases anything the transport holds back (a test wrapper's delayed messages); the
    /// exchange calls it when a step's exchange is finished. Real transports need nothing.
    fn flush(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
}

impl<X: GradTransport + ?Sized> GradTransport for Box<X> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn send(&mut self, to: usize, header: MsgHeader, body: Vec<u8>) -> Result<(), TransportError> {
        (**self).send(to, header, body)
    }
    fn recv(&mut self, timeout: Duration) -> Result<Option<Incoming>, TransportError> {
        (**self).recv(timeout)
    }
    fn stats(&self) -> TransportStats {
        (**self).stats()
    }
    fn flush(&mut self) -> Result<(), TransportError> {
        (**self).flush()
    }
}
