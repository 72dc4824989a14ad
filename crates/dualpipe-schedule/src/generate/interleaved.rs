//! The `interleaved` generator.

use crate::{Schedule, ScheduleError};

/// Generates the compute-only interleaved 1F1B schedule with `virtual_stages` stages per rank.
pub fn generate(
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Result<Schedule, ScheduleError> {
    let _ = (ranks, micro_batches, virtual_stages);
    Err(ScheduleError::InvalidConfig(
        "interleaved is not implemented yet".into(),
    ))
}
