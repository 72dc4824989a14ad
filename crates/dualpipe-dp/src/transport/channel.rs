//! The in-process transport: one channel inbox per worker thread.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use super::{GradTransport, Incoming, TransportError, TransportStats};
use crate::message::MsgHeader;

/// One worker's end of an in-process group: bodies move through channels without a copy.
#[derive(Debug)]
pub struct ChannelTransport {
    rank: usize,
    peers: Vec<Sender<Incoming>>,
    inbox: Receiver<Incoming>,
    stats: TransportStats,
}

impl ChannelTransport {
    /// The ends of a group of `size` workers, connected to each other; hand one to each thread.
    pub fn group(size: usize) -> Vec<ChannelTransport> {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..size).map(|_| channel()).unzip();
        receivers
            .into_iter()
            .enumerate()
            .map(|(rank, inbox)| ChannelTransport {
                rank,
                peers: senders.clone(),
                inbox,
                stats: TransportStats::default(),
            })
            .collect()
    }

    /// Puts a message into this worker's own inbox as if `from` had sent it (tests of stale,
    /// duplicate and foreign messages).
    pub fn inject(&self, from: usize, header: MsgHeader, body: Vec<u8>) {
        let _ = self.peers[self.rank].send(Incoming { from, header, body });
    }
}

impl GradTransport for ChannelTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.peers.len()
    }

    fn send(&mut self, to: usize, header: MsgHeader, body: Vec<u8>) -> Result<(), TransportError> {
        let peer = self.peers.get(to).ok_or_else(|| {
            TransportError(format!(
                "no worker {to} in a data-parallel group of {}",
                self.peers.len()
            ))
        })?;
        let bytes = body.len() as u64;
        peer.send(Incoming {
            from: self.rank,
            header,
            body,
        })
        .map_err(|_| TransportError(format!("worker {to} of the data-parallel group has gone")))?;
        self.stats.messages += 1;
        self.stats.body_bytes += bytes;
        Ok(())
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Incoming>, TransportError> {
        match self.inbox.recv_timeout(timeout) {
            Ok(m) => Ok(Some(m)),
            // This end holds a sender to its own inbox, so it never disconnects.
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => Ok(None),
        }
    }

    fn stats(&self) -> TransportStats {
        self.stats
    }
}
