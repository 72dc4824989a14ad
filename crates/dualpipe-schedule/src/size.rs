//! The size guard: how many chunks a requested schedule holds, checked against a documented cap
//! before anything is allocated.
//!
//! A generated, lowered and validated schedule costs about 600 bytes per chunk at its peak
//! (the ops, the validator's tables, and the JSON text when printed: 64 ranks x 4,096
//! micro-batches, 262,144 chunks, peak at 150 MB), so [`MAX_CHUNKS`] = 2,097,152 keeps one
//! schedule near 1.3 GB.

use crate::{ConfigError, Knob, ScheduleError, ScheduleKind};

/// Most chunks (stage x micro-batch pairs, over every direction) one schedule may hold.
pub const MAX_CHUNKS: usize = 1 << 21;

/// The chunks the generator of `kind` walks for these sizes, or `None` when the count
/// overflows: every stage of every direction times the micro-batches that flow through it.
/// DualPipe and DualPipeV walk at least `2 x ranks` micro-batches (their generator builds the
/// reference schedule of that size and drops what does not exist).
pub fn chunks(
    kind: ScheduleKind,
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Option<usize> {
    let per_rank = kind.fixed_virtual_stages().unwrap_or(virtual_stages);
    let walked = match kind {
        ScheduleKind::DualPipe | ScheduleKind::DualPipeV => {
            micro_batches.max(ranks.checked_mul(2)?)
        }
        _ => micro_batches,
    };
    ranks.checked_mul(per_rank)?.checked_mul(walked)
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Refuses sizes over [`MAX_CHUNKS`] with [`ScheduleError::InvalidConfig`], naming the flag
/// that is too large (`--ranks`, `--micro-batches` or `--virtual-stages`) and the most it can be
/// with the others as given. Zero sizes pass (the generators name what is missing).
pub fn check_size(
    kind: ScheduleKind,
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> Result<(), ScheduleError> {
    if ranks == 0 || micro_batches == 0 || virtual_stages == 0 {
        return Ok(());
    }
    let count = chunks(kind, ranks, micro_batches, virtual_stages);
    if count.is_some_and(|c| c <= MAX_CHUNKS) {
        return Ok(());
    }
    let cap = thousands(MAX_CHUNKS);
    let total = count.map_or_else(|| "more than 2^64".to_string(), thousands);
    let v_is_setting = kind.fixed_virtual_stages().is_none();
    let mut e = ConfigError::new(format!("{kind} with "))
        .setting(Knob::Ranks, ranks)
        .text(" and ")
        .setting(Knob::MicroBatches, micro_batches);
    if v_is_setting && virtual_stages != 1 {
        e = e.text(" and ").setting(Knob::VirtualStages, virtual_stages);
    }
    e = e.text(format!(
        " holds {total} chunks (over the cap of {cap}, about 1.3 GB): use "
    ));
    // For each setting: the most it can be with the others as given (none if even 1 is too many).
    let mut options: Vec<(Knob, usize, String)> = Vec::new();
    let mbs = largest_fitting(|m| chunks(kind, ranks, m, virtual_stages));
    if mbs > 0 {
        options.push((Knob::MicroBatches, mbs, format!(" with {ranks} ranks")));
    }
    let rs = largest_fitting(|r| chunks(kind, r, micro_batches, virtual_stages));
    if rs > 0 {
        options.push((
            Knob::Ranks,
            rs,
            format!(" with {micro_batches} micro-batches"),
        ));
    }
    if v_is_setting && virtual_stages > 1 {
        let vs = largest_fitting(|v| chunks(kind, ranks, micro_batches, v));
        if vs > 0 {
            options.push((Knob::VirtualStages, vs, String::new()));
        }
    }
    if options.is_empty() {
        e = e
            .text("fewer ")
            .name(Knob::Ranks)
            .text(" and ")
            .name(Knob::MicroBatches);
    }
    for (i, (knob, most, with)) in options.into_iter().enumerate() {
        if i > 0 {
            e = e.text(", or ");
        }
        e = e.text("at most ").setting(knob, most).text(with);
    }
    Err(ScheduleError::InvalidConfig(e))
}

/// The largest `r` in `1 ..= MAX_CHUNKS` with `count(r) <= MAX_CHUNKS` (0 if none), for a count
/// that grows with `r`.
fn largest_fitting(count: impl Fn(usize) -> Option<usize>) -> usize {
    let fits = |r: usize| count(r).is_some_and(|c| c <= MAX_CHUNKS);
    let (mut lo, mut hi) = (0usize, MAX_CHUNKS);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_stage_and_micro_batch() {
        assert_eq!(chunks(ScheduleKind::GPipe, 4, 8, 1), Some(32));
        assert_eq!(chunks(ScheduleKind::Interleaved, 4, 8, 3), Some(96));
        assert_eq!(chunks(ScheduleKind::DualPipeV, 4, 8, 1), Some(64));
        assert_eq!(chunks(ScheduleKind::DualPipe, 4, 4, 1), Some(32));
        assert_eq!(chunks(ScheduleKind::GPipe, usize::MAX, 2, 1), None);
    }

    #[test]
    fn names_the_flag_that_is_too_large() {
        let msg = |k, r, m, v| check_size(k, r, m, v).unwrap_err().to_string();
        let m = msg(ScheduleKind::GPipe, 1024, 16384, 1);
        assert!(
            m.contains("use at most micro_batches = 2048 with 1024 ranks, or at most ranks = 128"),
            "{m}"
        );
        assert!(m.contains("16,777,216 chunks"), "{m}");
        let m = msg(ScheduleKind::OneFOneB, 1_000_000_000_000, 8, 1);
        assert!(m.contains("use at most ranks = 262144 with 8"), "{m}");
        assert!(!m.contains("at most --micro-batches"), "{m}");
        let m = msg(ScheduleKind::Interleaved, 4, 8, 1 << 20);
        assert!(m.contains("use at most virtual_stages = 65536"), "{m}");
        let m = msg(ScheduleKind::DualPipe, 4096, 2, 1);
        assert!(m.contains("use at most ranks = 1024 with 2"), "{m}");
        assert!(check_size(ScheduleKind::GPipe, 1024, 2048, 1).is_ok());
        assert!(check_size(ScheduleKind::GPipe, 0, usize::MAX, 1).is_ok());
    }
}
