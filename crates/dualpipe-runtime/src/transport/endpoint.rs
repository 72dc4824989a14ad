//! One rank's end of a multi-process transport: stamped messages, matching, buffering, abort.
//!
//! An [`Endpoint`] sits on a [`Link`], which only moves (header, body) byte pairs between
//! ranks (`transport::mpi::MpiLink` over MPI with the `mpi` feature, [`ChannelLink`] in memory for
//! tests). The endpoint gives every message its [`Stamp`] and matches arrivals by that stamp:
//! what arrives before it is needed is buffered, a second message with the same stamp or one
//! from a past step is refused with a clear error, so reordering on the wire can never mix
//! micro-batches or steps. A failing rank tells every peer ([`Endpoint::fail`]); a peer that
//! waits for a message sees the abort and stops with an error naming the failed rank.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

use super::wire::{pack, unpack, Header, Stamp, WireData, WireError};

/// A message on a [`Link`]: (source rank, header, body).
pub type Packet = (usize, Vec<u8>, Vec<u8>);

/// Moves messages between ranks: sends never block, arrivals are picked up by polling.
pub trait Link {
    /// This rank.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn ranks(&self) -> usize;

    /// Starts sending `header` and `body` to `dst`; returns at once. Messages from one rank
    /// to another arrive in the order they were posted.
    fn post(&mut self, dst: usize, header: Vec<u8>, body: Vec<u8>) -> Result<(), LinkError>;

    /// A message that has fully arrived, as (source rank, header, body), or `None`.
    fn poll(&mut self) -> Result<Option<Packet>, LinkError>;

    /// Waits until every posted send has completed or `deadline` passes; returns whether all
    /// completed.
    fn flush(&mut self, deadline: Instant) -> Result<bool, LinkError>;

    /// Whether a message is arriving right now (its data only moves while this rank polls,
    /// so a wait keeps polling without sleeping until it is in).
    fn receiving(&self) -> bool {
        false
    }
}

/// A failure of the underlying link (an MPI error, a vanished peer).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LinkError(pub String);

/// Why an endpoint operation did not deliver its message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// Another rank failed and told everyone.
    #[error("rank {rank} failed: {message}")]
    Aborted {
        /// The failed rank.
        rank: usize,
        /// Its error.
        message: String,
    },
    /// The message did not arrive before the deadline.
    #[error("timed out after {waited:?} waiting for {stamp}")]
    TimedOut {
        /// The awaited message.
        stamp: Stamp,
        /// How long the wait lasted.
        waited: Duration,
    },
    /// A message from an earlier step arrived: a rank is out of step with the others.
    #[error(
        "refused {stamp} from rank {src}: this rank is already at step {current}, so the \
         message is stale (ranks out of step; check that every rank runs the same schedule \
         and steps)"
    )]
    PastStep {
        /// The stale message.
        stamp: Stamp,
        /// Its sender.
        src: usize,
        /// This rank's step.
        current: u64,
    },
    /// A message with a stamp already received arrived again.
    #[error("a second {stamp} arrived (from rank {src}); every message must be sent once")]
    Duplicate {
        /// The repeated stamp.
        stamp: Stamp,
        /// Its sender.
        src: usize,
    },
    /// Messages of an earlier step were never consumed.
    #[error(
        "step {next} begins but {count} message(s) of earlier steps were never used, e.g. \
         {example} from rank {src}"
    )]
    Leftover {
        /// The step being started.
        next: u64,
        /// Unused messages.
        count: usize,
        /// One of them.
        example: Stamp,
        /// Its sender.
        src: usize,
    },
    /// The endpoint was asked to go back to an earlier step.
    #[error("cannot go back from step {current} to step {requested}")]
    StepBackwards {
        /// The current step.
        current: u64,
        /// The requested one.
        requested: u64,
    },
    /// A message could not be decoded.
    #[error("a malformed message from rank {src}: {error}")]
    Wire {
        /// Its sender.
        src: usize,
        /// What is wrong.
        error: WireError,
    },
    /// The link failed.
    #[error("transport failure: {0}")]
    Link(#[from] LinkError),
    /// A send to a rank that does not exist.
    #[error("no rank {dst}: the world has {ranks} ranks")]
    NoSuchRank {
        /// The destination.
        dst: usize,
        /// The world size.
        ranks: usize,
    },
}

/// How long a wait polls before it starts to sleep between polls, by default: long enough
/// for a large message to stream through without stalls (the link only moves data while its
/// owner polls), short enough to give the cores back during a long wait for a peer's compute.
pub const DEFAULT_SPIN: Duration = Duration::from_millis(5);

/// How long a failing rank waits for its failure notices to leave before it gives up (the
/// `grace` the runtime passes to [`Endpoint::fail`]).
pub const NOTICE_GRACE: Duration = Duration::from_secs(2);

/// The first part of a wait polls without even yielding the core (lowest latency).
const HOT_SPIN: Duration = Duration::from_micros(50);

/// The longest sleep between two polls once a wait has spun for its spin time.
const MAX_NAP: Duration = Duration::from_micros(200);

/// One rank's end of the transport: stamps, matching, buffering and abort on a [`Link`].
#[derive(Debug)]
pub struct Endpoint<L> {
    link: L,
    step: u64,
    buffered: HashMap<Stamp, (usize, Vec<WireData>)>,
    /// Stamps of this step already taken (a repeat is a duplicate).
    taken: HashSet<Stamp>,
    abort: Option<(usize, String)>,
    /// An arrival that could not be filed while only checking for aborts, reported by the
    /// next take.
    fault: Option<NetError>,
    /// The wait strategy's spin phase before sleeping between polls.
    spin: Duration,
}

impl<L: Link> Endpoint<L> {
    /// An endpoint at step 0.
    pub fn new(link: L) -> Self {
        Endpoint {
            link,
            step: 0,
            buffered: HashMap::new(),
            taken: HashSet::new(),
            abort: None,
            fault: None,
            spin: DEFAULT_SPIN,
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.link.rank()
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.link.ranks()
    }

    /// The current step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The link underneath.
    pub fn link_mut(&mut self) -> &mut L {
        &mut self.link
    }

    /// How long a wait polls without sleeping before it starts to sleep between polls (short
    /// waits answer fastest by spinning; long ones should leave the cores to other ranks).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Moves to `step`: messages of earlier steps are refused from now on. Fails if a message
    /// of an earlier step is still unused (the ranks' programs disagree).
    pub fn begin_step(&mut self, step: u64) -> Result<(), NetError> {
        if step < self.step {
            return Err(NetError::StepBackwards {
                current: self.step,
                requested: step,
            });
        }
        if step > self.step {
            let stale: Vec<(&Stamp, &(usize, Vec<WireData>))> = self
                .buffered
                .iter()
                .filter(|(s, _)| s.step < step)
                .collect();
            if let Some((example, (src, _))) = stale.iter().min_by_key(|(s, _)| **s) {
                return Err(NetError::Leftover {
                    next: step,
                    count: stale.len(),
                    example: **example,
                    src: *src,
                });
            }
            self.taken.clear();
        }
        self.step = step;
        Ok(())
    }

    /// Sends `tensors` under `stamp` to `dst` without blocking.
    pub fn send(
        &mut self,
        dst: usize,
        stamp: Stamp,
        tensors: Vec<WireData>,
    ) -> Result<(), NetError> {
        if dst >= self.ranks() {
            return Err(NetError::NoSuchRank {
                dst,
                ranks: self.ranks(),
            });
        }
        let (header, body) = pack(stamp, self.rank(), tensors);
        if let Err(lost) = self.link.post(dst, header, body) {
            // Take in what has arrived: the notice that explains the loss may be among it.
            self.aborted();
            return Err(self.link_failure(lost));
        }
        Ok(())
    }

    /// A link failure as the error to report. A peer usually goes because some rank failed and
    /// told everyone: when that notice has arrived, it names the cause, which the lost link
    /// does not.
    fn link_failure(&self, lost: LinkError) -> NetError {
        self.check_abort().err().unwrap_or(lost.into())
    }

    /// Takes every message that has arrived into the buffer, without waiting.
    pub fn pump(&mut self) -> Result<(), NetError> {
        if let Some(fault) = self.fault.take() {
            return Err(fault);
        }
        loop {
            match self.link.poll() {
                Ok(Some((src, header, body))) => self.deliver(src, &header, body)?,
                Ok(None) => return Ok(()),
                Err(lost) => return Err(self.link_failure(lost)),
            }
        }
    }

    /// Files one arrival by its stamp.
    fn deliver(&mut self, src: usize, header: &[u8], body: Vec<u8>) -> Result<(), NetError> {
        let header = Header::decode(header).map_err(|error| NetError::Wire { src, error })?;
        match header {
            Header::Abort { rank, message } => {
                if self.abort.is_none() {
                    self.abort = Some((rank, message));
                }
                Ok(())
            }
            Header::Data {
                stamp,
                src: claimed,
                tensors,
            } => {
                if claimed != src {
                    return Err(NetError::Wire {
                        src,
                        error: WireError(format!(
                            "the message for {stamp} claims to come from rank {claimed}"
                        )),
                    });
                }
                if stamp.step < self.step {
                    return Err(NetError::PastStep {
                        stamp,
                        src,
                        current: self.step,
                    });
                }
                let tensors =
                    unpack(&tensors, body).map_err(|error| NetError::Wire { src, error })?;
                if self.taken.contains(&stamp) || self.buffered.contains_key(&stamp) {
                    return Err(NetError::Duplicate { stamp, src });
                }
                self.buffered.insert(stamp, (src, tensors));
                Ok(())
            }
        }
    }

    /// The failure another rank reported, if any.
    pub fn aborted(&mut self) -> Option<(usize, String)> {
        if self.abort.is_none() && self.fault.is_none() {
            // A malformed or stale message is this rank's own error, reported when it takes.
            if let Err(fault) = self.pump() {
                self.fault = Some(fault);
            }
        }
        self.abort.clone()
    }

    fn check_abort(&self) -> Result<(), NetError> {
        match &self.abort {
            Some((rank, message)) => Err(NetError::Aborted {
                rank: *rank,
                message: message.clone(),
            }),
            None => Ok(()),
        }
    }

    fn claim(&mut self, stamp: Stamp) -> Option<(usize, Vec<WireData>)> {
        let found = self.buffered.remove(&stamp)?;
        if stamp.step == self.step {
            self.taken.insert(stamp);
        }
        Some(found)
    }

    /// The message `stamp` with its sender if it has arrived; never waits.
    pub fn try_take(&mut self, stamp: Stamp) -> Result<Option<(usize, Vec<WireData>)>, NetError> {
        self.pump()?;
        self.check_abort()?;
        Ok(self.claim(stamp))
    }

    /// Waits for the message `stamp`, buffering everything else that arrives first. Fails at
    /// `deadline`, or as soon as another rank reports a failure.
    pub fn take(
        &mut self,
        stamp: Stamp,
        deadline: Instant,
    ) -> Result<(usize, Vec<WireData>), NetError> {
        let began = Instant::now();
        let mut nap = Duration::from_micros(20);
        loop {
            self.pump()?;
            self.check_abort()?;
            if let Some(found) = self.claim(stamp) {
                return Ok(found);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NetError::TimedOut {
                    stamp,
                    waited: now - began,
                });
            }
            let waited = now - began;
            if waited < HOT_SPIN.min(self.spin) || self.link.receiving() {
                std::hint::spin_loop();
            } else if waited < self.spin {
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap.min(deadline - now));
                nap = (nap * 2).min(MAX_NAP);
            }
        }
    }

    /// Tells every other rank that this rank failed with `message`, then waits up to `grace`
    /// for the notices to leave. Later waits of this endpoint fail with that abort too.
    pub fn fail(&mut self, message: &str, grace: Duration) {
        let rank = self.rank();
        let header = Header::Abort {
            rank,
            message: message.to_string(),
        }
        .encode();
        for dst in (0..self.ranks()).filter(|&d| d != rank) {
            // Best effort: a peer that is gone cannot be told.
            let _ = self.link.post(dst, header.clone(), Vec::new());
        }
        let _ = self.link.flush(Instant::now() + grace);
        if self.abort.is_none() {
            self.abort = Some((rank, message.to_string()));
        }
    }

    /// Waits up to `deadline` until every sent message has left; returns whether all did.
    pub fn flush(&mut self, deadline: Instant) -> Result<bool, NetError> {
        Ok(self.link.flush(deadline)?)
    }

    /// Number of buffered messages (arrived, not yet taken).
    pub fn buffered(&self) -> usize {
        self.buffered.len()
    }
}

/// An in-memory [`Link`] between threads: each rank has an inbox channel. For tests and for
/// measuring the endpoint's own overhead.
#[derive(Debug)]
pub struct ChannelLink {
    rank: usize,
    peers: Vec<Sender<Packet>>,
    inbox: Receiver<Packet>,
}

impl ChannelLink {
    /// Links for `ranks` ranks, one per rank, all connected.
    pub fn world(ranks: usize) -> Vec<ChannelLink> {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..ranks).map(|_| channel()).unzip();
        receivers
            .into_iter()
            .enumerate()
            .map(|(rank, inbox)| ChannelLink {
                rank,
                peers: senders.clone(),
                inbox,
            })
            .collect()
    }

    /// Injects a raw message into this rank's inbox as if `src` had sent it (tests of
    /// reordering and stale messages).
    pub fn inject(&self, src: usize, header: Vec<u8>, body: Vec<u8>) {
        let _ = self.peers[self.rank].send((src, header, body));
    }
}

impl Link for ChannelLink {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.peers.len()
    }

    fn post(&mut self, dst: usize, header: Vec<u8>, body: Vec<u8>) -> Result<(), LinkError> {
        self.peers[dst]
            .send((self.rank, header, body))
            .map_err(|_| LinkError(format!("rank {dst} has gone")))
    }

    fn poll(&mut self) -> Result<Option<Packet>, LinkError> {
        match self.inbox.try_recv() {
            Ok(packet) => Ok(Some(packet)),
            Err(TryRecvError::Empty) => Ok(None),
            // This link holds a sender to its own inbox, so it cannot disconnect.
            Err(TryRecvError::Disconnected) => Ok(None),
        }
    }

    fn flush(&mut self, _deadline: Instant) -> Result<bool, LinkError> {
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::wire::{Class, WireDType};

    fn endpoints(ranks: usize) -> Vec<Endpoint<ChannelLink>> {
        ChannelLink::world(ranks)
            .into_iter()
            .map(Endpoint::new)
            .collect()
    }

    fn tensor(value: f64) -> Vec<WireData> {
        vec![WireData::from_f64s(&[value, value + 0.5])]
    }

    fn value(tensors: &[WireData]) -> f64 {
        tensors[0].to_f64s().unwrap()[0]
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    fn f(step: u64, mb: usize) -> Stamp {
        Stamp::chunk(step, Class::Forward, 0, 1, mb)
    }

    #[test]
    fn messages_are_matched_by_stamp_whatever_the_arrival_order() {
        let mut eps = endpoints(2);
        let mut b = eps.pop().unwrap();
        let mut a = eps.pop().unwrap();
        // Sent in the reverse of the order they are needed, plus a backward with the same
        // (dir, stage, mb) as a forward: nothing may mix.
        for mb in (0..4).rev() {
            a.send(1, f(0, mb), tensor(mb as f64)).unwrap();
        }
        a.send(1, Stamp::chunk(0, Class::Backward, 0, 1, 2), tensor(-2.0))
            .unwrap();
        for mb in 0..4 {
            let (src, got) = b.take(f(0, mb), soon()).unwrap();
            assert_eq!((src, value(&got)), (0, mb as f64));
        }
        let (_, got) = b
            .take(Stamp::chunk(0, Class::Backward, 0, 1, 2), soon())
            .unwrap();
        assert_eq!(value(&got), -2.0);
        assert_eq!(b.buffered(), 0);
    }

    #[test]
    fn early_arrivals_of_the_next_step_wait_in_the_buffer() {
        let mut eps = endpoints(2);
        let mut b = eps.pop().unwrap();
        let mut a = eps.pop().unwrap();
        a.send(1, f(1, 0), tensor(10.0)).unwrap();
        a.send(1, f(0, 0), tensor(0.0)).unwrap();
        b.pump().unwrap();
        assert_eq!(b.buffered(), 2);
        let (_, got) = b.take(f(0, 0), soon()).unwrap();
        assert_eq!(value(&got), 0.0);
        b.begin_step(1).unwrap();
        let (_, got) = b.take(f(1, 0), soon()).unwrap();
        assert_eq!(value(&got), 10.0);
        assert_eq!(b.buffered(), 0);
    }

    #[test]
    fn a_message_from_a_past_step_is_refused() {
        let mut eps = endpoints(2);
        let mut b = eps.pop().unwrap();
        let mut a = eps.pop().unwrap();
        b.begin_step(3).unwrap();
        a.send(1, f(2, 0), tensor(1.0)).unwrap();
        let err = b.take(f(3, 0), soon()).unwrap_err();
        assert!(
            matches!(
                err,
                NetError::PastStep {
                    current: 3,
                    src: 0,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("step 2"), "{err}");
    }

    #[test]
    fn duplicates_are_refused_even_after_the_first_was_taken() {
        let mut eps = endpoints(2);
        let mut b = eps.pop().unwrap();
        let mut a = eps.pop().unwrap();
        a.send(1, f(0, 0), tensor(1.0)).unwrap();
        b.take(f(0, 0), soon()).unwrap();
        a.send(1, f(0, 0), tensor(1.0)).unwrap();
        let err = b.take(f(0, 1), soon()).unwrap_err();
        assert!(matches!(err, NetError::Duplicate { src: 0, .. }), "{err:?}");
    }

    #[test]
    fn unused_messages_of_a_step_are_reported_when_the_next_begins() {
        let mut eps = endpoints(2);
        let mut b = eps.pop().unwrap();
        let mut a = eps.pop().unwrap();
        a.send(1, f(0, 5), tensor(1.0)).unwrap();
        b.pump().unwrap();
        let err = b.begin_step(1).unwrap_err();
        assert!(
            matches!(err, NetError::Leftover { count: 1, .. }),
            "{err:?}"
        );
        assert!(b.begin_step(0).is_ok());
        let mut c = endpoints(1).pop().unwrap();
        c.begin_step(2).unwrap();
        assert!(matches!(
            c.begin_step(1),
            Err(NetError::StepBackwards {
                current: 2,
                requested: 1
            })
        ));
    }

    #[test]
    fn a_failure_wakes_a_waiting_peer_and_names_the_rank() {
        let mut eps = endpoints(3);
        let mut c = eps.pop().unwrap();
        let b = eps.pop().unwrap();
        let mut a = eps.pop().unwrap();
        let waiter = std::thread::spawn(move || {
            let mut b = b;
            let began = Instant::now();
            let err = b.take(f(0, 0), Instant::now() + Duration::from_secs(30));
            (err, began.elapsed())
        });
        std::thread::sleep(Duration::from_millis(20));
        c.fail(
            "rank 2: F (dir 0, stage 2, mb 0) failed: boom",
            Duration::from_secs(1),
        );
        let (err, waited) = waiter.join().unwrap();
        let err = err.unwrap_err();
        assert_eq!(
            err,
            NetError::Aborted {
                rank: 2,
                message: "rank 2: F (dir 0, stage 2, mb 0) failed: boom".into()
            }
        );
        assert!(waited < Duration::from_secs(10));
        assert_eq!(a.aborted().map(|(r, _)| r), Some(2));
        assert!(matches!(
            c.take(f(0, 1), soon()),
            Err(NetError::Aborted { rank: 2, .. })
        ));
    }

    #[test]
    fn a_send_to_a_peer_gone_after_a_failure_names_the_failure() {
        let mut eps = endpoints(3);
        let mut c = eps.pop().unwrap();
        let b = eps.pop().unwrap();
        let mut a = eps.pop().unwrap();
        // Rank 2 fails and tells everyone; rank 1 hears it and is gone before rank 0 sends.
        c.fail("rank 2: asked to stop", Duration::from_secs(1));
        drop(b);
        assert_eq!(
            a.send(1, f(0, 0), tensor(1.0)).unwrap_err(),
            NetError::Aborted {
                rank: 2,
                message: "rank 2: asked to stop".into()
            }
        );
        // Without a notice, the lost link is the error.
        let mut eps = endpoints(2);
        drop(eps.pop());
        let mut a = eps.pop().unwrap();
        let err = a.send(1, f(0, 0), tensor(1.0)).unwrap_err();
        assert!(err.to_string().contains("rank 1 has gone"), "{err}");
    }

    /// A link whose peers have all gone once its inbox is empty: polling then fails.
    struct Closing(ChannelLink);

    impl Link for Closing {
        fn rank(&self) -> usize {
            self.0.rank()
        }
        fn ranks(&self) -> usize {
            self.0.ranks()
        }
        fn post(&mut self, dst: usize, header: Vec<u8>, body: Vec<u8>) -> Result<(), LinkError> {
            self.0.post(dst, header, body)
        }
        fn poll(&mut self) -> Result<Option<Packet>, LinkError> {
            match self.0.poll()? {
                Some(packet) => Ok(Some(packet)),
                None => Err(LinkError("every peer has gone".into())),
            }
        }
        fn flush(&mut self, deadline: Instant) -> Result<bool, LinkError> {
            self.0.flush(deadline)
        }
    }

    #[test]
    fn a_wait_that_loses_its_link_after_a_failure_names_the_failure() {
        let mut links = ChannelLink::world(2);
        let mut b = Endpoint::new(links.pop().unwrap());
        let mut a = Endpoint::new(Closing(links.pop().unwrap()));
        // Rank 1 fails and tells rank 0; rank 0's next poll after the notice finds the link
        // lost.
        b.fail("rank 1: asked to stop", Duration::from_secs(1));
        assert_eq!(
            a.take(f(0, 0), soon()).unwrap_err(),
            NetError::Aborted {
                rank: 1,
                message: "rank 1: asked to stop".into()
            }
        );
        // Without a notice, the lost link is the error.
        let mut links = ChannelLink::world(2);
        let mut a = Endpoint::new(Closing(links.remove(0)));
        let err = a.take(f(0, 0), soon()).unwrap_err();
        assert!(err.to_string().contains("every peer has gone"), "{err}");
    }

    #[test]
    fn a_stale_message_seen_while_checking_for_aborts_is_reported_by_the_next_take() {
        let mut eps = endpoints(2);
        let mut b = eps.pop().unwrap();
        let mut a = eps.pop().unwrap();
        b.begin_step(1).unwrap();
        a.send(1, f(0, 0), tensor(1.0)).unwrap();
        assert_eq!(b.aborted(), None);
        let err = b.try_take(f(1, 0)).unwrap_err();
        assert!(
            matches!(err, NetError::PastStep { current: 1, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn a_missing_message_times_out() {
        let mut b = endpoints(2).pop().unwrap();
        b.set_spin(Duration::ZERO);
        let err = b
            .take(f(0, 0), Instant::now() + Duration::from_millis(30))
            .unwrap_err();
        assert!(matches!(err, NetError::TimedOut { .. }), "{err:?}");
    }

    #[test]
    fn forged_and_malformed_messages_are_errors() {
        let eps = endpoints(2);
        let mut b = eps.into_iter().nth(1).unwrap();
        let (header, body) = pack(f(0, 0), 1, tensor(0.0));
        b.link_mut().inject(0, header, body);
        assert!(matches!(b.pump(), Err(NetError::Wire { src: 0, .. })));
        b.link_mut().inject(0, b"junk".to_vec(), Vec::new());
        assert!(matches!(b.pump(), Err(NetError::Wire { src: 0, .. })));
        let (header, _) = pack(f(0, 0), 0, tensor(0.0));
        b.link_mut().inject(0, header, vec![1, 2, 3]);
        assert!(matches!(b.pump(), Err(NetError::Wire { src: 0, .. })));
        assert!(matches!(
            b.send(7, f(0, 0), tensor(0.0)),
            Err(NetError::NoSuchRank { dst: 7, ranks: 2 })
        ));
        let _ = WireDType::F64;
    }
}
