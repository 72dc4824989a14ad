//! [`BucketExchange`]: the calls of one stage's exchange, whichever way it moves the values
//! ([`GradExchange`] over point-to-point messages, [`NativeExchange`](crate::NativeExchange)
//! over a library's own all-reduce).

use crate::feedback::ErrorFeedbackState;
use crate::layout::BucketLayout;
use crate::stats::ExchangeStats;
use crate::transport::GradTransport;
use crate::{DpError, GradExchange, GradFloat};

/// One worker's end of a stage's bucketed exchange: [`begin_step`](Self::begin_step),
/// [`start_bucket`](Self::start_bucket) per bucket as soon as its gradients are final,
/// [`progress`](Self::progress) whenever convenient, [`finish`](Self::finish) before the
/// optimizer, then [`param`](Self::param). See [`GradExchange`] for the rules.
pub trait BucketExchange<T: GradFloat> {
    /// Begins `step` (steps must increase; the previous one must be finished).
    fn begin_step(&mut self, step: u64) -> Result<(), DpError>;
    /// Starts bucket `bucket` with this worker's final gradients (copied); never waits.
    fn start_bucket(&mut self, bucket: usize, grads: &[T]) -> Result<(), DpError>;
    /// Moves every started bucket as far as it can; never waits.
    fn progress(&mut self) -> Result<(), DpError>;
    /// Waits until every bucket of the step is exchanged; returns the step's counts.
    fn finish(&mut self) -> Result<ExchangeStats, DpError>;
    /// The bucket layout.
    fn layout(&self) -> &BucketLayout;
    /// The exchanged gradients of bucket `bucket`, after [`finish`](Self::finish).
    fn averaged(&self, bucket: usize) -> &[T];
    /// The exchanged gradients of parameter `param`, after [`finish`](Self::finish).
    fn param(&self, param: usize) -> &[T] {
        let (bucket, range) = self.layout().span(param);
        &self.averaged(bucket)[range]
    }
    /// The counts over every finished step.
    fn totals(&self) -> ExchangeStats;
    /// The error-feedback buffers (to save in a checkpoint).
    fn error_feedback(&self) -> &ErrorFeedbackState<T>;
    /// Replaces the error-feedback buffers (from a checkpoint); refused if they do not fit.
    fn set_error_feedback(&mut self, state: ErrorFeedbackState<T>) -> Result<(), DpError>;
    /// How the values move, for reports: `"point-to-point"` or the library's all-reduce
    /// (`"mpi-allreduce"`).
    fn method(&self) -> &'static str;

    /// A whole step without overlap: begins `step`, starts every bucket from `grads` (in
    /// bucket order), finishes, and writes the result back into `grads`.
    fn all_reduce(&mut self, step: u64, grads: &mut [T]) -> Result<ExchangeStats, DpError> {
        let total = self.layout().total_values();
        if grads.len() != total {
            return Err(DpError::Config(format!(
                "all_reduce got {} values but the buckets hold {total}",
                grads.len()
            )));
        }
        self.begin_step(step)?;
        let mut at = 0;
        for bucket in 0..self.layout().buckets() {
            let n = self.layout().len(bucket);
            self.start_bucket(bucket, &grads[at..at + n])?;
            at += n;
        }
        let stats = self.finish()?;
        let mut at = 0;
        for bucket in 0..self.layout().buckets() {
            let values = self.averaged(bucket);
            grads[at..at + values.len()].copy_from_slice(values);
            at += values.len();
        }
        Ok(stats)
    }
}

impl<T: GradFloat, X: GradTransport> BucketExchange<T> for GradExchange<T, X> {
    fn begin_step(&mut self, step: u64) -> Result<(), DpError> {
        GradExchange::begin_step(self, step)
    }
    fn start_bucket(&mut self, bucket: usize, grads: &[T]) -> Result<(), DpError> {
        GradExchange::start_bucket(self, bucket, grads)
    }
    fn progress(&mut self) -> Result<(), DpError> {
        GradExchange::progress(self)
    }
    fn finish(&mut self) -> Result<ExchangeStats, DpError> {
        GradExchange::finish(self)
    }
    fn layout(&self) -> &BucketLayout {
        GradExchange::layout(self)
    }
    fn averaged(&self, bucket: usize) -> &[T] {
        GradExchange::averaged(self, bucket)
    }
    fn totals(&self) -> ExchangeStats {
        GradExchange::totals(self)
    }
    fn error_feedback(&self) -> &ErrorFeedbackState<T> {
        GradExchange::error_feedback(self)
    }
    fn set_error_feedback(&mut self, state: ErrorFeedbackState<T>) -> Result<(), DpError> {
        GradExchange::set_error_feedback(self, state)
    }
    fn method(&self) -> &'static str {
        "point-to-point"
    }
}
