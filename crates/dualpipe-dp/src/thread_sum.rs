//! [`ThreadSum`]: an [`AllReduce`] group of threads in one process, adding the members'
//! values in member order (`((v_0 + v_1) + v_2) + ...`) — the in-process stand-in for MPI's
//! all-reduce, as [`ChannelTransport`](crate::ChannelTransport) is for point-to-point.

use std::sync::{Arc, Mutex, PoisonError};

use crate::native::{AllReduce, SumInFlight};
use crate::transport::TransportError;
use crate::GradFloat;

/// Every member's contributions to every sum started so far, by sum index.
type Board<T> = Arc<Mutex<Vec<Vec<Option<Vec<T>>>>>>;

/// One member of an in-process group ([`ThreadSum::group`]).
#[derive(Debug)]
pub struct ThreadSum<T> {
    rank: usize,
    size: usize,
    started: usize,
    board: Board<T>,
}

impl<T: GradFloat> ThreadSum<T> {
    /// The `size` members of one group, member `i` at index `i`.
    pub fn group(size: usize) -> Vec<ThreadSum<T>> {
        let board: Board<T> = Arc::default();
        (0..size)
            .map(|rank| ThreadSum {
                rank,
                size,
                started: 0,
                board: Arc::clone(&board),
            })
            .collect()
    }
}

fn poisoned<E>(_: PoisonError<E>) -> TransportError {
    TransportError("a member of the in-process sum panicked".into())
}

struct Pending<T> {
    index: usize,
    board: Board<T>,
}

impl<T: GradFloat> SumInFlight<T> for Pending<T> {
    fn poll(&mut self) -> Result<Option<Vec<T>>, TransportError> {
        let board = self.board.lock().map_err(poisoned)?;
        let parts = &board[self.index];
        if parts.iter().any(Option::is_none) {
            return Ok(None);
        }
        let mut parts = parts.iter().flatten();
        let mut acc = parts.next().cloned().unwrap_or_default();
        for p in parts {
            acc.iter_mut().zip(p).for_each(|(a, &v)| *a = *a + v);
        }
        Ok(Some(acc))
    }
}

impl<T: GradFloat> AllReduce<T> for ThreadSum<T> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn start(&mut self, values: Vec<T>) -> Result<Box<dyn SumInFlight<T>>, TransportError> {
        let index = self.started;
        self.started += 1;
        let mut board = self.board.lock().map_err(poisoned)?;
        while board.len() <= index {
            board.push(vec![None; self.size]);
        }
        board[index][self.rank] = Some(values);
        Ok(Box::new(Pending {
            index,
            board: Arc::clone(&self.board),
        }))
    }
    fn name(&self) -> &'static str {
        "thread-sum"
    }
}
