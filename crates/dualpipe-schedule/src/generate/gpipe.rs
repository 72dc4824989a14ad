//! The `gpipe` generator.

use crate::{Schedule, ScheduleError};

/// Generates the compute-only `gpipe` schedule.
pub fn generate(ranks: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    let _ = (ranks, micro_batches);
    Err(ScheduleError::InvalidConfig("gpipe is not implemented yet".into()))
}
