//! `--inject-failure RANK:STEP:HOW` (testing only): which rank fails at which step, and how.

use crate::TrainError;

/// How `--inject-failure` makes a rank fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// A clean error, reported to the other ranks.
    Error,
    /// `exit(3)` without a word to anyone (a crash that MPI sees as a lost process).
    Exit,
    /// Death by SIGABRT.
    Abort,
}

/// One injected failure: rank `rank` fails at step `step` (1-based) by `how`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Injection {
    /// The rank that fails.
    pub rank: usize,
    /// The step it fails at, counting from 1.
    pub step: usize,
    /// How it fails.
    pub how: How,
}

impl Injection {
    /// Parses `RANK:STEP:HOW`, STEP 1-based; anything else is a [`TrainError::Config`]
    /// naming the flag and the form.
    pub fn parse(text: &str) -> Result<Self, TrainError> {
        let bad = || {
            TrainError::Config(format!(
                "--inject-failure {text:?}: expected RANK:STEP:HOW such as 2:1:error (HOW is \
                 error, exit or abort; STEP counts from 1)"
            ))
        };
        let parts: Vec<&str> = text.split(':').collect();
        let [rank, step, how] = parts.as_slice() else {
            return Err(bad());
        };
        let rank = rank.trim().parse().map_err(|_| bad())?;
        let step: usize = step.trim().parse().map_err(|_| bad())?;
        let how = match how.trim() {
            "error" => How::Error,
            "exit" => How::Exit,
            "abort" => How::Abort,
            _ => return Err(bad()),
        };
        if step == 0 {
            return Err(bad());
        }
        Ok(Injection { rank, step, how })
    }
}
