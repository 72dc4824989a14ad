//! Arrays of `f64` between the members of one communicator, by MPI point-to-point (feature
//! `mpi`): the transport of an expert all-to-all over MPI.
//!
//! [`MpiPeers::send`] starts an `MPI_Isend` and keeps the array beside its request until MPI
//! reports it complete; [`MpiPeers::try_receive`] takes the next message a member sent, if it
//! has arrived (`MPI_Improbe`, then its receive), never waiting for one. MPI's
//! non-overtaking order keeps one member's messages in the order it sent them. Nothing here
//! waits: the caller polls, and serialises the calls of several threads itself (the process
//! must have MPI at `MPI_THREAD_SERIALIZED` or above for that, see
//! [`MpiWorld::threads_serialized`](super::mpi::MpiWorld::threads_serialized)).

use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::request::{Request, StaticScope};
use mpi::topology::{Communicator, SimpleCommunicator};

use super::mpi::extend;

/// The MPI tag of every message of an [`MpiPeers`] (its communicator is its own).
const TAG: i32 = 0x4452;

/// A send in flight: the request and the array it reads.
struct Sending {
    request: Option<Request<'static, [f64]>>,
    values: Vec<f64>,
}

/// One member's end of a communicator carrying arrays of `f64` to and from the others.
pub struct MpiPeers {
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
    sends: Vec<Sending>,
}

// SAFETY: an `MpiPeers` owns its communicator and its requests and is never shared (no
// `Sync`). It moves to the thread that uses it; the user makes no two MPI calls at once
// (a lock around every call) and the process runs MPI at `MPI_THREAD_SERIALIZED` or above.
// Under Open MPI the handles are pointers, which alone keep the compiler from seeing that.
unsafe impl Send for MpiPeers {}

impl std::fmt::Debug for MpiPeers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiPeers")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("sends_in_flight", &self.sends.len())
            .finish()
    }
}

impl MpiPeers {
    /// The members of `comm`.
    pub fn new(comm: SimpleCommunicator) -> Self {
        MpiPeers {
            rank: comm.rank() as usize,
            size: comm.size() as usize,
            comm,
            sends: Vec::new(),
        }
    }

    /// This process's index among the members.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of members.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Starts sending `values` to member `dst` (`MPI_Isend`); never waits. `dst` must be
    /// another member, below [`MpiPeers::size`].
    pub fn send(&mut self, dst: usize, values: Vec<f64>) {
        // SAFETY: `values` moves into `self.sends` next to its request; its heap block stays
        // put and is freed only after the request completed (or leaked, see `Drop`).
        let view = unsafe { extend(&values) };
        let request = self
            .comm
            .process_at_rank(dst as i32)
            .immediate_send_with_tag(StaticScope, view, TAG);
        self.sends.push(Sending {
            request: Some(request),
            values,
        });
    }

    /// The next message member `src` sent, if it has arrived; never waits for one.
    pub fn try_receive(&mut self, src: usize) -> Option<Vec<f64>> {
        let (message, status) = self
            .comm
            .process_at_rank(src as i32)
            .immediate_matched_probe_with_tag(TAG)?;
        let (values, _) = (message, status).matched_receive_vec::<f64>();
        Some(values)
    }

    /// Whether every send has completed (`MPI_Test` on each, which also moves them on).
    pub fn sends_done(&mut self) -> bool {
        self.sends.retain_mut(|send| {
            if let Some(request) = send.request.take() {
                if let Err(request) = request.test() {
                    send.request = Some(request);
                }
            }
            send.request.is_some()
        });
        self.sends.is_empty()
    }
}

impl Drop for MpiPeers {
    fn drop(&mut self) {
        // A send that never completed (a peer is gone) cannot be freed safely: leak its
        // request and array rather than let MPI read freed memory.
        if !self.sends_done() {
            for send in self.sends.drain(..) {
                std::mem::forget(send.request);
                std::mem::forget(send.values);
            }
        }
    }
}
