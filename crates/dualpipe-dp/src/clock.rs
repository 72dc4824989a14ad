//! The logical clock of one worker's exchange: early arrivals wait, stale and duplicate ones
//! are refused.
//!
//! Arrivals are filed by (sender, [`MsgKey`]). At step `t` a message of step `t` or `t + 1` is
//! kept until the exchange asks for it (a faster peer may already be in the next step; it
//! cannot be further ahead, because finishing step `t + 1` needs this worker's step `t + 1`
//! contributions); one of an earlier step is refused as stale, one of a later step as from the
//! future, a second copy of a message (buffered or already used) as a duplicate. Moving to the
//! next step fails while a message of the current step is still unused, so a gradient of step
//! `t` can never be applied in step `t + 1`.
//!
//! A worker that only receives ([`Clock::receiving_only`]: the partner of presummed copies,
//! which sends its lead nothing) holds nobody back, so its sender may be any number of steps
//! ahead: such a clock keeps messages of every later step, in the order they came, and still
//! refuses stale and duplicate ones.

use std::collections::{HashMap, HashSet};

use crate::message::{MsgHeader, MsgKey};
use crate::transport::Incoming;
use crate::DpError;

/// One worker's mailbox and step counter.
#[derive(Debug, Default)]
pub struct Clock {
    stage: usize,
    step: Option<u64>,
    buffered: HashMap<(usize, MsgKey), (MsgHeader, Vec<u8>)>,
    taken: HashSet<(usize, MsgKey)>,
    early: u64,
    /// How many steps ahead of this worker a sender may be (`None`: any number).
    lead: Option<u64>,
}

impl Clock {
    /// A clock for the data-parallel group of `stage`, before its first step.
    pub fn new(stage: usize) -> Self {
        Clock {
            stage,
            lead: Some(1),
            ..Clock::default()
        }
    }

    /// A clock for a worker of `stage` that sends nothing its senders wait for, so they may be
    /// any number of steps ahead of it: messages of every later step are kept (see the
    /// [module](self) documentation).
    pub fn receiving_only(stage: usize) -> Self {
        Clock {
            stage,
            lead: None,
            ..Clock::default()
        }
    }

    /// Whether a message of step `key_step` is further ahead of `step` than a sender may be.
    fn too_far(&self, key_step: u64, step: u64) -> bool {
        self.lead
            .is_some_and(|lead| key_step > step.saturating_add(lead))
    }

    /// The current step (`None` before the first).
    pub fn step(&self) -> Option<u64> {
        self.step
    }

    /// Messages that arrived while this worker was still in an earlier step (so far).
    pub fn early_arrivals(&self) -> u64 {
        self.early
    }

    /// Number of messages waiting to be used.
    pub fn buffered(&self) -> usize {
        self.buffered.len()
    }

    /// Moves to `step`, which must be later than the current one; fails if a message of an
    /// earlier step is still unused, or if one already buffered is too far ahead.
    pub fn begin(&mut self, step: u64) -> Result<(), DpError> {
        if let Some(current) = self.step {
            if step <= current {
                return Err(DpError::StepNotLater {
                    current,
                    requested: step,
                });
            }
        }
        let mut bad: Vec<&(usize, MsgKey)> = self
            .buffered
            .keys()
            .filter(|(_, k)| k.step < step || self.too_far(k.step, step))
            .collect();
        bad.sort();
        if let Some(&&(from, key)) = bad.first() {
            return Err(if key.step < step {
                DpError::Leftover {
                    from,
                    key,
                    count: bad.len(),
                    next: step,
                }
            } else {
                DpError::FromTheFuture {
                    from,
                    key,
                    current: step,
                }
            });
        }
        self.taken.clear();
        self.step = Some(step);
        Ok(())
    }

    /// Files an arrival, or refuses it.
    pub fn file(&mut self, m: Incoming) -> Result<(), DpError> {
        let Incoming { from, header, body } = m;
        let key = header.key;
        if key.stage != self.stage {
            return Err(DpError::WrongStage {
                from,
                key,
                stage: self.stage,
            });
        }
        if let Some(current) = self.step {
            if key.step < current {
                return Err(DpError::Stale { from, key, current });
            }
            if self.too_far(key.step, current) {
                return Err(DpError::FromTheFuture { from, key, current });
            }
            if key.step > current {
                self.early += 1;
            }
        }
        let id = (from, key);
        if self.taken.contains(&id) || self.buffered.contains_key(&id) {
            return Err(DpError::Duplicate { from, key });
        }
        self.buffered.insert(id, (header, body));
        Ok(())
    }

    /// The message `key` from `from`, if it has arrived (it then counts as used).
    pub fn take(&mut self, from: usize, key: MsgKey) -> Option<(MsgHeader, Vec<u8>)> {
        let found = self.buffered.remove(&(from, key))?;
        if Some(key.step) == self.step {
            self.taken.insert((from, key));
        }
        Some(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Part;
    use crate::Compression;

    fn msg(from: usize, step: u64, bucket: usize) -> Incoming {
        Incoming {
            from,
            header: MsgHeader {
                key: key(step, bucket),
                compression: Compression::None,
                values: 1,
            },
            body: vec![0; 4],
        }
    }

    fn key(step: u64, bucket: usize) -> MsgKey {
        MsgKey {
            step,
            stage: 2,
            bucket,
            part: Part::Scatter { shard: 0 },
        }
    }

    #[test]
    fn early_arrivals_wait_and_stale_future_and_duplicate_ones_are_refused() {
        let mut c = Clock::new(2);
        c.begin(5).unwrap();
        c.file(msg(1, 6, 0)).unwrap(); // the next step: kept
        c.file(msg(1, 5, 0)).unwrap();
        let err = c.file(msg(1, 5, 0)).unwrap_err();
        assert!(matches!(err, DpError::Duplicate { from: 1, .. }), "{err}");
        assert!(c.take(1, key(5, 0)).is_some());
        let err = c.file(msg(1, 5, 0)).unwrap_err();
        assert!(err.to_string().contains("second copy"), "{err}");
        let err = c.file(msg(1, 4, 0)).unwrap_err();
        assert!(matches!(err, DpError::Stale { current: 5, .. }), "{err}");
        assert!(err.to_string().contains("step 4"), "{err}");
        let err = c.file(msg(1, 7, 0)).unwrap_err();
        assert!(matches!(err, DpError::FromTheFuture { .. }), "{err}");
        let mut other = msg(1, 5, 1);
        other.header.key.stage = 3;
        assert!(matches!(
            c.file(other).unwrap_err(),
            DpError::WrongStage { stage: 2, .. }
        ));
        c.begin(6).unwrap();
        assert!(c.take(1, key(6, 0)).is_some());
        assert!(c.begin(6).is_err(), "a step cannot begin twice");
    }

    #[test]
    fn a_step_cannot_begin_while_a_message_of_the_last_one_is_unused() {
        let mut c = Clock::new(2);
        c.begin(0).unwrap();
        c.file(msg(3, 0, 1)).unwrap();
        let err = c.begin(1).unwrap_err();
        assert!(matches!(err, DpError::Leftover { count: 1, .. }), "{err}");
        // Nothing of step 0 can be used in step 1: the clock stays at step 0.
        assert_eq!(c.step(), Some(0));
    }

    #[test]
    fn before_the_first_step_any_step_is_kept_until_it_begins() {
        let mut c = Clock::new(2);
        c.file(msg(0, 1000, 0)).unwrap();
        assert_eq!(c.buffered(), 1);
        assert!(matches!(Clock::new(2).begin(3).map(|_| ()), Ok(())));
        let err = c.begin(998).unwrap_err();
        assert!(matches!(err, DpError::FromTheFuture { .. }), "{err}");
        c.begin(1000).unwrap();
        assert!(c.take(0, key(1000, 0)).is_some());
    }

    /// A worker that only receives holds its sender back in nothing: a message any number of
    /// steps ahead waits for its step (a plain clock refuses it), a stale or duplicate one is
    /// still refused, and a step still cannot begin while one of the last is unused.
    #[test]
    fn a_receiving_only_clock_keeps_every_later_step() {
        let mut plain = Clock::new(2);
        plain.begin(0).unwrap();
        assert!(matches!(
            plain.file(msg(0, 2, 0)).unwrap_err(),
            DpError::FromTheFuture { current: 0, .. }
        ));
        let mut c = Clock::receiving_only(2);
        c.file(msg(0, 0, 0)).unwrap();
        c.file(msg(0, 5, 0)).unwrap();
        c.begin(0).unwrap();
        c.file(msg(0, 2, 0)).unwrap();
        c.file(msg(0, 1, 0)).unwrap();
        assert_eq!(c.early_arrivals(), 2);
        assert!(matches!(
            c.begin(1).unwrap_err(),
            DpError::Leftover { count: 1, .. }
        ));
        assert!(c.take(0, key(0, 0)).is_some());
        c.begin(1).unwrap();
        assert!(matches!(
            c.file(msg(0, 0, 0)).unwrap_err(),
            DpError::Stale { .. }
        ));
        assert!(matches!(
            c.file(msg(0, 2, 0)).unwrap_err(),
            DpError::Duplicate { .. }
        ));
        assert!(c.take(0, key(1, 0)).is_some());
        c.begin(2).unwrap();
        assert!(c.take(0, key(2, 0)).is_some());
        c.begin(5).unwrap();
        assert!(c.take(0, key(5, 0)).is_some());
    }
}
