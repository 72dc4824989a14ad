//! Error-feedback buffers: what compression dropped, kept per worker and per shard owner.

use crate::layout::BucketLayout;
use crate::{DpError, GradFloat};

/// The error-feedback state of one worker's exchange (optimizer state: checkpoints save it).
///
/// `worker[b]` is what this worker's compression of bucket `b` dropped (one value per value
/// of the bucket); `server[b]` what its compression of the averaged shard it owns dropped (one
/// value per value of that shard). An empty vector means zeros (nothing compressed yet). The
/// server part depends on the group size and this worker's place in it: after a change of
/// grid, start from [`ErrorFeedbackState::default`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ErrorFeedbackState<T> {
    /// Per bucket, the worker-side residual.
    pub worker: Vec<Vec<T>>,
    /// Per bucket, the server-side residual of this worker's shard.
    pub server: Vec<Vec<T>>,
}

impl<T: GradFloat> ErrorFeedbackState<T> {
    /// Zeros (empty buffers) for `buckets` buckets.
    pub fn empty(buckets: usize) -> Self {
        ErrorFeedbackState {
            worker: vec![Vec::new(); buckets],
            server: vec![Vec::new(); buckets],
        }
    }

    /// Checks that the state fits `layout` for worker `rank` of `workers`.
    pub fn check(&self, layout: &BucketLayout, rank: usize, workers: usize) -> Result<(), DpError> {
        let buckets = layout.buckets();
        if self.worker.len() != buckets || self.server.len() != buckets {
            return Err(DpError::FeedbackState(format!(
                "it has {} worker and {} server buffers but the layout has {buckets} buckets",
                self.worker.len(),
                self.server.len()
            )));
        }
        for b in 0..buckets {
            let (w, s) = (self.worker[b].len(), self.server[b].len());
            let (want_w, want_s) = (layout.len(b), layout.shard(b, rank, workers).len());
            if (w != 0 && w != want_w) || (s != 0 && s != want_s) {
                return Err(DpError::FeedbackState(format!(
                    "bucket {b}: {w} worker and {s} server values, expected {want_w} and \
                     {want_s} (a checkpoint of another model or grid shape? reset the \
                     error feedback)"
                )));
            }
        }
        Ok(())
    }
}

/// `buffer` as a residual of `len` values (allocated as zeros on first use).
pub(crate) fn residual<T: GradFloat>(buffer: &mut Vec<T>, len: usize) -> &mut [T] {
    if buffer.len() != len {
        buffer.clear();
        buffer.resize(len, T::ZERO);
    }
    buffer
}
