//! Pipeline-parallel schedules as data.
//!
//! A schedule is *generated* ([`generate`]), *lowered* ([`lower`]: send/receive ops added) and
//! *validated* ([`validate`]); [`build`] does all three. Text forms live in [`format`].

pub mod error;
pub mod format;
pub mod generate;
pub mod ir;
pub mod lower;
pub mod validate;

pub use error::ScheduleError;
pub use generate::generate;
pub use ir::{Chunk, Op, OpKind, Placement, Schedule, ScheduleKind};
pub use lower::lower;
pub use validate::{validate, ValidationError};

/// Generates, lowers and validates a schedule in one call.
pub fn build(
    kind: ScheduleKind,
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Result<Schedule, ScheduleError> {
    let schedule = lower(&generate(kind, ranks, micro_batches, virtual_stages)?);
    validate(&schedule)?;
    Ok(schedule)
}
