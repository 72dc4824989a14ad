//! `dualpipe train --log / --metrics-addr` and `dualpipe report`: a tiny run's log read back
//! into a summary and an SVG; bad logs and addresses as one-line usage errors.

use crate::{dualpipe, Run, TempDir};

fn tiny_train(extra: &[&str]) -> Run {
    let mut args = vec![
        "train",
        "--model",
        "mlp",
        "--steps",
        "4",
        "--hidden",
        "16",
        "--micro-batch-size",
        "4",
        "--layers-per-stage",
        "1",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    dualpipe(args)
}

#[test]
fn train_logs_every_step_and_report_reads_it_back() {
    let dir = TempDir::new("report");
    let log = dir.join("run.jsonl");
    let log_s = log.to_str().unwrap();
    let run = tiny_train(&["--log", log_s, "--metrics-addr", "127.0.0.1:0"]);
    run.ok();
    let url = run
        .stderr_lines()
        .iter()
        .find_map(|l| l.strip_prefix("metrics: "))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no metrics address on stderr:\n{}", run.stderr));
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/metrics"),
        "{url}"
    );
    assert!(
        !url.ends_with(":0/metrics"),
        "the chosen port is printed: {url}"
    );

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["step"], i + 1);
        assert_eq!(line["tokens_total"], 16 * (i + 1));
        let bubble = line["bubble_ratio"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&bubble), "{bubble}");
        assert_eq!(line["communication_overhead_ratio"], 0.0);
        assert_eq!(line["bytes_sent"]["data_parallel"], 0);
        assert_eq!(line["ranks"].as_array().unwrap().len(), 2);
    }

    let svg = dir.join("run.svg");
    let report = dualpipe(["report", log_s, "--svg", svg.to_str().unwrap()]);
    report.ok();
    assert!(
        report
            .stdout
            .starts_with(&format!("dualpipe report: {log_s}, 4 steps in ")),
        "{}",
        report.stdout
    );
    for needle in [
        "loss ",
        "throughput",
        "bubble ratio",
        "core contention",
        "bytes sent",
    ] {
        assert!(
            report.stdout.contains(needle),
            "{needle}: {}",
            report.stdout
        );
    }
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.contains(">training loss</text>"));

    let json = dualpipe(["report", log_s, "--format", "json"]);
    json.ok();
    assert_eq!(json.json()["steps"], 4);
    assert_eq!(json.json()["tokens_total"], 64);
}

#[test]
fn a_data_parallel_run_logs_its_exchange_per_step() {
    let dir = TempDir::new("report-dp");
    let log = dir.join("run.jsonl");
    let log_s = log.to_str().unwrap();
    let run = tiny_train(&[
        "--log",
        log_s,
        "--data-parallel",
        "2",
        "--gradient-compression",
        "int8",
        "--format",
        "json",
    ]);
    run.ok();
    let summary = run.json();
    let text = std::fs::read_to_string(&log).unwrap();
    let mut logged = 0;
    for line in text.lines() {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        let overhead = line["communication_overhead_ratio"].as_f64().unwrap();
        assert!(overhead > 0.0 && overhead < 1.0, "{overhead}");
        let sent = line["bytes_sent"]["data_parallel"].as_u64().unwrap();
        assert!(sent > 0, "{line}");
        logged += sent;
    }
    // The log holds replica 0's exchange; the summary sums both replicas' (equal in size).
    assert_eq!(2 * logged, summary["grad_bytes_sent"].as_u64().unwrap());
    let report = dualpipe(["report", log_s]);
    report.ok();
    assert!(
        report
            .stdout
            .contains("of the step in the gradient exchange"),
        "{}",
        report.stdout
    );
}

#[test]
fn bad_logs_and_addresses_are_usage_errors() {
    let dir = TempDir::new("report-bad");
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"step\": 1}\n").unwrap();
    dualpipe(["report", bad.to_str().unwrap()]).usage_error(&["line 1", "not a step record"]);
    let missing = dir.join("missing.jsonl");
    dualpipe(["report", missing.to_str().unwrap()]).usage_error(&["missing.jsonl"]);
    tiny_train(&["--metrics-addr", "nonsense"]).usage_error(&["--metrics-addr", "HOST:PORT"]);
    tiny_train(&["--metrics-addr", "127.0.0.1:0 "])
        .usage_error(&["--metrics-addr \"127.0.0.1:0 \"", "trailing space"]);
    let huge = tiny_train(&["--recv-timeout", "1e300"]);
    huge.usage_error(&["--recv-timeout 1e300: ", "less than 1e9 seconds"]);
    assert!(!huge.stderr.contains("0000000000"), "{}", huge.stderr);
    let no_dir = dir.join("no/such/dir/run.jsonl");
    tiny_train(&["--log", no_dir.to_str().unwrap()]).usage_error(&["run.jsonl"]);
}
