//! A stage whose copies live in different processes of one replica (DualPipe's two copies
//! under MPI, one rank per process): the copies are summed inside the stage's exchange, not in
//! a separate pass.
//!
//! The copies' holders form a small group on point-to-point messages, member 0 the holder of
//! the lowest direction's copy, the others in direction order. Per bucket, as soon as a copy's
//! gradients are final, every other member ([`CopyPartner`]) sends its bucket uncompressed to
//! member 0 (a scatter message for shard 0); member 0 ([`CopyLead`]) adds them to its own in
//! member order (`(c_0 + c_1) + ...`, the order a process holding every copy adds them in, so
//! the results are bit-identical to it) and starts that bucket of the replicas' exchange (its
//! inner [`GradExchange`], which compresses the sum and keeps the error feedback). As soon as
//! a bucket of that exchange is done (in a progress call, or at the latest in `finish`),
//! member 0 sends its result uncompressed to the others (a gather message for shard 0), so
//! every copy steps the same gradients. The messages carry the
//! logical clock's stamp (step, stage, bucket, part) as the exchange's do.
//!
//! Only the lead's exchange with the other replicas counts in its [`ExchangeStats`] bytes
//! (the copies' transfers stay inside a replica, as the in-process sum does).
//!
//! **Copies summed before** ([`CopyLead::presummed`], [`CopyPartner::presummed`]): when every
//! copy already holds the sum (1-bit Adam folds its momentum from the copies' sum after the
//! pipeline), the partner sends nothing and the lead starts each bucket from its own copy at
//! once; the lead alone exchanges it with the other replicas and sends the result back, so the
//! replicas' exchange carries one copy per stage and replica, as a process holding both does.
//! The lead then waits for nothing from its partners, so it may be steps ahead of them; a
//! presummed partner's clock keeps the results of every later step until it reaches them.

use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::codec::{Codec, Compression};
use crate::exchange::{every_bucket_started, previous_finished};
use crate::feedback::ErrorFeedbackState;
use crate::layout::BucketLayout;
use crate::message::{MsgHeader, MsgKey, Part};
use crate::stats::ExchangeStats;
use crate::transport::GradTransport;
use crate::{BucketExchange, DpError, GradExchange, GradFloat};

/// The copies' messages: uncompressed values.
const PLAIN: Codec = Codec {
    compression: Compression::None,
    chunk_values: 1,
    rounding: crate::Rounding::Nearest,
};

/// The clock key of a copies' message: `Scatter` a partner's copy, `Gather` the result.
fn key(step: u64, stage: usize, bucket: usize, result: bool) -> MsgKey {
    let part = if result {
        Part::Gather { shard: 0 }
    } else {
        Part::Scatter { shard: 0 }
    };
    MsgKey {
        step,
        stage,
        bucket,
        part,
    }
}

fn send<T: GradFloat, X: GradTransport>(
    copies: &mut X,
    to: usize,
    key: MsgKey,
    values: &[T],
) -> Result<(), DpError> {
    let header = MsgHeader {
        key,
        compression: Compression::None,
        values: values.len(),
    };
    Ok(copies.send(to, header, PLAIN.encode(values, 0))?)
}

/// The message `key` from `from` if it has arrived, decoded into `out`.
fn take<T: GradFloat>(
    clock: &mut Clock,
    from: usize,
    key: MsgKey,
    out: &mut [T],
) -> Result<bool, DpError> {
    let Some((header, body)) = clock.take(from, key) else {
        return Ok(false);
    };
    if header.compression != Compression::None || header.values != out.len() {
        return Err(DpError::Mismatch {
            from,
            key,
            expected: Compression::None,
            got: header.compression,
            values: out.len(),
            got_values: header.values,
        });
    }
    PLAIN
        .decode(&body, out)
        .map_err(|error| DpError::Decode { from, key, error })?;
    Ok(true)
}

/// Files every message that has arrived on `copies`; never waits.
fn pump<X: GradTransport>(copies: &mut X, clock: &mut Clock) -> Result<(), DpError> {
    while let Some(m) = copies.recv(Duration::ZERO)? {
        clock.file(m)?;
    }
    Ok(())
}

/// Waits for the next arrival on `copies` until `deadline` and files it; `missing` names what
/// is waited for when the time is up.
fn wait_one<X: GradTransport>(
    copies: &mut X,
    clock: &mut Clock,
    began: Instant,
    deadline: Instant,
    missing: impl FnOnce() -> String,
) -> Result<(), DpError> {
    let now = Instant::now();
    if now >= deadline {
        return Err(DpError::TimedOut {
            waited: now - began,
            missing: missing(),
        });
    }
    if let Some(m) = copies.recv((deadline - now).min(Duration::from_millis(1)))? {
        clock.file(m)?;
    }
    Ok(())
}

fn check_group<X: GradTransport>(copies: &X, lead: bool) -> Result<(), DpError> {
    let (rank, size) = (copies.rank(), copies.size());
    if size < 2 || rank >= size || (rank == 0) != lead {
        return Err(DpError::Config(format!(
            "member {rank} of a stage's {size} copy holders cannot be its {}",
            if lead { "lead (member 0)" } else { "partner" }
        )));
    }
    Ok(())
}

/// One bucket at the lead: the copies' sum so far.
#[derive(Debug)]
struct LeadBucket<T> {
    /// This member's copy plus the members added so far (`None` before it starts).
    sum: Option<Vec<T>>,
    /// Members whose copy is in `sum`.
    added: usize,
    /// Whether the sum went into the replicas' exchange.
    started: bool,
    /// Whether the result went to the other members.
    sent: bool,
}

/// The holder of the lowest direction's copy: it sums the copies per bucket as they arrive
/// and exchanges the sum with the other replicas (see the [module](self) documentation).
#[derive(Debug)]
pub struct CopyLead<T, X> {
    inner: GradExchange<T, X>,
    copies: X,
    clock: Clock,
    stage: usize,
    timeout: Duration,
    step: Option<u64>,
    buckets: Vec<LeadBucket<T>>,
    /// Whether every copy already holds the sum (the partners send nothing).
    presummed: bool,
}

impl<T: GradFloat, X: GradTransport> CopyLead<T, X> {
    /// The lead of `inner`'s stage (the exchange with the other replicas' leads), member 0 of
    /// `copies` (the stage's copy holders in direction order); waits at most `timeout` for a
    /// copy.
    pub fn new(inner: GradExchange<T, X>, copies: X, timeout: Duration) -> Result<Self, DpError> {
        check_group(&copies, true)?;
        let stage = inner.stage();
        let buckets = (0..inner.layout().buckets())
            .map(|_| LeadBucket {
                sum: None,
                added: 0,
                started: false,
                sent: false,
            })
            .collect();
        Ok(CopyLead {
            inner,
            copies,
            clock: Clock::new(stage),
            stage,
            timeout,
            step: None,
            buckets,
            presummed: false,
        })
    }

    /// This lead for copies that already hold their sum (see the [module](self)
    /// documentation): each bucket starts from this copy alone, the partners send nothing.
    pub fn presummed(mut self) -> Self {
        self.presummed = true;
        self
    }

    /// Adds the copies that have arrived, in member order, and starts every complete sum.
    fn advance(&mut self) -> Result<(), DpError> {
        pump(&mut self.copies, &mut self.clock)?;
        let Some(step) = self.step else {
            return Ok(());
        };
        let members = self.copies.size();
        for bucket in 0..self.buckets.len() {
            let b = &mut self.buckets[bucket];
            let Some(sum) = b.sum.as_mut() else {
                continue;
            };
            while b.added < members {
                let mut copy = vec![T::ZERO; sum.len()];
                let k = key(step, self.stage, bucket, false);
                if !take(&mut self.clock, b.added, k, &mut copy)? {
                    break;
                }
                sum.iter_mut().zip(&copy).for_each(|(a, &c)| *a = *a + c);
                b.added += 1;
            }
            if b.added == members && !b.started {
                self.inner.start_bucket(bucket, sum)?;
                b.started = true;
                b.sum = None;
            }
        }
        Ok(())
    }

    /// Sends the result of every bucket the replicas' exchange has done and not yet sent.
    fn send_results(&mut self, step: u64) -> Result<(), DpError> {
        for bucket in 0..self.buckets.len() {
            if self.buckets[bucket].sent || !self.inner.bucket_done(bucket) {
                continue;
            }
            let k = key(step, self.stage, bucket, true);
            for to in 1..self.copies.size() {
                send(&mut self.copies, to, k, self.inner.averaged(bucket))?;
            }
            self.buckets[bucket].sent = true;
        }
        Ok(())
    }

    fn missing(&self, step: u64) -> String {
        self.buckets
            .iter()
            .enumerate()
            .find(|(_, b)| !b.started)
            .map_or("nothing".into(), |(bucket, b)| {
                format!(
                    "the copy of bucket {bucket} of stage {} at step {step} from copy holder {}",
                    self.stage,
                    b.added.max(1)
                )
            })
    }
}

impl<T: GradFloat, X: GradTransport> BucketExchange<T> for CopyLead<T, X> {
    fn begin_step(&mut self, step: u64) -> Result<(), DpError> {
        self.inner.begin_step(step)?;
        self.clock.begin(step)?;
        self.step = Some(step);
        for b in &mut self.buckets {
            *b = LeadBucket {
                sum: None,
                added: 0,
                started: false,
                sent: false,
            };
        }
        Ok(())
    }

    fn start_bucket(&mut self, bucket: usize, grads: &[T]) -> Result<(), DpError> {
        let step = self.step.ok_or(DpError::NoStep("start_bucket"))?;
        self.inner.layout().check_start(bucket, grads.len())?;
        let b = &mut self.buckets[bucket];
        if b.added > 0 {
            return Err(DpError::StartedTwice { bucket, step });
        }
        b.sum = Some(grads.to_vec());
        b.added = if self.presummed {
            self.copies.size()
        } else {
            1
        };
        self.advance()
    }

    fn progress(&mut self) -> Result<(), DpError> {
        let step = self.step.ok_or(DpError::NoStep("progress"))?;
        self.advance()?;
        self.inner.progress()?;
        self.send_results(step)
    }

    fn finish(&mut self) -> Result<ExchangeStats, DpError> {
        let began = Instant::now();
        let step = self.step.ok_or(DpError::NoStep("finish"))?;
        every_bucket_started(step, self.buckets.iter().map(|b| b.added > 0))?;
        let deadline = began + self.timeout;
        self.advance()?;
        while !self.buckets.iter().all(|b| b.started) {
            self.inner.progress()?;
            let missing = self.missing(step);
            wait_one(&mut self.copies, &mut self.clock, began, deadline, || {
                missing
            })?;
            self.advance()?;
        }
        let stats = self.inner.finish()?;
        self.send_results(step)?;
        self.copies.flush()?;
        Ok(stats)
    }

    fn layout(&self) -> &BucketLayout {
        self.inner.layout()
    }

    fn averaged(&self, bucket: usize) -> &[T] {
        self.inner.averaged(bucket)
    }

    fn totals(&self) -> ExchangeStats {
        self.inner.totals()
    }

    fn error_feedback(&self) -> &ErrorFeedbackState<T> {
        self.inner.error_feedback()
    }

    fn set_error_feedback(&mut self, state: ErrorFeedbackState<T>) -> Result<(), DpError> {
        self.inner.set_error_feedback(state)
    }

    fn method(&self) -> &'static str {
        "point-to-point"
    }
}

/// The holder of another copy: it sends its copy to the lead bucket by bucket and takes the
/// exchanged result back (see the [module](self) documentation). It keeps no error feedback
/// (the lead's exchange does).
#[derive(Debug)]
pub struct CopyPartner<T, X> {
    layout: BucketLayout,
    copies: X,
    clock: Clock,
    stage: usize,
    timeout: Duration,
    step: Option<u64>,
    finished: bool,
    started: Vec<bool>,
    /// The results, by bucket, and whether each has arrived.
    results: Vec<Vec<T>>,
    received: Vec<bool>,
    feedback: ErrorFeedbackState<T>,
    totals: ExchangeStats,
    /// Whether every copy already holds the sum (this one sends nothing).
    presummed: bool,
}

impl<T: GradFloat, X: GradTransport> CopyPartner<T, X> {
    /// A partner of stage `stage`'s lead, member `copies.rank() > 0` of `copies` (the stage's
    /// copy holders in direction order); waits at most `timeout` for the result.
    pub fn new(
        layout: BucketLayout,
        stage: usize,
        copies: X,
        timeout: Duration,
    ) -> Result<Self, DpError> {
        check_group(&copies, false)?;
        let buckets = layout.buckets();
        Ok(CopyPartner {
            results: (0..buckets).map(|b| vec![T::ZERO; layout.len(b)]).collect(),
            layout,
            copies,
            clock: Clock::new(stage),
            stage,
            timeout,
            step: None,
            finished: true,
            started: vec![false; buckets],
            received: vec![false; buckets],
            feedback: ErrorFeedbackState::empty(buckets),
            totals: ExchangeStats::default(),
            presummed: false,
        })
    }

    /// This partner for copies that already hold their sum (see the [module](self)
    /// documentation): it sends nothing and takes the lead's result. As the lead then waits
    /// for nothing from it, the lead may run any number of steps ahead; this partner keeps its
    /// results until it reaches their step ([`Clock::receiving_only`]).
    pub fn presummed(mut self) -> Self {
        self.presummed = true;
        self.clock = Clock::receiving_only(self.stage);
        self
    }

    fn take_results(&mut self, step: u64) -> Result<(), DpError> {
        pump(&mut self.copies, &mut self.clock)?;
        for bucket in 0..self.results.len() {
            if !self.received[bucket] {
                let k = key(step, self.stage, bucket, true);
                self.received[bucket] = take(&mut self.clock, 0, k, &mut self.results[bucket])?;
            }
        }
        Ok(())
    }
}

impl<T: GradFloat, X: GradTransport> BucketExchange<T> for CopyPartner<T, X> {
    fn begin_step(&mut self, step: u64) -> Result<(), DpError> {
        previous_finished(self.step, self.finished, step)?;
        self.clock.begin(step)?;
        self.step = Some(step);
        self.finished = false;
        self.started.iter_mut().for_each(|s| *s = false);
        self.received.iter_mut().for_each(|r| *r = false);
        Ok(())
    }

    fn start_bucket(&mut self, bucket: usize, grads: &[T]) -> Result<(), DpError> {
        let step = self.step.ok_or(DpError::NoStep("start_bucket"))?;
        self.layout.check_start(bucket, grads.len())?;
        if self.started[bucket] {
            return Err(DpError::StartedTwice { bucket, step });
        }
        if !self.presummed {
            send(
                &mut self.copies,
                0,
                key(step, self.stage, bucket, false),
                grads,
            )?;
        }
        self.started[bucket] = true;
        Ok(())
    }

    fn progress(&mut self) -> Result<(), DpError> {
        let step = self.step.ok_or(DpError::NoStep("progress"))?;
        self.take_results(step)
    }

    fn finish(&mut self) -> Result<ExchangeStats, DpError> {
        let began = Instant::now();
        let step = self.step.ok_or(DpError::NoStep("finish"))?;
        every_bucket_started(step, self.started.iter().copied())?;
        let deadline = began + self.timeout;
        self.take_results(step)?;
        while let Some(bucket) = self.received.iter().position(|r| !r) {
            let stage = self.stage;
            wait_one(&mut self.copies, &mut self.clock, began, deadline, || {
                format!(
                    "the exchanged bucket {bucket} of stage {stage} at step {step} from its \
                     copies' lead"
                )
            })?;
            self.take_results(step)?;
        }
        self.copies.flush()?;
        self.finished = true;
        let seconds = began.elapsed().as_secs_f64();
        let last = ExchangeStats {
            exchange_seconds: seconds,
            finish_seconds: seconds,
            ..ExchangeStats::default()
        };
        self.totals.add(&last);
        Ok(last)
    }

    fn layout(&self) -> &BucketLayout {
        &self.layout
    }

    fn averaged(&self, bucket: usize) -> &[T] {
        &self.results[bucket]
    }

    fn totals(&self) -> ExchangeStats {
        self.totals
    }

    fn error_feedback(&self) -> &ErrorFeedbackState<T> {
        &self.feedback
    }

    /// Only zeros fit: the lead keeps the stage's error feedback.
    fn set_error_feedback(&mut self, state: ErrorFeedbackState<T>) -> Result<(), DpError> {
        state.check(&self.layout, 0, 1)?;
        if state
            .worker
            .iter()
            .chain(&state.server)
            .any(|b| !b.is_empty())
        {
            return Err(DpError::FeedbackState(format!(
                "stage {}'s error feedback is kept by the holder of its lowest direction's copy, \
                 not by this one",
                self.stage
            )));
        }
        self.feedback = state;
        Ok(())
    }

    fn method(&self) -> &'static str {
        "point-to-point"
    }
}

#[cfg(test)]
mod tests {
    use std::thread::{spawn, JoinHandle};

    use super::*;
    use crate::{ChannelTransport, ExchangeConfig};

    type Results = JoinHandle<Vec<Vec<f64>>>;

    /// Two replicas, each with its stage's two copies in two "processes" (threads), int8 with
    /// error feedback over three steps: the leads' and the partners' results equal, bit for
    /// bit, one exchange per replica of the summed copies (what one process holding both
    /// copies runs).
    #[test]
    fn copies_summed_inside_the_exchange_equal_the_exchange_of_their_sum() {
        let layout = BucketLayout::new(&[5, 3, 4], 24, 8).unwrap();
        let config = ExchangeConfig {
            compression: Compression::Int8,
            chunk_values: 2,
            ..ExchangeConfig::default()
        };
        /// The gradients of copy `c` of replica `d` at step `t`.
        fn grads(t: usize, d: usize, c: usize) -> Vec<f64> {
            (0..12)
                .map(|i| ((i * 7 + d * 3 + c * 5 + t) % 11) as f64 * 0.37 - 1.3)
                .collect()
        }
        /// Three steps of `ex` with copy `c` of replica `d` (`None`: both copies summed).
        fn one(ex: &mut dyn BucketExchange<f64>, d: usize, c: Option<usize>) -> Vec<Vec<f64>> {
            (0..3)
                .map(|t| {
                    let mut g = match c {
                        Some(c) => grads(t, d, c),
                        None => grads(t, d, 0)
                            .iter()
                            .zip(grads(t, d, 1))
                            .map(|(a, b)| a + b)
                            .collect(),
                    };
                    ex.all_reduce(t as u64, &mut g).unwrap();
                    g
                })
                .collect()
        }
        let mut handles: Vec<(&str, Results)> = Vec::new();
        let summed = ChannelTransport::group(2);
        let leads = ChannelTransport::group(2);
        for (d, (reference, replicas)) in summed.into_iter().zip(leads).enumerate() {
            let (l, c) = (layout.clone(), config.clone());
            handles.push((
                "one process",
                spawn(move || {
                    let mut ex = GradExchange::new(c, l, 3, reference).unwrap();
                    one(&mut ex, d, None)
                }),
            ));
            let mut pair = ChannelTransport::group(2).into_iter();
            let (lead, partner) = (pair.next().unwrap(), pair.next().unwrap());
            let (l, c) = (layout.clone(), config.clone());
            let timeout = config.timeout;
            handles.push((
                "lead",
                spawn(move || {
                    let inner = GradExchange::new(c, l, 3, replicas).unwrap();
                    let mut ex = CopyLead::new(inner, lead, timeout).unwrap();
                    let out = one(&mut ex, d, Some(0));
                    assert!(ex.totals().grad_bytes_sent > 0);
                    out
                }),
            ));
            let l = layout.clone();
            handles.push((
                "partner",
                spawn(move || {
                    let mut ex = CopyPartner::new(l, 3, partner, timeout).unwrap();
                    let out = one(&mut ex, d, Some(1));
                    assert_eq!(ex.totals().grad_bytes_sent, 0);
                    out
                }),
            ));
        }
        let results: Vec<(&str, Vec<Vec<f64>>)> = handles
            .into_iter()
            .map(|(who, h)| (who, h.join().unwrap()))
            .collect();
        for replica in results.chunks(3) {
            let (_, want) = &replica[0];
            for (who, got) in &replica[1..] {
                assert_eq!(got, want, "{who}");
            }
        }
        // Compression did round (else the test would not see the error feedback's shape).
        let exact: Vec<f64> = (0..12)
            .map(|i| {
                (0..2)
                    .flat_map(|d| (0..2).map(move |c| grads(0, d, c)[i]))
                    .sum::<f64>()
                    / 2.0
            })
            .collect();
        assert_ne!(results[0].1[0], exact);
    }

    /// Copies that already hold their sum (1-bit Adam): the partner sends nothing, the lead
    /// exchanges its copy alone, and both take, bit for bit, what one process holding the sum
    /// gets, at the same bytes over the replicas (once per stage and replica, not twice).
    #[test]
    fn presummed_copies_are_exchanged_once_per_replica() {
        let layout = BucketLayout::new(&[5, 3, 4], 24, 8).unwrap();
        let config = ExchangeConfig {
            compression: Compression::OneBit,
            chunk_values: 3,
            ..ExchangeConfig::default()
        };
        fn sum(t: u64, d: usize) -> Vec<f64> {
            (0..12)
                .map(|i| ((i * 5 + d * 7 + t as usize) % 13) as f64 * 0.21 - 1.1)
                .collect()
        }
        type Out = (Vec<Vec<f64>>, u64, u64);
        let run = |ex: &mut dyn BucketExchange<f64>, d: usize| -> Vec<Vec<f64>> {
            (0..3u64)
                .map(|t| {
                    let mut g = sum(t, d);
                    ex.all_reduce(t, &mut g).unwrap();
                    g
                })
                .collect()
        };
        let mut handles: Vec<JoinHandle<Out>> = Vec::new();
        let reference = ChannelTransport::group(2);
        let leads = ChannelTransport::group(2);
        for (d, (alone, replicas)) in reference.into_iter().zip(leads).enumerate() {
            let (l, c) = (layout.clone(), config.clone());
            handles.push(spawn(move || {
                let mut ex = GradExchange::new(c, l, 1, alone).unwrap();
                let out = run(&mut ex, d);
                (out, ex.totals().grad_bytes_sent, 0)
            }));
            let mut pair = ChannelTransport::group(2).into_iter();
            let (lead, partner) = (pair.next().unwrap(), pair.next().unwrap());
            let (l, c) = (layout.clone(), config.clone());
            let timeout = config.timeout;
            handles.push(spawn(move || {
                let inner = GradExchange::new(c, l, 1, replicas).unwrap();
                let mut ex = CopyLead::new(inner, lead, timeout).unwrap().presummed();
                let out = run(&mut ex, d);
                (out, ex.totals().grad_bytes_sent, ex.copies.stats().messages)
            }));
            let l = layout.clone();
            handles.push(spawn(move || {
                let mut ex = CopyPartner::new(l, 1, partner, timeout)
                    .unwrap()
                    .presummed();
                let out = run(&mut ex, d);
                (out, ex.totals().grad_bytes_sent, ex.copies.stats().messages)
            }));
        }
        let results: Vec<Out> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for replica in results.chunks(3) {
            let (want, bytes, _) = &replica[0];
            assert!(*bytes > 0);
            let (lead, partner) = (&replica[1], &replica[2]);
            assert_eq!(&lead.0, want, "lead");
            assert_eq!(&partner.0, want, "partner");
            assert_eq!(
                lead.1, *bytes,
                "the lead sends what one process holding the sum does"
            );
            assert_eq!(partner.1, 0);
            assert_eq!(partner.2, 0, "the partner sends nothing to its lead");
            assert_eq!(
                lead.2,
                3 * 3,
                "the lead sends the partner 3 buckets x 3 steps"
            );
        }
    }

    /// The presummed partner sends its lead nothing, so nothing holds the lead back: here it
    /// runs three whole steps before its partner begins the first (the order that made the test
    /// above fail about 1 run in 5, as a `FromTheFuture` at the partner). The partner keeps
    /// the later steps' results until it reaches them and takes each at its own step.
    #[test]
    fn a_presummed_lead_may_run_any_number_of_steps_ahead_of_its_partner() {
        let layout = BucketLayout::new(&[5, 3, 4], 24, 8).unwrap();
        let grads =
            |t: u64| -> Vec<f64> { (0..12).map(|i| (i as f64 - 5.5) * (t + 1) as f64).collect() };
        let mut pair = ChannelTransport::group(2).into_iter();
        let (lead, partner) = (pair.next().unwrap(), pair.next().unwrap());
        let t = Duration::from_secs(5);
        let alone = ChannelTransport::group(1).pop().unwrap();
        let inner = GradExchange::new(ExchangeConfig::default(), layout.clone(), 1, alone).unwrap();
        let mut lead = CopyLead::new(inner, lead, t).unwrap().presummed();
        let mut partner = CopyPartner::new(layout, 1, partner, t).unwrap().presummed();
        let mut led = Vec::new();
        for step in 0..3 {
            let mut g = grads(step);
            lead.all_reduce(step, &mut g).unwrap();
            led.push(g);
        }
        for (step, want) in (0..3).zip(&led) {
            let mut g = vec![0.0; 12];
            partner.all_reduce(step, &mut g).unwrap();
            assert_eq!(&g, want, "step {step}");
        }
    }

    #[test]
    fn a_lead_must_be_member_0_and_a_partner_not() {
        let layout = BucketLayout::new(&[4], 64, 8).unwrap();
        let mut pair = ChannelTransport::group(2).into_iter();
        let (first, second) = (pair.next().unwrap(), pair.next().unwrap());
        let t = Duration::from_secs(1);
        let err = CopyPartner::<f64, _>::new(layout.clone(), 0, first, t).unwrap_err();
        assert!(err.to_string().contains("partner"), "{err}");
        let inner = GradExchange::<f64, _>::new(
            ExchangeConfig::default(),
            layout,
            0,
            ChannelTransport::group(1).pop().unwrap(),
        )
        .unwrap();
        let err = CopyLead::new(inner, second, t).unwrap_err();
        assert!(err.to_string().contains("lead"), "{err}");
    }
}
