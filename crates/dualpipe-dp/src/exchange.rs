//! The bucketed gradient exchange of one data-parallel group, seen from one worker.
//!
//! Per bucket, a reduce-scatter then an all-gather, both point to point: the bucket is cut
//! into `D` shards ([`shard_range`]); worker `s` owns shard `s`. Each worker sends shard `s` of
//! its gradients to worker `s` (a scatter message); the owner sums the `D` contributions **in
//! worker order** (`((g_0 + g_1) + g_2) + ...`, whatever order they arrived in), divides by `D`
//! for the mean, and sends the result to every other worker (a gather message). Every worker,
//! the owner included, takes the result from those same bytes, so all workers end bit-identical.
//! Each worker sends `(D - 1) / D` of the bucket in each half, as a ring all-reduce does, in one
//! round of messages instead of `D - 1`.
//!
//! Compressed (bf16, int8, 1bit), the same two halves carry compressed bytes, as in 1-bit
//! Adam: a worker adds its worker-side residual to its gradients, compresses each shard and
//! keeps what compression dropped as the next residual (error feedback); the owner decodes the
//! `D` contributions (its own too, from its own bytes), averages them, adds its server-side
//! residual, compresses the result and keeps what that dropped. The warm-up steps (and 1-bit
//! Adam's refresh steps) use [`ExchangeConfig::warmup_compression`] (none by default) without
//! error feedback, leaving the residuals as they were; a group of one compresses nothing (it
//! sends nothing and returns the gradients unchanged).
//!
//! Overlap: [`GradExchange::start_bucket`] sends a bucket's contributions at once, without
//! waiting; [`GradExchange::progress`] (never blocking) and [`GradExchange::finish`] (waiting
//! for the rest) take what has arrived, reduce the shards whose contributions are complete and
//! send their results.

use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::codec::Codec;
use crate::config::ExchangeConfig;
use crate::feedback::{residual, ErrorFeedbackState};
use crate::layout::{shard_range, BucketLayout};
use crate::message::{MsgHeader, MsgKey, Part};
use crate::stats::ExchangeStats;
use crate::transport::GradTransport;
use crate::{BucketExchange, DpError, GradFloat};

/// `finish`'s precondition: every bucket of `step` started (`started`, by bucket), else
/// [`DpError::NotStarted`] naming the others.
pub(crate) fn every_bucket_started(
    step: u64,
    started: impl Iterator<Item = bool>,
) -> Result<(), DpError> {
    let missing: Vec<usize> = started
        .enumerate()
        .filter(|(_, s)| !s)
        .map(|(b, _)| b)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(DpError::NotStarted { step, missing })
    }
}

/// `begin_step`'s precondition: the previous step (`current`) finished, else
/// [`DpError::Unfinished`].
pub(crate) fn previous_finished(
    current: Option<u64>,
    finished: bool,
    next: u64,
) -> Result<(), DpError> {
    match (current, finished) {
        (Some(step), false) => Err(DpError::Unfinished { step, next }),
        _ => Ok(()),
    }
}

#[derive(Debug)]
struct Bucket<T> {
    started: bool,
    /// The contributions to this worker's shard, by worker.
    contributions: Vec<Option<Vec<T>>>,
    reduced: bool,
    /// Which shards of `output` hold their result.
    gathered: Vec<bool>,
    /// The averaged bucket.
    output: Vec<T>,
    done: bool,
}

/// One worker's end of the gradient exchange of a data-parallel group (one per pipeline stage
/// the worker holds).
///
/// A step: [`begin_step`](Self::begin_step), then [`start_bucket`](Self::start_bucket) for
/// every bucket as soon as its gradients are final (any order), [`progress`](Self::progress)
/// whenever convenient, [`finish`](Self::finish) before the optimizer; then read the result
/// with [`averaged`](Self::averaged) or [`param`](Self::param). After an error the exchange
/// cannot continue (the run stops).
#[derive(Debug)]
pub struct GradExchange<T, X> {
    config: ExchangeConfig,
    layout: BucketLayout,
    stage: usize,
    transport: X,
    clock: Clock,
    rank: usize,
    workers: usize,
    step: Option<u64>,
    finished: bool,
    codec: Codec,
    /// Whether this step keeps and uses error feedback ([`ExchangeConfig::feedback_at`]).
    feedback_now: bool,
    buckets: Vec<Bucket<T>>,
    feedback: ErrorFeedbackState<T>,
    last: ExchangeStats,
    totals: ExchangeStats,
    /// Transport counters at the start of the step.
    base: (u64, u64, u64),
}

impl<T: GradFloat, X: GradTransport> GradExchange<T, X> {
    /// The exchange of `stage`'s gradients, cut as `layout`, over `transport` (whose members
    /// are the stage's data-parallel group).
    pub fn new(
        config: ExchangeConfig,
        layout: BucketLayout,
        stage: usize,
        transport: X,
    ) -> Result<Self, DpError> {
        config.check()?;
        let (rank, workers) = (transport.rank(), transport.size());
        if workers == 0 || rank >= workers {
            return Err(DpError::Config(format!(
                "worker {rank} of a data-parallel group of {workers}"
            )));
        }
        let total = (0..layout.buckets())
            .try_fold(0usize, |a, b| a.checked_add(layout.len(b)))
            .and_then(|t| t.checked_mul(T::BYTES))
            .filter(|&t| t <= isize::MAX as usize);
        if total.is_none() {
            return Err(DpError::Config(format!(
                "the buckets hold more {} values than can be addressed",
                T::NAME
            )));
        }
        let buckets = (0..layout.buckets())
            .map(|b| Bucket {
                started: false,
                contributions: vec![None; workers],
                reduced: false,
                gathered: vec![false; workers],
                output: vec![T::ZERO; layout.len(b)],
                done: false,
            })
            .collect();
        Ok(GradExchange {
            codec: config.codec_at(0),
            feedback_now: config.feedback_at(0),
            feedback: ErrorFeedbackState::empty(layout.buckets()),
            config,
            layout,
            stage,
            transport,
            clock: Clock::new(stage),
            rank,
            workers,
            step: None,
            finished: false,
            buckets,
            last: ExchangeStats::default(),
            totals: ExchangeStats::default(),
            base: (0, 0, 0),
        })
    }

    /// The bucket layout.
    pub fn layout(&self) -> &BucketLayout {
        &self.layout
    }

    /// The configuration.
    pub fn config(&self) -> &ExchangeConfig {
        &self.config
    }

    /// This worker's index in its group, and the group size.
    pub fn place(&self) -> (usize, usize) {
        (self.rank, self.workers)
    }

    /// The pipeline stage whose group this exchange serves.
    pub fn stage(&self) -> usize {
        self.stage
    }

    /// The transport (e.g. to read its counters).
    pub fn transport(&self) -> &X {
        &self.transport
    }

    /// Begins `step` (steps must increase; the previous one must be finished).
    pub fn begin_step(&mut self, step: u64) -> Result<(), DpError> {
        previous_finished(self.step, self.finished, step)?;
        self.clock.begin(step)?;
        self.step = Some(step);
        self.finished = false;
        self.codec = self.config.codec_at(step);
        self.feedback_now = self.config.feedback_at(step);
        for b in &mut self.buckets {
            b.started = false;
            b.reduced = false;
            b.done = false;
            b.contributions.iter_mut().for_each(|c| *c = None);
            b.gathered.iter_mut().for_each(|g| *g = false);
        }
        let s = self.transport.stats();
        self.base = (s.messages, s.body_bytes, s.header_bytes);
        self.last = ExchangeStats::default();
        Ok(())
    }

    fn current(&self, call: &'static str) -> Result<u64, DpError> {
        match self.step {
            Some(step) if !self.finished => Ok(step),
            _ => Err(DpError::NoStep(call)),
        }
    }

    fn key(&self, step: u64, bucket: usize, part: Part) -> MsgKey {
        MsgKey {
            step,
            stage: self.stage,
            bucket,
            part,
        }
    }

    /// Names one compression call, so stochastic rounding never reuses random numbers.
    fn stream(&self, step: u64, bucket: usize, server: bool, shard: usize) -> u64 {
        let mut s = step.wrapping_mul(0x100_0000_01b3) ^ self.stage as u64;
        s = s.wrapping_mul(0x100_0000_01b3) ^ bucket as u64;
        s = s.wrapping_mul(0x100_0000_01b3) ^ (self.rank as u64) << 1 ^ u64::from(server);
        s.wrapping_mul(0x100_0000_01b3) ^ shard as u64
    }

    fn send(
        &mut self,
        to: usize,
        key: MsgKey,
        values: usize,
        body: Vec<u8>,
    ) -> Result<(), DpError> {
        let header = MsgHeader {
            key,
            compression: self.codec.compression,
            values,
        };
        self.transport.send(to, header, body)?;
        self.last.grad_bytes_uncompressed += (values * T::BYTES) as u64;
        Ok(())
    }

    /// Starts bucket `bucket` with this worker's final gradients `grads` (copied): sends its
    /// contributions without waiting.
    pub fn start_bucket(&mut self, bucket: usize, grads: &[T]) -> Result<(), DpError> {
        let began = Instant::now();
        let step = self.current("start_bucket")?;
        let len = self.layout.check_start(bucket, grads.len())?;
        if self.buckets[bucket].started {
            return Err(DpError::StartedTwice { bucket, step });
        }
        self.buckets[bucket].started = true;
        if self.workers == 1 {
            let divisor = self.config.reduce.divisor(1).filter(|&n| n != 1);
            let b = &mut self.buckets[bucket];
            b.output.copy_from_slice(grads);
            if let Some(n) = divisor {
                let d = T::from_usize(n);
                b.output.iter_mut().for_each(|a| *a = *a / d);
            }
            b.reduced = true;
            b.done = true;
            self.last.exchange_seconds += began.elapsed().as_secs_f64();
            return Ok(());
        }
        let codec = self.codec;
        let lossy = codec.compression.is_lossy();
        let feedback = lossy && self.feedback_now;
        let mut values = grads.to_vec();
        if feedback {
            let r = residual(&mut self.feedback.worker[bucket], len);
            for (v, e) in values.iter_mut().zip(r.iter()) {
                *v = *v + *e;
            }
        }
        for shard in 0..self.workers {
            let range = shard_range(len, shard, self.workers);
            let part = &values[range.clone()];
            let body = codec.encode(part, self.stream(step, bucket, false, shard));
            let kept = if lossy {
                let mut decoded = vec![T::ZERO; range.len()];
                codec
                    .decode(&body, &mut decoded)
                    .map_err(|error| DpError::Decode {
                        from: self.rank,
                        key: self.key(step, bucket, Part::Scatter { shard }),
                        error,
                    })?;
                if feedback {
                    let r = &mut self.feedback.worker[bucket][range.clone()];
                    for ((e, v), d) in r.iter_mut().zip(part).zip(&decoded) {
                        *e = *v - *d;
                    }
                }
                decoded
            } else {
                part.to_vec()
            };
            if shard == self.rank {
                self.buckets[bucket].contributions[shard] = Some(kept);
            } else {
                let key = self.key(step, bucket, Part::Scatter { shard });
                self.send(shard, key, range.len(), body)?;
            }
        }
        let result = self.pump();
        self.last.exchange_seconds += began.elapsed().as_secs_f64();
        result
    }

    /// Takes what has arrived and moves every started bucket as far as it can; never waits.
    pub fn progress(&mut self) -> Result<(), DpError> {
        let began = Instant::now();
        self.current("progress")?;
        let result = self.pump();
        self.last.exchange_seconds += began.elapsed().as_secs_f64();
        result
    }

    fn pump(&mut self) -> Result<(), DpError> {
        while let Some(m) = self.transport.recv(Duration::ZERO)? {
            self.clock.file(m)?;
        }
        self.advance()
    }

    /// Takes the message `key` from `from` if it is there, checked against what is expected.
    fn take(&mut self, from: usize, key: MsgKey, out: &mut [T]) -> Result<bool, DpError> {
        let Some((header, body)) = self.clock.take(from, key) else {
            return Ok(false);
        };
        if header.compression != self.codec.compression || header.values != out.len() {
            return Err(DpError::Mismatch {
                from,
                key,
                expected: self.codec.compression,
                got: header.compression,
                values: out.len(),
                got_values: header.values,
            });
        }
        self.codec
            .decode(&body, out)
            .map_err(|error| DpError::Decode { from, key, error })?;
        Ok(true)
    }

    fn advance(&mut self) -> Result<(), DpError> {
        let Some(step) = self.step else {
            return Ok(());
        };
        let (me, workers) = (self.rank, self.workers);
        for bucket in 0..self.buckets.len() {
            if !self.buckets[bucket].started || self.buckets[bucket].done {
                continue;
            }
            let len = self.layout.len(bucket);
            if !self.buckets[bucket].reduced {
                let mine = shard_range(len, me, workers).len();
                for from in (0..workers).filter(|&w| w != me) {
                    if self.buckets[bucket].contributions[from].is_some() {
                        continue;
                    }
                    let key = self.key(step, bucket, Part::Scatter { shard: me });
                    let mut got = vec![T::ZERO; mine];
                    if self.take(from, key, &mut got)? {
                        self.buckets[bucket].contributions[from] = Some(got);
                    }
                }
                if self.buckets[bucket]
                    .contributions
                    .iter()
                    .all(Option::is_some)
                {
                    self.reduce(step, bucket)?;
                }
            }
            for shard in (0..workers).filter(|&s| s != me) {
                if self.buckets[bucket].gathered[shard] {
                    continue;
                }
                let range = shard_range(len, shard, workers);
                let key = self.key(step, bucket, Part::Gather { shard });
                let mut out = std::mem::take(&mut self.buckets[bucket].output);
                let got = self.take(shard, key, &mut out[range]);
                self.buckets[bucket].output = out;
                if got? {
                    self.buckets[bucket].gathered[shard] = true;
                }
            }
            let b = &mut self.buckets[bucket];
            b.done = b.reduced && b.gathered.iter().all(|&g| g);
        }
        Ok(())
    }

    /// Sums this worker's shard of `bucket` in worker order, averages, compresses and sends it.
    fn reduce(&mut self, step: u64, bucket: usize) -> Result<(), DpError> {
        let (me, workers) = (self.rank, self.workers);
        let range = shard_range(self.layout.len(bucket), me, workers);
        let contributions: Vec<Vec<T>> = self.buckets[bucket]
            .contributions
            .iter_mut()
            .map(|c| c.take().unwrap_or_default())
            .collect();
        let mut acc = contributions[0].clone();
        for c in &contributions[1..] {
            for (a, v) in acc.iter_mut().zip(c) {
                *a = *a + *v;
            }
        }
        if let Some(n) = self.config.reduce.divisor(workers).filter(|&n| n != 1) {
            let d = T::from_usize(n);
            acc.iter_mut().for_each(|a| *a = *a / d);
        }
        let codec = self.codec;
        let feedback = codec.compression.is_lossy() && self.feedback_now;
        if feedback {
            let r = residual(&mut self.feedback.server[bucket], range.len());
            for (a, e) in acc.iter_mut().zip(r.iter()) {
                *a = *a + *e;
            }
        }
        let body = codec.encode(&acc, self.stream(step, bucket, true, me));
        let key = self.key(step, bucket, Part::Gather { shard: me });
        {
            let out = &mut self.buckets[bucket].output[range.clone()];
            codec.decode(&body, out).map_err(|error| DpError::Decode {
                from: me,
                key,
                error,
            })?;
            if feedback {
                let r = &mut self.feedback.server[bucket];
                for ((e, a), d) in r.iter_mut().zip(&acc).zip(out.iter()) {
                    *e = *a - *d;
                }
            }
        }
        for to in (0..workers).filter(|&w| w != me) {
            self.send(to, key, range.len(), body.clone())?;
        }
        let b = &mut self.buckets[bucket];
        b.reduced = true;
        b.gathered[me] = true;
        Ok(())
    }

    /// Waits until every bucket of the step is exchanged (every bucket must have been started);
    /// returns the step's counts. The results are then in [`averaged`](Self::averaged).
    pub fn finish(&mut self) -> Result<ExchangeStats, DpError> {
        let began = Instant::now();
        let step = self.current("finish")?;
        every_bucket_started(step, self.buckets.iter().map(|b| b.started))?;
        let deadline = began + self.config.timeout;
        self.pump()?;
        while !self.buckets.iter().all(|b| b.done) {
            let now = Instant::now();
            if now >= deadline {
                return Err(DpError::TimedOut {
                    waited: now - began,
                    missing: self.describe_missing(step),
                });
            }
            if let Some(m) = self.transport.recv(deadline - now)? {
                self.clock.file(m)?;
                self.pump()?;
            }
        }
        self.transport.flush()?;
        self.finished = true;
        let s = self.transport.stats();
        self.last.messages = s.messages - self.base.0;
        self.last.grad_bytes_sent = s.body_bytes - self.base.1;
        self.last.header_bytes_sent = s.header_bytes - self.base.2;
        let seconds = began.elapsed().as_secs_f64();
        self.last.finish_seconds = seconds;
        self.last.exchange_seconds += seconds;
        self.totals.add(&self.last);
        Ok(self.last)
    }

    fn describe_missing(&self, step: u64) -> String {
        let me = self.rank;
        for (bucket, b) in self.buckets.iter().enumerate() {
            if let Some(from) =
                (0..self.workers).find(|&w| !b.reduced && b.contributions[w].is_none())
            {
                let key = self.key(step, bucket, Part::Scatter { shard: me });
                return format!("{key} from worker {from}");
            }
            if let Some(shard) = (0..self.workers).find(|&s| !b.gathered[s]) {
                let key = self.key(step, bucket, Part::Gather { shard });
                return format!("{key} from worker {shard}");
            }
        }
        "nothing".into()
    }

    /// A whole step without overlap (`--no-overlap`): begins `step`, starts every bucket from
    /// `grads` (all buckets back to back, in bucket order), finishes, and writes the result
    /// back into `grads` ([`BucketExchange::all_reduce`]).
    pub fn all_reduce(&mut self, step: u64, grads: &mut [T]) -> Result<ExchangeStats, DpError> {
        BucketExchange::all_reduce(self, step, grads)
    }

    /// Whether `bucket` of the current step is exchanged (its [`averaged`](Self::averaged)
    /// values final), which [`progress`](Self::progress) may reach before
    /// [`finish`](Self::finish).
    pub fn bucket_done(&self, bucket: usize) -> bool {
        self.buckets.get(bucket).is_some_and(|b| b.done)
    }

    /// The averaged (or summed) gradients of `bucket`, after [`finish`](Self::finish).
    pub fn averaged(&self, bucket: usize) -> &[T] {
        &self.buckets[bucket].output
    }

    /// The averaged gradients of parameter `param` (an index into the layout's parameters).
    pub fn param(&self, param: usize) -> &[T] {
        let (bucket, range) = self.layout.span(param);
        &self.buckets[bucket].output[range]
    }

    /// Messages that arrived before this worker reached their step (kept until it did).
    pub fn early_arrivals(&self) -> u64 {
        self.clock.early_arrivals()
    }

    /// The counts of the last finished step.
    pub fn last_step(&self) -> ExchangeStats {
        self.last
    }

    /// The counts over every finished step.
    pub fn totals(&self) -> ExchangeStats {
        self.totals
    }

    /// The error-feedback buffers (to save in a checkpoint).
    pub fn error_feedback(&self) -> &ErrorFeedbackState<T> {
        &self.feedback
    }

    /// Replaces the error-feedback buffers (from a checkpoint); refused if they do not fit.
    pub fn set_error_feedback(&mut self, state: ErrorFeedbackState<T>) -> Result<(), DpError> {
        state.check(&self.layout, self.rank, self.workers)?;
        self.feedback = state;
        Ok(())
    }

    /// Zeroes the error-feedback buffers.
    pub fn reset_error_feedback(&mut self) {
        self.feedback = ErrorFeedbackState::empty(self.layout.buckets());
    }
}
