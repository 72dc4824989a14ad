//! Schedule generators: compute-only programs for every [`ScheduleKind`].

mod dualpipe;
mod dualpipev;
mod gpipe;
mod interleaved;
mod one_f_one_b;
mod zb1p;

use crate::{Schedule, ScheduleError, ScheduleKind};

/// Generates the compute-only schedule of `kind` for `ranks` ranks and `micro_batches`
/// micro-batches (`virtual_stages` is used by `interleaved` only).
pub fn generate(
    kind: ScheduleKind,
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Result<Schedule, ScheduleError> {
    match kind {
        ScheduleKind::GPipe => gpipe::generate(ranks, micro_batches),
        ScheduleKind::OneFOneB => one_f_one_b::generate(ranks, micro_batches),
        ScheduleKind::Interleaved => interleaved::generate(ranks, micro_batches, virtual_stages),
        ScheduleKind::Zb1p => zb1p::generate(ranks, micro_batches),
        ScheduleKind::DualPipe => dualpipe::generate(ranks, micro_batches),
        ScheduleKind::DualPipeV => dualpipev::generate(ranks, micro_batches),
    }
}
