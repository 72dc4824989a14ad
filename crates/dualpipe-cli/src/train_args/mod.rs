//! The arguments of `dualpipe train` (also read by `cluster serve` for its jobs) and the one
//! place they become a job's configuration ([`TrainArgs::job`]: a
//! [`JobConfig`](dualpipe_train::job::JobConfig) holding the
//! [`TrainConfig`](dualpipe_train::TrainConfig)); the flag parsers every command shares are
//! [`crate::parse`].
//!
//! Every default is read from [`TrainConfig::DEFAULT`](dualpipe_train::TrainConfig::DEFAULT)
//! (or the MLP's, or [`MoeSettings::DEFAULT`](dualpipe_train::MoeSettings::DEFAULT)) so the
//! help text cannot drift from the library. Every refusal is a `TrainError::Config` whose
//! message names the flag and a valid value (shown as a usage error, exit code 2); sizes are
//! checked once, by [`TrainConfig::check`](dualpipe_train::TrainConfig::check) in flag words
//! ([`Naming::Flags`](dualpipe_train::Naming::Flags)), and the job names fields by their flags
//! too. After [`TrainArgs::job`] no clap type is seen: the binary calls
//! [`Job::run`](dualpipe_train::job::Job::run).
//!
//! - [`args`] — [`TrainArgs`], the flags themselves, with [`Transport`] and [`Format`];
//! - [`resolve`] — [`TrainArgs::config`] and [`TrainArgs::job`]: flags → configuration (and
//!   `--init-from`'s architecture);
//! - [`layout`] — [`LayoutArgs`]: partition, plan, profile, slow rank, re-balancing;
//! - [`moe`] — [`MoeArgs`]: the mixture of experts;
//! - [`observe`] — [`ObserveArgs`]: progress, metrics address, run log;
//! - [`inject`] — `--inject-failure`'s `RANK:STEP:HOW`.

use dualpipe_train::TrainError;

use crate::parse::{count, message, parse_kind, read_schedule_file, seed};

pub mod args;
pub mod inject;
pub mod layout;
pub mod moe;
pub mod observe;
pub mod resolve;
#[cfg(test)]
mod tests;

pub use args::{Format, TrainArgs, Transport};
pub use inject::parse_injection;
pub use layout::LayoutArgs;
pub use moe::MoeArgs;
pub use observe::ObserveArgs;

/// A configuration error in its own words, as a [`TrainError::Config`].
fn reworded(err: TrainError) -> TrainError {
    TrainError::Config(message(err))
}

/// `unknown {what} '{value}' ({flag}): use one of ...`.
fn unknown(what: &str, flag: &str, value: &str, names: &[&str]) -> TrainError {
    TrainError::Config(format!(
        "unknown {what} '{value}' ({flag}): use one of {}",
        names.join(", ")
    ))
}
