//! [`StopRequest`]: a run asked to stop at a step boundary (Ctrl-C, SIGTERM), the same
//! boundary on every data-parallel replica.
//!
//! One trainer (the lead) polls the request's source before each step; when the source says
//! stop, it fixes the boundary: the steps done now (one pipeline), or one step later (several
//! replicas: the others may already be inside the current step, which needs the lead's
//! gradients, but none can be past it). Every trainer stops at that boundary, hands the writer
//! its part of a final checkpoint, and ends with [`TrainError::Interrupted`](crate::TrainError).

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;

/// Where a stop request comes from: the signal number that asked for it, once one did.
pub type StopSource = fn() -> Option<i32>;

#[derive(Debug)]
struct Shared {
    source: StopSource,
    /// The steps done at which every trainer stops (`usize::MAX`: not yet asked).
    at: AtomicUsize,
    signal: AtomicI32,
    /// Steps between the lead seeing the request and the boundary (0 or 1).
    lag: usize,
}

/// A request to stop at a step boundary, shared by the trainers of one run.
#[derive(Clone, Debug)]
pub struct StopRequest {
    shared: Arc<Shared>,
    polls: bool,
}

impl StopRequest {
    /// A request the lead polls from `source`; `replicated`: the run has several
    /// data-parallel replicas (the boundary is one step after the lead sees it).
    pub fn new(source: StopSource, replicated: bool) -> Self {
        StopRequest {
            shared: Arc::new(Shared {
                source,
                at: AtomicUsize::new(usize::MAX),
                signal: AtomicI32::new(0),
                lag: usize::from(replicated),
            }),
            polls: true,
        }
    }

    /// The same request for a trainer that only follows the lead's decision.
    pub fn follower(&self) -> Self {
        StopRequest {
            shared: Arc::clone(&self.shared),
            polls: false,
        }
    }

    /// Whether a trainer with `done` steps done stops now, and the signal that asked.
    pub fn stops(&self, done: usize) -> Option<i32> {
        let s = &self.shared;
        if self.polls && s.at.load(Ordering::SeqCst) == usize::MAX {
            if let Some(signal) = (s.source)() {
                s.signal.store(signal, Ordering::SeqCst);
                s.at.store(done + s.lag, Ordering::SeqCst);
            }
        }
        (done >= s.at.load(Ordering::SeqCst)).then(|| s.signal.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> Option<i32> {
        None
    }

    fn now() -> Option<i32> {
        Some(15)
    }

    #[test]
    fn replicas_stop_one_step_after_the_lead_sees_the_request() {
        let quiet = StopRequest::new(never, true);
        assert_eq!(quiet.stops(3), None);
        let lead = StopRequest::new(now, true);
        let other = lead.follower();
        assert_eq!(other.stops(4), None, "a follower never polls");
        assert_eq!(lead.stops(4), None);
        assert_eq!(other.stops(4), None);
        assert_eq!(other.stops(5), Some(15));
        assert_eq!(lead.stops(5), Some(15));
        let alone = StopRequest::new(now, false);
        assert_eq!(alone.stops(7), Some(15));
    }
}
