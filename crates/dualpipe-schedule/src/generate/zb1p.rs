//! The `zb1p` generator placeholder.

use crate::{Schedule, ScheduleError};

/// Generates the compute-only `zb1p` schedule.
pub fn generate(ranks: usize, micro_batches: usize) -> Result<Schedule, ScheduleError> {
    let _ = (ranks, micro_batches);
    Err(ScheduleError::InvalidConfig(
        "zb1p is not implemented yet".into(),
    ))
}
