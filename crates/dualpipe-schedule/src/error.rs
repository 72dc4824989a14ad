//! Errors of schedule generation, validation and parsing.

use crate::validate::ValidationError;

/// Anything that can go wrong while making, checking or reading a schedule.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// The requested configuration is not supported by the schedule kind. The message names
    /// the constraint and the nearest valid values.
    #[error("{0}")]
    InvalidConfig(String),
    /// The schedule breaks a rule (see [`ValidationError`]).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// A JSON or CSV text could not be read.
    #[error("{0}")]
    Parse(String),
}
