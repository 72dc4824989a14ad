//! `--inject-failure RANK:STEP:HOW` (testing only): which rank fails at which step, and how
//! ([`parse_injection`] into the job's [`Injection`]).

use dualpipe_train::job::{How, Injection};
use dualpipe_train::TrainError;

/// Parses `RANK:STEP:HOW`, STEP 1-based; anything else is a [`TrainError::Config`] naming the
/// flag and the form.
pub fn parse_injection(text: &str) -> Result<Injection, TrainError> {
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
