//! Schedule generators: compute-only programs for every [`ScheduleKind`].

use crate::{Schedule, ScheduleError, ScheduleKind};

/// Generates the compute-only schedule of `kind` for `ranks` ranks and `micro_batches`
/// micro-batches (`virtual_stages` is used by `interleaved` only).
pub fn generate(
    kind: ScheduleKind,
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Result<Schedule, ScheduleError> {
    let _ = (ranks, micro_batches, virtual_stages);
    Err(ScheduleError::InvalidConfig(format!("{kind} is not implemented yet")))
}
