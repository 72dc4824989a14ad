//! The transport over a runtime [`Link`]: MPI between processes, or the in-memory link.

use std::time::{Duration, Instant};

use dualpipe_runtime::Link;

use super::{GradTransport, Incoming, TransportError, TransportStats};
use crate::message::{MsgHeader, HEADER_BYTES};

/// How long a wait polls without sleeping (the link only moves data while its owner polls).
const SPIN: Duration = Duration::from_millis(2);
/// The longest sleep between two polls after that.
const NAP: Duration = Duration::from_micros(200);

/// A data-parallel group on a [`Link`]: member `i` of the group is link rank `members[i]`.
///
/// Give it a link of its own (with MPI: its own communicator, e.g. another
/// `MpiWorld::link()`), not the pipeline endpoint's: every message on it must be a gradient
/// message, and a foreign one is an error.
#[derive(Debug)]
pub struct LinkTransport<L> {
    link: L,
    members: Vec<usize>,
    rank: usize,
    stats: TransportStats,
}

impl<L: Link> LinkTransport<L> {
    /// The group `members` (link ranks, in group order) on `link`; this process must be one
    /// of them.
    pub fn new(link: L, members: Vec<usize>) -> Result<Self, TransportError> {
        let me = link.rank();
        for (i, &m) in members.iter().enumerate() {
            if m >= link.ranks() {
                return Err(TransportError(format!(
                    "data-parallel member {i} is rank {m} but the link has {} ranks",
                    link.ranks()
                )));
            }
            if members[..i].contains(&m) {
                return Err(TransportError(format!(
                    "rank {m} is listed twice in the data-parallel group {members:?}"
                )));
            }
        }
        let rank = members.iter().position(|&m| m == me).ok_or_else(|| {
            TransportError(format!(
                "rank {me} is not in its data-parallel group {members:?}"
            ))
        })?;
        Ok(LinkTransport {
            link,
            members,
            rank,
            stats: TransportStats::default(),
        })
    }

    /// A group of every rank of the link, in rank order.
    pub fn whole(link: L) -> Self {
        let members = (0..link.ranks()).collect();
        let rank = link.rank();
        LinkTransport {
            link,
            members,
            rank,
            stats: TransportStats::default(),
        }
    }

    /// The link underneath.
    pub fn link_mut(&mut self) -> &mut L {
        &mut self.link
    }

    /// Waits up to `deadline` until every posted send has completed; returns whether all did.
    pub fn wait_sent(&mut self, deadline: Instant) -> Result<bool, TransportError> {
        self.link.flush(deadline).map_err(|e| TransportError(e.0))
    }

    fn arrival(&mut self) -> Result<Option<Incoming>, TransportError> {
        let Some((src, header, body)) = self.link.poll().map_err(|e| TransportError(e.0))? else {
            return Ok(None);
        };
        let from = self.members.iter().position(|&m| m == src).ok_or_else(|| {
            TransportError(format!(
                "a message from rank {src}, which is not in this data-parallel group {:?}",
                self.members
            ))
        })?;
        let header = MsgHeader::decode(&header)
            .map_err(|e| TransportError(format!("from rank {src}: {e}")))?;
        Ok(Some(Incoming { from, header, body }))
    }
}

impl<L: Link> GradTransport for LinkTransport<L> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    fn send(&mut self, to: usize, header: MsgHeader, body: Vec<u8>) -> Result<(), TransportError> {
        let dst = *self.members.get(to).ok_or_else(|| {
            TransportError(format!(
                "no worker {to} in a data-parallel group of {}",
                self.members.len()
            ))
        })?;
        let bytes = body.len() as u64;
        self.link
            .post(dst, header.encode(), body)
            .map_err(|e| TransportError(e.0))?;
        self.stats.messages += 1;
        self.stats.body_bytes += bytes;
        self.stats.header_bytes += HEADER_BYTES as u64;
        Ok(())
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Incoming>, TransportError> {
        let began = Instant::now();
        let mut nap = Duration::from_micros(10);
        loop {
            if let Some(m) = self.arrival()? {
                return Ok(Some(m));
            }
            let waited = began.elapsed();
            if waited >= timeout {
                return Ok(None);
            }
            if waited < SPIN || self.link.receiving() {
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap.min(timeout - waited));
                nap = (nap * 2).min(NAP);
            }
        }
    }

    fn stats(&self) -> TransportStats {
        self.stats
    }
}
