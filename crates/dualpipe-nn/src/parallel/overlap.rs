//! The per-rank compute token of an overlapped FB pair: DualPipe's forward chunk and backward
//! chunk run as two threads, but only the one holding the token computes (as on one device);
//! a thread gives the token up while it waits on an expert all-to-all
//! ([`while_waiting`], called by the link), so the other chunk computes meanwhile.
//!
//! Each chunk's own ops run in their usual order, so the math is the same as running the two
//! chunks one after the other; only the waits move.

use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::waits::{self, PairChunk};

/// One rank's right to compute, shared by the two chunks of an FB pair.
#[derive(Debug, Default)]
pub struct ComputeToken {
    busy: Mutex<bool>,
    freed: Condvar,
}

impl ComputeToken {
    fn acquire(&self) {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        while *busy {
            busy = self
                .freed
                .wait(busy)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *busy = true;
    }

    fn release(&self) {
        *self.busy.lock().unwrap_or_else(PoisonError::into_inner) = false;
        self.freed.notify_one();
    }
}

/// The token a thread computes under, with the time it has held it (for [`waits`]).
struct Held {
    token: Arc<ComputeToken>,
    chunk: PairChunk,
    since: Instant,
    total: Duration,
}

thread_local! {
    /// The token the current thread computes under, if any.
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Gives the token back and forgets it when the computation ends (a panic included).
struct Holding(Arc<ComputeToken>);

impl Drop for Holding {
    fn drop(&mut self) {
        if let Some(held) = HELD.with(|h| h.borrow_mut().take()) {
            waits::add_held(held.chunk, held.total + held.since.elapsed());
        }
        self.0.release();
    }
}

/// Whether the current thread computes under a token (inside an overlapped pair).
pub fn holds_token() -> bool {
    HELD.with(|h| h.borrow().is_some())
}

/// Runs `work`, the pair's `chunk`, on this thread holding `token` (waiting for it first);
/// expert all-to-alls inside `work` give it up while they wait.
pub fn compute_with<R>(token: &Arc<ComputeToken>, chunk: PairChunk, work: impl FnOnce() -> R) -> R {
    let asked = Instant::now();
    token.acquire();
    waits::add_start(chunk, asked.elapsed());
    HELD.with(|h| {
        *h.borrow_mut() = Some(Held {
            token: token.clone(),
            chunk,
            since: Instant::now(),
            total: Duration::ZERO,
        })
    });
    let _holding = Holding(token.clone());
    work()
}

/// Runs `wait` (a wait for messages) with the current thread's token given up, if it holds
/// one, and takes the token back afterwards; without a token it just runs `wait`.
pub fn while_waiting<R>(wait: impl FnOnce() -> R) -> R {
    let token = HELD.with(|h| {
        h.borrow_mut().as_mut().map(|held| {
            held.total += held.since.elapsed();
            (held.token.clone(), held.chunk)
        })
    });
    let Some((token, chunk)) = token else {
        return wait();
    };
    token.release();
    let out = wait();
    let done = Instant::now();
    token.acquire();
    waits::add_regain(chunk, done.elapsed());
    HELD.with(|h| {
        if let Some(held) = h.borrow_mut().as_mut() {
            held.since = Instant::now();
        }
    });
    out
}

/// Runs an overlapped FB pair: `forward` (one chunk's forward) on a thread of its own and
/// `backward` (another chunk's backward) on this one, sharing one compute token, so while one
/// waits on an expert all-to-all the other computes. Each chunk's ops keep their order, so the
/// results are those of the sequential pair. A panic in `forward` becomes `panicked()`.
pub fn run_pair<F, B, E>(
    forward: impl FnOnce() -> Result<F, E> + Send,
    backward: impl FnOnce() -> Result<B, E>,
    panicked: impl FnOnce() -> E,
) -> Result<(F, B), E>
where
    F: Send,
    E: Send,
{
    let token = Arc::new(ComputeToken::default());
    let begun = Instant::now();
    std::thread::scope(|scope| {
        let forward = scope.spawn(|| {
            waits::add_thread_start(begun.elapsed());
            let out = compute_with(&token, PairChunk::Forward, forward);
            (out, begun.elapsed())
        });
        let grad = compute_with(&token, PairChunk::Backward, backward);
        let backward_end = begun.elapsed();
        let (out, forward_end) = forward.join().map_err(|_| panicked())?;
        waits::add_pair_span(forward_end.max(backward_end));
        Ok((out?, grad?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn only_the_holder_computes_and_a_wait_hands_the_token_over() {
        // A waits on a message that B sends from inside its own computation: without the
        // hand-over in `while_waiting`, B could never start and A would wait forever.
        let token = Arc::new(ComputeToken::default());
        let (tx, rx) = channel::<u32>();
        let log = Arc::new(Mutex::new(Vec::new()));
        let before = waits::snapshot();
        std::thread::scope(|s| {
            let (t, l) = (token.clone(), log.clone());
            compute_with(&token, PairChunk::Forward, || {
                let b = s.spawn(move || {
                    compute_with(&t, PairChunk::Backward, || {
                        l.lock().unwrap().push("B computes");
                        tx.send(7).unwrap();
                    })
                });
                log.lock().unwrap().push("A computes");
                let got = while_waiting(|| rx.recv().unwrap());
                log.lock().unwrap().push("A has the token back");
                assert_eq!(got, 7);
                b.join().unwrap();
            });
        });
        assert_eq!(
            *log.lock().unwrap(),
            vec!["A computes", "B computes", "A has the token back"]
        );
        // The tallies (global: other tests may add too) saw both holds and the hand-over.
        let after = waits::snapshot();
        assert!(after.token_held.count >= before.token_held.count + 2);
        assert!(after.token_held.seconds > before.token_held.seconds);
        assert!(after.token_regain.count > before.token_regain.count);
        assert!(after.held_forward.count > before.held_forward.count);
        assert!(after.held_backward.count > before.held_backward.count);
        assert!(after.regain_forward.count > before.regain_forward.count);
        assert!(after.start_backward.count > before.start_backward.count);
        // Without a token, a wait is just the wait, and no hand-over is counted.
        assert_eq!(while_waiting(|| 3), 3);
    }
}
