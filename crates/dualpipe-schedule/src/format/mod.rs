//! Text forms of a schedule: JSON (lossless, the golden schema) and torch's action CSV, and
//! [`read_schedule`], the one entry point for a schedule file a user wrote or edited.

pub mod csv;
pub mod json;

use crate::{lower, validate, Schedule, ScheduleError};

/// The text form of a schedule file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    /// Our JSON ([`json`]), lowered or compute-only.
    Json,
    /// torch's compute-only action CSV ([`csv`]).
    Csv,
}

impl FileFormat {
    /// The format of a file: by its extension (`.json`, `.csv`, any case) when it has one of
    /// those, otherwise by its content (JSON starts with `{` after any blank space; anything
    /// else is read as CSV).
    pub fn detect(text: &str, origin: &str) -> FileFormat {
        let ext = std::path::Path::new(origin)
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match ext.as_deref() {
            Some("json") => FileFormat::Json,
            Some("csv") => FileFormat::Csv,
            _ if text.trim_start().starts_with('{') => FileFormat::Json,
            _ => FileFormat::Csv,
        }
    }
}

/// Reads a schedule file (our JSON or torch's compute-only CSV, see [`FileFormat::detect`]),
/// validates it and returns it lowered (with its communication ops), ready to simulate or run.
///
/// `origin` names the text in messages (a file name) and gives the extension. A UTF-8
/// byte-order mark is skipped.
///
/// * JSON: read by [`json::from_str_unvalidated`]; the placement follows from the kind. A
///   compute-only JSON (no `SEND`/`RECV`) is validated, then lowered.
/// * CSV: read by [`csv::from_str_unvalidated`] with the kind inferred from the stage numbering
///   (see [`csv::from_str`]), which fixes the placement; validated as written (compute ops),
///   then lowered.
///
/// Errors: [`ScheduleError::Parse`] for text that is not a schedule (the message starts with
/// `origin` and names the rank and op or cell); [`ScheduleError::Invalid`] with the validator's
/// message (rule, rank, op) for a schedule that breaks a rule, such as a missing op.
pub fn read_schedule(text: &str, origin: &str) -> Result<Schedule, ScheduleError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let with_origin = |e: ScheduleError| match e {
        ScheduleError::Parse(msg) => ScheduleError::Parse(format!("{origin}: {msg}")),
        other => other,
    };
    let schedule = match FileFormat::detect(text, origin) {
        FileFormat::Json => json::from_str_unvalidated(text).map_err(with_origin)?,
        FileFormat::Csv => csv::from_str_unvalidated(text, None).map_err(with_origin)?,
    };
    validate(&schedule)?;
    if schedule.is_lowered() {
        return Ok(schedule);
    }
    let lowered = lower(&schedule);
    validate(&lowered)?;
    Ok(lowered)
}

/// The largest schedule file [`read_schedule_file`] reads, in bytes: 64 MiB, the cap of every
/// file `dualpipe plan` reads. Parsing costs about 30 bytes of memory per byte of CSV, so the
/// cap keeps a read near 2 GB at worst; a CSV's rows (ranks) and actions are also capped
/// ([`csv::MAX_ROWS`], [`csv::MAX_ACTIONS`]) before its cells are parsed. (A schedule at the
/// size cap, [`crate::MAX_CHUNKS`] chunks, is larger than this as JSON: generate it instead.)
pub const MAX_SCHEDULE_FILE_BYTES: u64 = 64 << 20;

/// Reads the schedule file at `path` (`-`: standard input) and hands it to [`read_schedule`]:
/// validated and lowered. The file is read through [`dualpipe_io::open_regular`], the one way
/// inputs are opened: a FIFO, a device or a folder is refused before a byte is read (a FIFO
/// never blocks), and a file over [`MAX_SCHEDULE_FILE_BYTES`] or not UTF-8 is refused too, each
/// as a [`ScheduleError::Parse`] naming the file.
pub fn read_schedule_file(path: &std::path::Path) -> Result<Schedule, ScheduleError> {
    let origin = path.display().to_string();
    let limit = dualpipe_io::limits::Limit::new(
        MAX_SCHEDULE_FILE_BYTES,
        "the cap of a schedule file; generate a schedule that large from its kind instead",
    );
    let text = if path.as_os_str() == "-" {
        dualpipe_io::read_stdin_text(limit, "schedule file")
    } else {
        dualpipe_io::read_text(path, limit, "schedule file")
    }
    .map_err(|e| ScheduleError::Parse(e.to_string()))?;
    read_schedule(&text, &origin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build, ScheduleKind};

    #[test]
    fn every_kind_reads_back_from_json_and_csv() {
        for kind in ScheduleKind::ALL {
            let v = kind.default_virtual_stages();
            let s = build(kind, 4, 8, v).unwrap();
            let from_json = read_schedule(&json::to_string(&s), "s.json").unwrap();
            assert_eq!(from_json, s, "{kind} via JSON");
            let from_csv = read_schedule(&csv::to_string(&s), "s.csv").unwrap();
            assert_eq!(from_csv, s, "{kind} via CSV");
            // Without an extension, by content; with a byte-order mark.
            let bom = format!("\u{feff}{}", csv::to_string(&s));
            assert_eq!(read_schedule(&bom, "schedule").unwrap(), s, "{kind}");
            let compute_json = json::to_string(&s.compute_only());
            assert_eq!(read_schedule(&compute_json, "-").unwrap(), s, "{kind}");
        }
    }

    #[test]
    fn errors_name_the_file_or_the_rule() {
        let err = read_schedule("{\"schedule\":", "bad.json").unwrap_err();
        assert!(
            matches!(err, ScheduleError::Parse(ref m) if m.starts_with("bad.json: JSON schedule: not valid JSON")),
            "{err}"
        );
        // 1f1b on 2 ranks, 2 micro-batches, with rank 1's backward of micro-batch 1 removed.
        let err = read_schedule("0F0,0F1,0B0,0B1\n1F0,1B0,1F1\n", "cut.csv").unwrap_err();
        assert!(matches!(err, ScheduleError::Invalid(_)), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("rank 1") && msg.contains("backward"), "{msg}");
    }
}
