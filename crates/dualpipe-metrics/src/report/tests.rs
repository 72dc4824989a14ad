use super::*;
use crate::record::{BytesSent, RankRecord};

fn record(step: usize, loss: f64, validation: Option<f64>) -> StepRecord {
    StepRecord {
        step,
        elapsed_seconds: step as f64 * 0.01,
        step_seconds: 0.01,
        pipeline_seconds: 0.008,
        loss,
        validation_loss: validation,
        tokens: 100,
        tokens_total: 100 * step as u64,
        tokens_per_second: 10_000.0,
        bubble_ratio: 0.1 * step as f64,
        bubble_ratio_simulated: Some(0.05),
        core_wait_ratio: 0.2,
        communication_overhead_ratio: 0.01 * step as f64,
        rank_threads: 4,
        cores: 2,
        ranks: vec![RankRecord::default()],
        bytes_sent: BytesSent {
            activation: 1500,
            gradient: 1500,
            expert: 0,
            data_parallel: 200,
        },
    }
}

fn write_log(records: &[StepRecord]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    for r in records {
        use std::io::Write;
        writeln!(file, "{}", serde_json::to_string(r).unwrap()).unwrap();
    }
    file
}

#[test]
fn a_log_reads_back_and_sums_up() {
    let records = vec![
        record(1, 2.0, None),
        record(2, 1.0, Some(1.5)),
        record(3, 1.25, None),
    ];
    let file = write_log(&records);
    let read = read_log(file.path()).unwrap();
    assert_eq!(read, records);
    let report = RunReport::new(read);
    assert_eq!(report.steps, 3);
    assert_eq!(report.best_loss, (1.0, 2));
    assert_eq!(report.final_validation_loss, Some((1.5, 2)));
    assert_eq!(report.tokens_total, 300);
    assert!((report.total_seconds - 0.03).abs() < 1e-12);
    assert!((report.bubble_ratio_median - 0.2).abs() < 1e-12);
    assert_eq!(report.bytes_sent, [4500, 4500, 0, 600]);
    assert!((report.communication_overhead_ratio_median - 0.02).abs() < 1e-12);
    let text = report.text("run.jsonl");
    assert!(
        text.starts_with("dualpipe report: run.jsonl, 3 steps in 0.03 s\n"),
        "{text}"
    );
    assert!(
        text.contains("2.000000 -> 1.250000 (best 1.000000 at step 2)"),
        "{text}"
    );
    assert!(text.contains("1.500000 at step 2"), "{text}");
    assert!(text.contains("activation 4.5 kB"), "{text}");
    assert!(text.contains("(4 rank threads on 2 cores)"), "{text}");
}

#[test]
fn the_svg_has_every_panel_and_line() {
    let records: Vec<_> = (1..=50)
        .map(|s| record(s, 1.0 / s as f64, (s % 10 == 0).then_some(0.5)))
        .collect();
    let svg = RunReport::new(records).svg("a <run>");
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("a &lt;run&gt;"));
    for label in [
        "training loss",
        "validation loss",
        "tokens/s",
        "bubble (measured)",
        "bubble (simulated)",
        "core contention",
    ] {
        assert!(
            svg.contains(&format!(">{label}</text>")),
            "no legend {label}"
        );
    }
    // One polyline per series with data: loss, validation, throughput and the three ratios.
    assert_eq!(svg.matches("<polyline").count(), 6);
    let loss_line = svg.lines().find(|l| l.contains("<polyline")).unwrap();
    assert_eq!(loss_line.matches(',').count(), 50);
}

#[test]
fn a_run_without_validation_says_so_in_the_legend() {
    let svg = RunReport::new(vec![record(1, 1.0, None)]).svg("x");
    assert!(svg.contains(">validation loss (none)</text>"));
}

#[test]
fn bad_logs_name_the_line() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    use std::io::Write;
    writeln!(
        file,
        "{}",
        serde_json::to_string(&record(1, 1.0, None)).unwrap()
    )
    .unwrap();
    writeln!(file, "{{\"step\": 2}}").unwrap();
    let err = read_log(file.path()).unwrap_err().to_string();
    assert!(err.contains("line 2: not a step record"), "{err}");
    let empty = tempfile::NamedTempFile::new().unwrap();
    let err = read_log(empty.path()).unwrap_err().to_string();
    assert!(err.contains("holds no step record"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    assert!(read_log(dir.path())
        .unwrap_err()
        .to_string()
        .contains("a folder, not a regular file"));
    assert!(read_log(&dir.path().join("missing")).is_err());
}

#[test]
fn long_runs_are_thinned() {
    let records: Vec<_> = (1..=5000).map(|s| record(s, 1.0, None)).collect();
    let svg = RunReport::new(records).svg("x");
    let loss_line = svg.lines().find(|l| l.contains("<polyline")).unwrap();
    assert!(loss_line.matches(',').count() <= 1201);
}

#[test]
fn a_log_written_before_the_data_parallel_bytes_still_reads() {
    let mut line = serde_json::to_value(record(1, 2.0, None)).unwrap();
    line["bytes_sent"]
        .as_object_mut()
        .unwrap()
        .remove("data_parallel");
    let mut file = tempfile::NamedTempFile::new().unwrap();
    {
        use std::io::Write;
        writeln!(file, "{line}").unwrap();
    }
    let read = read_log(file.path()).unwrap();
    assert_eq!(read[0].bytes_sent.data_parallel, 0);
    assert_eq!(read[0].bytes_sent.activation, 1500);
}

#[test]
fn a_torn_last_line_is_skipped_with_a_warning_and_a_bom_is_skipped() {
    let records: Vec<_> = (1..=3).map(|s| record(s, 1.0, None)).collect();
    let mut file = write_log(&records);
    use std::io::Write;
    file.write_all(b"{\"step\":4,\"elapsed_sec").unwrap();
    let read = read_log_checked(file.path()).unwrap();
    assert_eq!(read.records, records);
    assert_eq!(read.warnings.len(), 1);
    assert!(read.warnings[0].contains("line 4"), "{:?}", read.warnings);
    // The same torn text followed by a newline is a bad line, not a torn one.
    file.write_all(b"\n").unwrap();
    let err = read_log(file.path()).unwrap_err().to_string();
    assert!(err.contains("line 4: not a step record"), "{err}");
    let mut bom = tempfile::NamedTempFile::new().unwrap();
    bom.write_all("\u{feff}".as_bytes()).unwrap();
    writeln!(bom, "{}", serde_json::to_string(&records[0]).unwrap()).unwrap();
    assert_eq!(read_log(bom.path()).unwrap(), records[..1]);
}

#[test]
fn steps_that_do_not_increase_are_two_runs() {
    let mut twice: Vec<_> = (1..=3).map(|s| record(s, 1.0, None)).collect();
    twice.extend((1..=3).map(|s| record(s, 1.0, None)));
    let err = read_log(write_log(&twice).path()).unwrap_err().to_string();
    assert!(
        err.contains("line 4: step 1 follows step 3 (line 3)"),
        "{err}"
    );
    let backwards: Vec<_> = (1..=3).rev().map(|s| record(s, 1.0, None)).collect();
    assert!(read_log(write_log(&backwards).path()).is_err());
    // A gap (a log dropped for a while, then resumed) is one run.
    let gap: Vec<_> = [1, 2, 7, 8].iter().map(|&s| record(s, 1.0, None)).collect();
    assert_eq!(read_log(write_log(&gap).path()).unwrap().len(), 4);
}

#[test]
fn a_fifo_and_a_device_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let err = read_log(&fifo).unwrap_err().to_string();
    assert!(err.contains("a FIFO, not a regular file"), "{err}");
    let err = read_log(std::path::Path::new("/dev/zero"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("device"), "{err}");
}
