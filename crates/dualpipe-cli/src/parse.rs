//! The flag parsers every command shares: counts ([`count`]), seeds ([`seed`]), schedule kinds
//! ([`parse_kind`]) and files ([`read_schedule_file`]), and a schedule's or a configuration's
//! refusal in the command line's words ([`schedule_flags`], [`message`]).

use std::path::Path;

use dualpipe_schedule::ir::UnknownScheduleKind;
use dualpipe_schedule::{ConfigError, Knob, Schedule, ScheduleError, ScheduleKind};
use dualpipe_train::TrainError;

/// Parses a count flag (`--ranks`, `--micro-batches`, ...): a whole number from 0 up. Negative
/// numbers reach this check (flags use `allow_negative_numbers`) instead of being taken for an
/// unknown flag; 0 passes here and is refused, with the nearest valid value, by the library.
pub fn count(text: &str) -> Result<usize, String> {
    let t = text.trim();
    if let Ok(n) = t.parse::<usize>() {
        return Ok(n);
    }
    if t.parse::<i128>().is_ok_and(|n| n < 0) || t.parse::<f64>().is_ok_and(|x| x < 0.0) {
        return Err(format!(
            "a count cannot be negative, got {t}; give a whole number from 1 up"
        ));
    }
    if t.parse::<i128>().is_ok() {
        return Err(format!("{t} is too large (the most is {})", usize::MAX));
    }
    if t.parse::<f64>().is_ok() {
        return Err(format!("{t} is not a whole number; give a count such as 4"));
    }
    Err(format!("{t} is not a number; give a count such as 4"))
}

/// Parses a `--seed`: a whole number from 0 to 2^64 - 1. A negative number reaches this check
/// (the flag uses `allow_negative_numbers`) and gets the range, not "unexpected argument".
pub fn seed(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.parse::<u64>().map_err(|_| {
        format!(
            "{t} is not a seed; give a whole number from 0 to {}",
            u64::MAX
        )
    })
}

/// Parses a `--schedule` value, naming the valid kinds when it is unknown.
pub fn parse_kind(name: &str) -> Result<ScheduleKind, String> {
    name.parse().map_err(|_: UnknownScheduleKind| {
        format!(
            "unknown schedule '{name}' (--schedule): use one of {}",
            UnknownScheduleKind::valid()
        )
    })
}

/// Reads `--schedule-file` (our JSON or torch's compute-only CSV, validated on import); a
/// file that cannot be read or used is a message naming the flag.
pub fn read_schedule_file(path: &Path) -> Result<Schedule, String> {
    dualpipe_schedule::format::read_schedule_file(path).map_err(|e| match e {
        ScheduleError::Parse(msg) => format!("{msg} (--schedule-file)"),
        other => format!(
            "schedule file {} (--schedule-file): {other}",
            path.display()
        ),
    })
}

/// A schedule's unsupported configuration in the command line's words: each setting by its
/// flag (`--ranks 2`, `--schedule interleaved`).
pub fn schedule_flags(err: &ConfigError) -> String {
    err.render(|knob, value| {
        let flag = match knob {
            Knob::Kind => "--schedule",
            Knob::Ranks => "--ranks",
            Knob::MicroBatches => "--micro-batches",
            Knob::VirtualStages => "--virtual-stages",
        };
        match value {
            Some(v) => format!("{flag} {v}"),
            None => flag.to_string(),
        }
    })
}

/// A configuration error's own words (without the library's prefix).
pub fn message(err: TrainError) -> String {
    match err {
        TrainError::Config(msg) => msg,
        TrainError::Schedule(ScheduleError::InvalidConfig(e)) => schedule_flags(&e),
        other => other.to_string(),
    }
}
