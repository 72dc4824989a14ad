//! MPI's own non-blocking sum over a communicator (`MPI_Iallreduce` with `MPI_SUM`), for the
//! uncompressed data-parallel gradient exchange (feature `mpi`).
//!
//! [`MpiSum::start`] takes the values by value and keeps them, with the buffer the sum lands
//! in, beside the request until MPI reports it complete ([`PendingSum::test`]), so MPI never
//! reads or writes freed memory; a sum dropped before it completed (a peer is gone) leaks its
//! buffers instead of freeing them under MPI. MPI makes progress on the sum only inside MPI
//! calls (no progress thread is assumed): test it between other work.

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::datatype::Equivalence;
use mpi::request::{Request, StaticScope};
use mpi::topology::{Communicator, SimpleCommunicator};

use super::mpi::{extend, extend_mut};

/// The element types MPI can sum (`f32`, `f64`, the integers): the `mpi` crate's
/// `Equivalence`, re-exported so users need not depend on that crate.
pub use mpi::datatype::Equivalence as MpiValue;

/// A group of processes (a communicator) summing arrays with `MPI_Iallreduce`.
pub struct MpiSum {
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
}

// SAFETY: as for `MpiLink`: an `MpiSum` owns its communicator, is never shared (no `Sync`),
// and every MPI call it makes happens on the one thread that holds it, which the trainer keeps
// to the thread that initialised MPI (under Open MPI the handle is a pointer, which alone
// keeps the compiler from seeing that).
unsafe impl Send for MpiSum {}

impl std::fmt::Debug for MpiSum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiSum")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl MpiSum {
    /// Sums over the members of `comm`.
    pub fn new(comm: SimpleCommunicator) -> Self {
        MpiSum {
            rank: comm.rank() as usize,
            size: comm.size() as usize,
            comm,
        }
    }

    /// This process's index in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Starts the element-wise sum of `values` over the group (`MPI_Iallreduce`, `MPI_SUM`);
    /// never waits. Every member must start the same sums (same lengths) in the same order.
    /// The order of the additions is MPI's.
    pub fn start<T: Equivalence + Copy + Default + 'static>(
        &self,
        values: Vec<T>,
    ) -> PendingSum<T> {
        let mut sum = vec![T::default(); values.len()];
        // SAFETY: `values` and `sum` move into the `PendingSum` next to the request; their heap
        // blocks stay put, are not touched until the request completed, and are leaked rather
        // than freed if it never does (see `Drop`).
        let (send, recv) = unsafe { (extend(&values), extend_mut(&mut sum)) };
        let request =
            self.comm
                .immediate_all_reduce_into(StaticScope, send, recv, SystemOperation::sum());
        PendingSum {
            request: Some(request),
            values,
            sum,
        }
    }
}

/// A sum in flight: the request and the buffers it reads and writes.
pub struct PendingSum<T: Equivalence + 'static> {
    request: Option<Request<'static, [T]>>,
    values: Vec<T>,
    sum: Vec<T>,
}

// SAFETY: as for `MpiSum`: the request is only tested on the thread that initialised MPI.
unsafe impl<T: Equivalence + Send + 'static> Send for PendingSum<T> {}

impl<T: Equivalence + 'static> std::fmt::Debug for PendingSum<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingSum")
            .field("values", &self.values.len())
            .field("complete", &self.request.is_none())
            .finish()
    }
}

impl<T: Equivalence + 'static> PendingSum<T> {
    /// Whether the sum is complete (`MPI_Test`, which also moves it on); never waits.
    pub fn test(&mut self) -> bool {
        if let Some(request) = self.request.take() {
            if let Err(request) = request.test() {
                self.request = Some(request);
            }
        }
        self.request.is_none()
    }

    /// The sum, once [`PendingSum::test`] said it is complete (`None` before).
    pub fn take(&mut self) -> Option<Vec<T>> {
        self.request
            .is_none()
            .then(|| std::mem::take(&mut self.sum))
    }
}

impl<T: Equivalence + 'static> Drop for PendingSum<T> {
    fn drop(&mut self) {
        // A request that never completed (a peer is gone) cannot be freed safely: leak it and
        // its buffers rather than let MPI touch freed memory.
        if let Some(request) = self.request.take() {
            std::mem::forget(request);
            std::mem::forget(std::mem::take(&mut self.values));
            std::mem::forget(std::mem::take(&mut self.sum));
        }
    }
}
