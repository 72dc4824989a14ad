//! The local transport: one inbox channel per rank, messages keyed so nothing can mix.
//!
//! Every rank owns the receiving end of its inbox; every rank holds a sender to every inbox.
//! A send pushes the tensor into the peer's inbox and returns at once (sends never block the
//! compute). Receives are *posted early*: whatever arrives is buffered by its `Key`, so an
//! early arrival is never lost and a compute op waits only for its own input. A failing rank
//! sets a shared abort flag and pushes an abort message into every inbox, which wakes any rank
//! blocked on a receive at once; receives also wake every poll interval to check the flag.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Key, Transport, WaitError};
use crate::RuntimeError;

/// What travels through an inbox.
pub(crate) enum Message<T> {
    /// A tensor for `key`, sent by rank `src`.
    Data { key: Key, src: usize, tensor: T },
    /// Another rank failed: stop.
    Abort,
}

/// State every rank shares: the senders, the abort flag and the first error.
pub(crate) struct Shared<T> {
    senders: Vec<Sender<Message<T>>>,
    abort: AtomicBool,
    first_error: Mutex<Option<RuntimeError>>,
}

/// One rank's end of the local transport: its inbox and the state every rank shares.
pub(crate) struct LocalTransport<'a, T> {
    inbox: Inbox<T>,
    shared: &'a Shared<T>,
    rank: usize,
}

impl<'a, T: Send> LocalTransport<'a, T> {
    /// Rank `rank`'s end, with the receiving side of its inbox.
    pub fn new(rank: usize, receiver: Receiver<Message<T>>, shared: &'a Shared<T>) -> Self {
        LocalTransport {
            inbox: Inbox::new(receiver),
            shared,
            rank,
        }
    }
}

impl<T: Send> Transport<T> for LocalTransport<'_, T> {
    fn send(&mut self, dst: usize, key: Key, tensor: T) -> Result<(), WaitError> {
        self.shared.send(dst, self.rank, key, tensor);
        Ok(())
    }

    fn try_take(&mut self, key: Key) -> Result<Option<(usize, T)>, WaitError> {
        Ok(self.inbox.try_take(key))
    }

    fn take(
        &mut self,
        key: Key,
        deadline: Instant,
        poll: Duration,
    ) -> Result<(usize, T), WaitError> {
        let shared = self.shared;
        self.inbox.take(key, deadline, poll, || shared.aborted())
    }

    fn aborted(&mut self) -> bool {
        self.shared.aborted()
    }

    fn fail(&mut self, err: RuntimeError) {
        self.shared.fail(err);
    }
}

impl<T: Send> Shared<T> {
    /// Channels for `ranks` ranks: the shared state and each rank's inbox.
    pub fn new(ranks: usize) -> (Self, Vec<Receiver<Message<T>>>) {
        let (senders, receivers) = (0..ranks).map(|_| channel()).unzip();
        let shared = Shared {
            senders,
            abort: AtomicBool::new(false),
            first_error: Mutex::new(None),
        };
        (shared, receivers)
    }

    /// Whether a rank has failed.
    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    /// Records `err` (if it is the first) and wakes every rank.
    pub fn fail(&self, err: RuntimeError) {
        {
            let mut first = self
                .first_error
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if first.is_none() {
                *first = Some(err);
            }
        }
        self.abort.store(true, Ordering::Release);
        for sender in &self.senders {
            // A rank that has already finished dropped its inbox; nothing to wake there.
            let _ = sender.send(Message::Abort);
        }
    }

    /// The first error recorded, if any.
    pub fn take_error(&self) -> Option<RuntimeError> {
        self.first_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }

    /// Pushes `tensor` into `dst`'s inbox; never blocks.
    pub fn send(&self, dst: usize, src: usize, key: Key, tensor: T) {
        // A peer that already finished does not need the message; a failed peer has set the
        // abort flag, which the sender notices before its next op.
        let _ = self.senders[dst].send(Message::Data { key, src, tensor });
    }
}

/// One rank's receiving side: its inbox and the messages that arrived before they were needed.
pub(crate) struct Inbox<T> {
    receiver: Receiver<Message<T>>,
    buffered: HashMap<Key, (usize, T)>,
}

impl<T> Inbox<T> {
    /// Wraps a rank's inbox channel.
    pub fn new(receiver: Receiver<Message<T>>) -> Self {
        Inbox {
            receiver,
            buffered: HashMap::new(),
        }
    }

    /// Takes the tensor for `key` if it has already arrived, without waiting.
    pub fn try_take(&mut self, key: Key) -> Option<(usize, T)> {
        self.buffered.remove(&key)
    }

    /// Waits until the tensor for `key` arrives, buffering everything else that comes first.
    /// Gives up at `deadline`, or as soon as the step is aborted (checked at least every
    /// `poll` while waiting).
    pub fn take(
        &mut self,
        key: Key,
        deadline: Instant,
        poll: Duration,
        aborted: impl Fn() -> bool,
    ) -> Result<(usize, T), WaitError> {
        loop {
            if let Some(found) = self.buffered.remove(&key) {
                return Ok(found);
            }
            if aborted() {
                return Err(WaitError::Aborted);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(WaitError::TimedOut);
            }
            match self.receiver.recv_timeout((deadline - now).min(poll)) {
                Ok(Message::Data {
                    key: got,
                    src,
                    tensor,
                }) => {
                    if self.buffered.insert(got, (src, tensor)).is_some() {
                        return Err(WaitError::Duplicate(got, src));
                    }
                }
                Ok(Message::Abort) => return Err(WaitError::Aborted),
                Err(RecvTimeoutError::Timeout) => {}
                // Every rank holds a sender to every inbox, so this cannot happen while the
                // step runs; treat it as an abort rather than spin.
                Err(RecvTimeoutError::Disconnected) => return Err(WaitError::Aborted),
            }
        }
    }
}
