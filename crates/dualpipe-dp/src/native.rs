//! The uncompressed exchange done by a communication library's own all-reduce (MPI's
//! `MPI_Iallreduce`): one non-blocking sum per bucket, started as soon as the bucket's
//! gradients are final, tested by [`NativeExchange::progress`], waited for by
//! [`NativeExchange::finish`], then divided as [`Reduce`](crate::Reduce) says.
//!
//! The library adds in its own order: for two members the sum is `g_0 + g_1` whatever the
//! order (IEEE addition commutes), so the mean is bit-identical to [`GradExchange`]'s; for more
//! members the association may differ (rounding only). No compression, no error feedback: the
//! compressed exchanges stay [`GradExchange`] on point-to-point messages.
//!
//! [`GradExchange`]: crate::GradExchange

use std::time::{Duration, Instant};

use crate::config::ExchangeConfig;
use crate::exchange::every_bucket_started;
use crate::feedback::ErrorFeedbackState;
use crate::layout::BucketLayout;
use crate::stats::ExchangeStats;
use crate::transport::TransportError;
use crate::{BucketExchange, DpError, GradFloat};

/// How long a wait tests without sleeping (the library moves the sum only inside its calls).
const SPIN: Duration = Duration::from_millis(2);
/// The longest sleep between two tests after that.
const NAP: Duration = Duration::from_micros(200);

/// A group that sums arrays itself (MPI's non-blocking all-reduce).
pub trait AllReduce<T>: Send {
    /// This member's index in the group.
    fn rank(&self) -> usize;
    /// The number of members.
    fn size(&self) -> usize;
    /// Starts the element-wise sum of `values` over the group; never waits. Every member
    /// starts the same sums, of the same lengths, in the same order.
    fn start(&mut self, values: Vec<T>) -> Result<Box<dyn SumInFlight<T>>, TransportError>;
    /// What does the summing, for reports (e.g. `"mpi-allreduce"`).
    fn name(&self) -> &'static str;
}

/// A sum started by [`AllReduce::start`].
pub trait SumInFlight<T>: Send {
    /// The sum once it is complete (moving it on if it is not); never waits.
    fn poll(&mut self) -> Result<Option<Vec<T>>, TransportError>;
}

#[cfg(feature = "mpi")]
mod mpi_group {
    use dualpipe_runtime::transport::mpi::{MpiSum, PendingSum};
    use dualpipe_runtime::transport::mpi_sum::MpiValue;

    use super::{AllReduce, SumInFlight};
    use crate::transport::TransportError;

    impl<T: MpiValue + Copy + Default + Send + 'static> AllReduce<T> for MpiSum {
        fn rank(&self) -> usize {
            MpiSum::rank(self)
        }
        fn size(&self) -> usize {
            MpiSum::size(self)
        }
        fn start(&mut self, values: Vec<T>) -> Result<Box<dyn SumInFlight<T>>, TransportError> {
            Ok(Box::new(MpiSum::start(self, values)))
        }
        fn name(&self) -> &'static str {
            "mpi-allreduce"
        }
    }

    impl<T: MpiValue + Send> SumInFlight<T> for PendingSum<T> {
        fn poll(&mut self) -> Result<Option<Vec<T>>, TransportError> {
            Ok(if self.test() { self.take() } else { None })
        }
    }
}

struct Bucket<T> {
    started: bool,
    in_flight: Option<Box<dyn SumInFlight<T>>>,
    output: Vec<T>,
    done: bool,
}

/// One member's end of the uncompressed exchange of a stage over an [`AllReduce`] group
/// (see the [module](self) documentation); the same calls as [`crate::GradExchange`].
pub struct NativeExchange<T> {
    config: ExchangeConfig,
    layout: BucketLayout,
    stage: usize,
    group: Box<dyn AllReduce<T>>,
    step: Option<u64>,
    finished: bool,
    buckets: Vec<Bucket<T>>,
    /// Always zeros: nothing is compressed.
    feedback: ErrorFeedbackState<T>,
    last: ExchangeStats,
    totals: ExchangeStats,
}

impl<T> std::fmt::Debug for NativeExchange<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeExchange")
            .field("stage", &self.stage)
            .field("members", &self.group.size())
            .field("buckets", &self.buckets.len())
            .field("step", &self.step)
            .finish()
    }
}

impl<T: GradFloat> NativeExchange<T> {
    /// The exchange of `stage`'s gradients, cut as `layout`, over `group`; refused for a
    /// lossy `config.compression` (those need [`crate::GradExchange`]).
    pub fn new(
        config: ExchangeConfig,
        layout: BucketLayout,
        stage: usize,
        group: Box<dyn AllReduce<T>>,
    ) -> Result<Self, DpError> {
        config.check()?;
        if config.compression.is_lossy() {
            return Err(DpError::Config(format!(
                "{}'s sum carries uncompressed gradients only, not {}; compressed gradients \
                 use the point-to-point exchange",
                group.name(),
                config.compression.name()
            )));
        }
        if group.size() == 0 || group.rank() >= group.size() {
            return Err(DpError::Config(format!(
                "member {} of a group of {}",
                group.rank(),
                group.size()
            )));
        }
        let buckets = (0..layout.buckets())
            .map(|b| Bucket {
                started: false,
                in_flight: None,
                output: vec![T::ZERO; layout.len(b)],
                done: false,
            })
            .collect();
        Ok(NativeExchange {
            feedback: ErrorFeedbackState::empty(layout.buckets()),
            config,
            layout,
            stage,
            group,
            step: None,
            finished: false,
            buckets,
            last: ExchangeStats::default(),
            totals: ExchangeStats::default(),
        })
    }

    fn current(&self, call: &'static str) -> Result<u64, DpError> {
        match self.step {
            Some(step) if !self.finished => Ok(step),
            _ => Err(DpError::NoStep(call)),
        }
    }

    /// Bytes the point-to-point exchange of the same bucket sends from this member (scatter
    /// `len - mine`, gather `mine` to every other): a bandwidth-optimal all-reduce's volume,
    /// the figure reported, since MPI does not say what it sent.
    fn volume(&self, bucket: usize) -> u64 {
        let (me, n) = (self.group.rank(), self.group.size());
        let len = self.layout.len(bucket);
        let mine = self.layout.shard(bucket, me, n).len();
        ((len - mine + (n - 1) * mine) * T::BYTES) as u64
    }

    /// Takes every completed sum and divides it; never waits.
    fn pump(&mut self) -> Result<(), DpError> {
        let divisor = self
            .config
            .reduce
            .divisor(self.group.size())
            .filter(|&n| n != 1)
            .map(T::from_usize);
        for b in self.buckets.iter_mut().filter(|b| b.started && !b.done) {
            let Some(pending) = b.in_flight.as_mut() else {
                continue;
            };
            if let Some(sum) = pending.poll()? {
                if sum.len() != b.output.len() {
                    return Err(DpError::Transport(TransportError(format!(
                        "a sum of {} values came back for a bucket of {}",
                        sum.len(),
                        b.output.len()
                    ))));
                }
                b.output = sum;
                if let Some(d) = divisor {
                    b.output.iter_mut().for_each(|a| *a = *a / d);
                }
                b.in_flight = None;
                b.done = true;
            }
        }
        Ok(())
    }
}

impl<T: GradFloat> BucketExchange<T> for NativeExchange<T> {
    fn begin_step(&mut self, step: u64) -> Result<(), DpError> {
        match (self.step, self.finished) {
            (Some(current), false) => {
                return Err(DpError::Unfinished {
                    step: current,
                    next: step,
                })
            }
            (Some(current), true) if step <= current => {
                return Err(DpError::StepNotLater {
                    current,
                    requested: step,
                })
            }
            _ => {}
        }
        self.step = Some(step);
        self.finished = false;
        for b in &mut self.buckets {
            b.started = false;
            b.done = false;
        }
        self.last = ExchangeStats::default();
        Ok(())
    }

    fn start_bucket(&mut self, bucket: usize, grads: &[T]) -> Result<(), DpError> {
        let began = Instant::now();
        let step = self.current("start_bucket")?;
        self.layout.check_start(bucket, grads.len())?;
        if self.buckets[bucket].started {
            return Err(DpError::StartedTwice { bucket, step });
        }
        let volume = self.volume(bucket);
        let b = &mut self.buckets[bucket];
        b.started = true;
        if self.group.size() == 1 {
            b.in_flight = Some(Box::new(Ready(Some(grads.to_vec()))));
        } else {
            b.in_flight = Some(self.group.start(grads.to_vec())?);
            self.last.messages += 1;
            self.last.grad_bytes_sent += volume;
            self.last.grad_bytes_uncompressed += volume;
        }
        let result = self.pump();
        self.last.exchange_seconds += began.elapsed().as_secs_f64();
        result
    }

    fn progress(&mut self) -> Result<(), DpError> {
        let began = Instant::now();
        self.current("progress")?;
        let result = self.pump();
        self.last.exchange_seconds += began.elapsed().as_secs_f64();
        result
    }

    fn finish(&mut self) -> Result<ExchangeStats, DpError> {
        let began = Instant::now();
        let step = self.current("finish")?;
        every_bucket_started(step, self.buckets.iter().map(|b| b.started))?;
        let deadline = began + self.config.timeout;
        self.pump()?;
        while let Some(bucket) = self.buckets.iter().position(|b| !b.done) {
            let now = Instant::now();
            if now >= deadline {
                return Err(DpError::TimedOut {
                    waited: now - began,
                    missing: format!(
                        "{}'s sum of bucket {bucket} of stage {}, step {step}",
                        self.group.name(),
                        self.stage
                    ),
                });
            }
            if now - began > SPIN {
                std::thread::sleep(NAP.min(deadline - now));
            } else {
                std::thread::yield_now();
            }
            self.pump()?;
        }
        self.finished = true;
        let seconds = began.elapsed().as_secs_f64();
        self.last.finish_seconds = seconds;
        self.last.exchange_seconds += seconds;
        self.totals.add(&self.last);
        Ok(self.last)
    }

    fn layout(&self) -> &BucketLayout {
        &self.layout
    }

    fn averaged(&self, bucket: usize) -> &[T] {
        &self.buckets[bucket].output
    }

    fn totals(&self) -> ExchangeStats {
        self.totals
    }

    fn error_feedback(&self) -> &ErrorFeedbackState<T> {
        &self.feedback
    }

    fn set_error_feedback(&mut self, state: ErrorFeedbackState<T>) -> Result<(), DpError> {
        state.check(&self.layout, self.group.rank(), self.group.size())?;
        let zeros = |b: &Vec<Vec<T>>| b.iter().flatten().all(|&v| v == T::ZERO);
        if !zeros(&state.worker) || !zeros(&state.server) {
            return Err(DpError::FeedbackState(format!(
                "{}'s uncompressed sum keeps no error feedback, but the state holds some (a \
                 checkpoint of a compressed run? resume it with its `gradient_compression`)",
                self.group.name()
            )));
        }
        Ok(())
    }

    fn method(&self) -> &'static str {
        self.group.name()
    }
}

/// The sum of a group of one: the values themselves.
struct Ready<T>(Option<Vec<T>>);

impl<T: Send> SumInFlight<T> for Ready<T> {
    fn poll(&mut self) -> Result<Option<Vec<T>>, TransportError> {
        Ok(self.0.take())
    }
}
