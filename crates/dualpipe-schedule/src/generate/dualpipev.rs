//! The `dualpipev` generator.

use crate::{Schedule, ScheduleError};

/// Generates the compute-only `dualpipev` schedule.
pub fn generate(ranks: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    let _ = (ranks, micro_batches);
    Err(ScheduleError::InvalidConfig("dualpipev is not implemented yet".into()))
}
