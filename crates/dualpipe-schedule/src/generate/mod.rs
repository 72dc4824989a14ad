//! Schedule generators: compute-only programs for every [`ScheduleKind`].
//!
//! Every generator returns a schedule without communication ops; [`crate::lower()`] adds them.
//! An unsupported configuration gives [`ScheduleError::InvalidConfig`] with one line naming the
//! constraint and the nearest valid values.

mod dualpipe;
mod dualpipev;
mod gpipe;
mod interleaved;
mod one_f_one_b;
mod zb1p;

use crate::{ConfigError, Knob, Op, Schedule, ScheduleError, ScheduleKind, StagePlacement};

/// Generates the compute-only schedule of `kind` for `ranks` ranks and `micro_batches`
/// micro-batches (`virtual_stages` is chosen for `interleaved` only; other kinds take 1, or the
/// value they fix, see [`ScheduleKind::fixed_virtual_stages`]).
pub fn generate(
    kind: ScheduleKind,
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Result<Schedule, ScheduleError> {
    if let Some(fixed) = kind.fixed_virtual_stages() {
        if virtual_stages != 1 && virtual_stages != fixed {
            return Err(ScheduleError::InvalidConfig(
                ConfigError::new(format!(
                    "{kind} has {fixed} stage(s) per rank, fixed by the schedule, got "
                ))
                .setting(Knob::VirtualStages, virtual_stages)
                .text(": use ")
                .setting(Knob::VirtualStages, 1)
                .text(" (or ")
                .setting(Knob::Kind, "interleaved")
                .text(" to choose it)"),
            ));
        }
    }
    match kind {
        ScheduleKind::GPipe => gpipe::generate(ranks, micro_batches),
        ScheduleKind::OneFOneB => one_f_one_b::generate(ranks, micro_batches),
        ScheduleKind::Interleaved => interleaved::generate(ranks, micro_batches, virtual_stages),
        ScheduleKind::Zb1p => zb1p::generate(ranks, micro_batches),
        ScheduleKind::DualPipe => dualpipe::generate(ranks, micro_batches),
        ScheduleKind::DualPipeV => dualpipev::generate(ranks, micro_batches),
    }
}

/// The checks every single-direction generator shares: at least one rank and one micro-batch,
/// and a size that fits in memory.
fn check_common(
    name: &str,
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Result<(), ScheduleError> {
    if ranks == 0 {
        return Err(ScheduleError::InvalidConfig(
            ConfigError::new(format!("{name} needs at least 1 rank, got 0: use "))
                .setting(Knob::Ranks, 1),
        ));
    }
    if micro_batches == 0 {
        return Err(ScheduleError::InvalidConfig(
            ConfigError::new(format!("{name} needs at least 1 micro-batch, got 0: use "))
                .setting(Knob::MicroBatches, 1),
        ));
    }
    if virtual_stages == 0 {
        return Err(ScheduleError::InvalidConfig(
            ConfigError::new(format!(
                "{name} needs at least 1 virtual stage per rank, got 0: use "
            ))
            .setting(Knob::VirtualStages, 1),
        ));
    }
    let ops = ranks
        .checked_mul(micro_batches)
        .and_then(|x| x.checked_mul(virtual_stages))
        .and_then(|x| x.checked_mul(3));
    match ops {
        Some(ops) if ops <= dualpipe::MAX_OPS => Ok(()),
        _ => Err(ScheduleError::InvalidConfig(
            ConfigError::new(format!(
                "{name} with {ranks} ranks, {micro_batches} micro-batches and {virtual_stages} \
                 virtual stage(s) would need more than {} ops: use fewer ",
                dualpipe::MAX_OPS
            ))
            .name(Knob::Ranks)
            .text(" or ")
            .name(Knob::MicroBatches),
        )),
    }
}

/// A single-direction schedule whose stage `s` runs on rank `s % ranks`
/// ([`StagePlacement::for_kind`]).
fn single_direction(
    kind: ScheduleKind,
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
    programs: Vec<Vec<Op>>,
) -> Schedule {
    Schedule {
        kind,
        ranks,
        micro_batches,
        virtual_stages,
        placement: StagePlacement::for_kind(kind, ranks, virtual_stages),
        programs,
    }
}
