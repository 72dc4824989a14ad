//! Pipeline-parallel schedules as data.
//!
//! A schedule is *generated* ([`generate`](mod@generate): compute-only programs for gpipe, 1f1b,
//! interleaved, zb1p, dualpipe and dualpipev), *lowered* ([`lower`](mod@lower): send/receive ops added) and
//! *validated* ([`validate`](mod@validate): complete, causal, matched, deadlock-free); [`build`] does all
//! three. Text forms live in [`format`](mod@format): JSON in the golden schema (lossless) and torch's
//! compute-only action CSV.
//!
//! ```
//! use dualpipe_schedule::{build, format, ScheduleKind};
//!
//! let schedule = build(ScheduleKind::OneFOneB, 4, 8, 1).unwrap();
//! let text = format::json::to_string(&schedule);
//! assert_eq!(format::json::from_str(&text).unwrap(), schedule);
//! ```

#![warn(missing_docs)]

pub mod error;
pub mod format;
pub mod generate;
pub mod ir;
pub mod lower;
pub mod recompute;
mod size;
pub mod timeline;
pub mod validate;

pub use error::{ConfigError, Knob, Part, ScheduleError};
pub use generate::generate;
pub use ir::{Chunk, Op, OpKind, Schedule, ScheduleKind, StagePlacement};
pub use lower::lower;
pub use recompute::Recompute;
pub use size::{check_size, chunks, MAX_CHUNKS};
pub use timeline::{ComputeInterval, MessageInterval, MessageKind, Timeline};
pub use validate::{validate, ValidationError};

/// Generates, lowers and validates a schedule in one call.
///
/// Fails with [`ScheduleError::InvalidConfig`] when `kind` does not support the sizes (the
/// message names the constraint and the nearest valid values), or when the schedule would hold
/// more than [`MAX_CHUNKS`] chunks ([`check_size`], checked before anything is allocated).
pub fn build(
    kind: ScheduleKind,
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Result<Schedule, ScheduleError> {
    check_size(kind, ranks, micro_batches, virtual_stages)?;
    let schedule = lower(&generate(kind, ranks, micro_batches, virtual_stages)?);
    validate(&schedule)?;
    Ok(schedule)
}
