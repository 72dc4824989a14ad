//! The `one_f_one_b` generator.

use crate::{Schedule, ScheduleError};

/// Generates the compute-only `one_f_one_b` schedule.
pub fn generate(ranks: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    let _ = (ranks, micro_batches);
    Err(ScheduleError::InvalidConfig("one_f_one_b is not implemented yet".into()))
}
