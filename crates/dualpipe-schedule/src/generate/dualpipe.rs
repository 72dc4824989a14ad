//! The `dualpipe` generator.

use crate::{Schedule, ScheduleError};

/// Generates the compute-only `dualpipe` schedule.
pub fn generate(ranks: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    let _ = (ranks, micro_batches);
    Err(ScheduleError::InvalidConfig("dualpipe is not implemented yet".into()))
}
