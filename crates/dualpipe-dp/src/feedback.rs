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

impl<T: GradFloat> ErrorFeedbackState<T> {
    /// The state of worker `rank` of a group of `workers` that takes over from `saved`, the
    /// states of every worker of a group of another size (listed by worker) with the same
    /// `layout` (a checkpoint resumed on another data-parallel degree):
    ///
    /// - the worker side is the mean of the saved workers' residuals. The exchange averages
    ///   `g + e` over the workers, so what the residuals add to the next mean is their mean;
    ///   every new worker holding that mean adds the same, whatever the group's size.
    /// - the server side: the saved owners' residuals, laid end to end in shard order, are
    ///   the residual of the whole averaged bucket; the new worker takes its own shard of it.
    ///
    /// On the same group size this is not the identity (each worker's own residual is
    /// replaced by the mean): restore a same-size state as it was. Empty buffers count as
    /// zeros; a result that would be all zeros stays empty. Refused when a saved state does
    /// not fit `layout` for its place in the saved group.
    pub fn regroup(
        saved: &[ErrorFeedbackState<T>],
        layout: &BucketLayout,
        rank: usize,
        workers: usize,
    ) -> Result<Self, DpError> {
        if saved.is_empty() || rank >= workers {
            return Err(DpError::FeedbackState(format!(
                "cannot regroup {} saved workers' error feedback for worker {rank} of {workers}",
                saved.len()
            )));
        }
        for (old_rank, state) in saved.iter().enumerate() {
            state.check(layout, old_rank, saved.len())?;
        }
        let mut out = Self::empty(layout.buckets());
        let count = T::from_f64(saved.len() as f64);
        for b in 0..layout.buckets() {
            let len = layout.len(b);
            if saved.iter().any(|s| !s.worker[b].is_empty()) {
                let mut sum = vec![T::ZERO; len];
                for s in saved.iter().filter(|s| !s.worker[b].is_empty()) {
                    for (acc, &x) in sum.iter_mut().zip(&s.worker[b]) {
                        *acc = *acc + x;
                    }
                }
                out.worker[b] = sum.into_iter().map(|x| x / count).collect();
            }
            if saved.iter().any(|s| !s.server[b].is_empty()) {
                let mut whole = vec![T::ZERO; len];
                for (old_rank, s) in saved.iter().enumerate() {
                    if !s.server[b].is_empty() {
                        let range = layout.shard(b, old_rank, saved.len());
                        whole[range].copy_from_slice(&s.server[b]);
                    }
                }
                out.server[b] = whole[layout.shard(b, rank, workers)].to_vec();
            }
        }
        Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn state(worker: Vec<Vec<f64>>, server: Vec<Vec<f64>>) -> ErrorFeedbackState<f64> {
        ErrorFeedbackState { worker, server }
    }

    #[test]
    fn regrouping_keeps_what_the_residuals_add_to_the_mean() {
        // Two buckets of 5 and 3 values; the second bucket has no server residual saved.
        let layout = BucketLayout::from_bucket_lens(&[5, 3]);
        let saved = [
            state(
                vec![vec![1.0, 2.0, 3.0, 4.0, 5.0], vec![1.0, 1.0, 1.0]],
                vec![vec![0.5, 0.25, 0.125], vec![]],
            ),
            state(
                vec![vec![3.0, 2.0, 1.0, 0.0, -1.0], vec![]],
                vec![vec![-0.5, -0.25], vec![]],
            ),
        ];
        // Three workers now: each holds the mean worker residual and a third of the server's.
        let new: Vec<_> = (0..3)
            .map(|r| ErrorFeedbackState::regroup(&saved, &layout, r, 3).unwrap())
            .collect();
        for s in &new {
            assert_eq!(s.worker[0], [2.0, 2.0, 2.0, 2.0, 2.0]);
            assert_eq!(s.worker[1], [0.5, 0.5, 0.5]);
            assert!(s.server[1].is_empty());
        }
        let whole: Vec<f64> = new.iter().flat_map(|s| s.server[0].clone()).collect();
        assert_eq!(whole, [0.5, 0.25, 0.125, -0.5, -0.25]);
        assert_eq!(new[0].server[0], [0.5, 0.25]);
        // What the residuals add to the next averaged bucket is unchanged: the mean of the
        // worker residuals plus the server residual at each value.
        let mean_old = |v: usize| (saved[0].worker[0][v] + saved[1].worker[0][v]) / 2.0;
        let mean_new = |v: usize| new.iter().map(|s| s.worker[0][v]).sum::<f64>() / 3.0;
        for v in 0..5 {
            assert_eq!(mean_old(v), mean_new(v));
        }
        // Back to one worker: the whole server residual, the same mean.
        let one = ErrorFeedbackState::regroup(&saved, &layout, 0, 1).unwrap();
        assert_eq!(one.server[0], [0.5, 0.25, 0.125, -0.5, -0.25]);
        assert_eq!(one.worker[0], [2.0, 2.0, 2.0, 2.0, 2.0]);
        one.check(&layout, 0, 1).unwrap();
    }

    #[test]
    fn a_saved_state_of_another_shape_is_refused() {
        let layout = BucketLayout::from_bucket_lens(&[4]);
        let wrong = [
            state(vec![vec![1.0; 3]], vec![vec![]]),
            state(vec![vec![]], vec![vec![]]),
        ];
        let err = ErrorFeedbackState::regroup(&wrong, &layout, 0, 3).unwrap_err();
        assert!(err.to_string().contains("expected 4"), "{err}");
        assert!(ErrorFeedbackState::<f64>::regroup(&[], &layout, 0, 1).is_err());
        let empty = [ErrorFeedbackState::<f64>::empty(1)];
        assert!(ErrorFeedbackState::regroup(&empty, &layout, 3, 3).is_err());
        let zeros = ErrorFeedbackState::regroup(&empty, &layout, 0, 2).unwrap();
        assert_eq!(zeros, ErrorFeedbackState::empty(1));
    }
}
