//! `dualpipe simulate`: metrics in both formats, pictures, notes, bad cost models.

use serde_json::Value;

use crate::{close, dualpipe, floats, s, Run, TempDir};

fn simulate(kind: &str, ranks: &str, micro_batches: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "simulate",
        "--schedule",
        kind,
        "--ranks",
        ranks,
        "--micro-batches",
        micro_batches,
    ];
    args.extend_from_slice(extra);
    dualpipe(args)
}

fn simulate_json(kind: &str, ranks: &str, micro_batches: &str, extra: &[&str]) -> Value {
    let mut flags = vec!["--format", "json"];
    flags.extend_from_slice(extra);
    let run = simulate(kind, ranks, micro_batches, &flags);
    run.ok();
    run.json()
}

#[test]
fn json_has_the_documented_metrics_and_they_add_up() {
    for (kind, ranks, mbs, copies) in [
        ("gpipe", 4, 8, 1),
        ("1f1b", 4, 8, 1),
        ("interleaved", 2, 4, 2),
        ("zb1p", 4, 8, 1),
        ("dualpipe", 4, 8, 2),
        ("dualpipev", 3, 7, 2),
    ] {
        let doc = simulate_json(kind, &ranks.to_string(), &mbs.to_string(), &["--fb", "2.5"]);
        assert_eq!(doc["schedule"], kind);
        assert_eq!(doc["ranks"], ranks);
        assert_eq!(doc["micro_batches"], mbs);
        let makespan = doc["makespan"].as_f64().expect("makespan is a number");
        let bubble = floats(&doc["bubble_per_rank"]);
        let busy = floats(&doc["busy_per_rank"]);
        let peak = floats(&doc["peak_activations_per_rank"]);
        let params = floats(&doc["parameter_copies_per_rank"]);
        let ratio = doc["bubble_ratio"]
            .as_f64()
            .expect("bubble_ratio is a number");
        for (name, v) in [("bubble", &bubble), ("busy", &busy), ("peak", &peak)] {
            assert_eq!(v.len(), ranks, "{kind}: {name} per rank");
        }
        assert_eq!(
            params,
            vec![copies as f64; ranks],
            "{kind}: parameter copies"
        );
        assert!(makespan > 0.0, "{kind}: makespan {makespan}");
        for r in 0..ranks {
            assert!(
                close(busy[r] + bubble[r], makespan, 1e-9),
                "{kind} rank {r}: busy {} + bubble {} != makespan {makespan}",
                busy[r],
                bubble[r]
            );
            assert!(
                peak[r] >= 1.0,
                "{kind} rank {r}: peak activations {}",
                peak[r]
            );
        }
        // DESIGN.md: bubble ratio = total idle / (ranks x makespan).
        let expected = bubble.iter().sum::<f64>() / (ranks as f64 * makespan);
        assert!(
            close(ratio, expected, 1e-9),
            "{kind}: bubble_ratio {ratio}, idle/(ranks*makespan) = {expected}"
        );
        assert!((0.0..1.0).contains(&ratio), "{kind}: bubble ratio {ratio}");
        // The cost model echoes the flags.
        assert_eq!(doc["cost"]["compute"]["fb"].as_f64(), Some(2.5), "{kind}");
    }
}

#[test]
fn busy_time_is_the_work_given() {
    // 1f1b on 2 ranks, 4 micro-batches, F 1, B 3: each rank runs 4 F and 4 B.
    let doc = simulate_json("1f1b", "2", "4", &["--f", "1", "--b", "3", "--w", "1"]);
    assert_eq!(floats(&doc["busy_per_rank"]), vec![16.0, 16.0]);
    // With no communication cost, 1f1b's makespan is (mbs + ranks - 1) (F + B).
    assert_eq!(doc["makespan"].as_f64(), Some(20.0));
}

#[test]
fn latency_and_a_cheaper_overlap_move_the_makespan_the_right_way() {
    let base = simulate_json("dualpipe", "4", "8", &["--fb", "3"])["makespan"]
        .as_f64()
        .unwrap();
    let slow = simulate_json("dualpipe", "4", "8", &["--fb", "3", "--latency", "0.5"])["makespan"]
        .as_f64()
        .unwrap();
    let overlapped = simulate_json("dualpipe", "4", "8", &["--fb", "2"])["makespan"]
        .as_f64()
        .unwrap();
    assert!(slow > base, "latency 0.5: {slow} vs {base}");
    assert!(overlapped < base, "--fb 2: {overlapped} vs --fb 3: {base}");
}

#[test]
fn table_shows_metrics_and_a_plain_timeline() {
    let run = simulate("dualpipe", "4", "8", &["--fb", "2.5"]);
    run.ok();
    let text = &run.stdout;
    for needle in ["makespan", "bubble ratio", "r0 |", "r3 |"] {
        assert!(text.contains(needle), "missing `{needle}`:\n{text}");
    }
    assert!(!text.contains('\x1b'), "colour codes on a pipe:\n{text}");
    assert!(run.stderr.is_empty(), "stderr: {}", run.stderr);
    let plain = simulate("1f1b", "2", "4", &["--no-color"]);
    plain.ok();
    assert!(!plain.stdout.contains('\x1b'));
}

#[test]
fn overlapped_schedules_without_fb_get_a_note_on_stderr() {
    let run = simulate("dualpipe", "4", "8", &["--format", "json"]);
    run.ok();
    assert!(run.stderr.contains("--fb"), "stderr: {}", run.stderr);
    run.json(); // the note stays off stdout
    let quiet = simulate("1f1b", "4", "8", &["--format", "json"]);
    quiet.ok();
    assert!(
        quiet.stderr.is_empty(),
        "1f1b has no F&B pairs: {}",
        quiet.stderr
    );
}

#[test]
fn svg_and_trace_files_are_written() {
    let dir = TempDir::new("sim-pictures");
    let (svg, trace) = (dir.join("t.svg"), dir.join("t.trace.json"));
    simulate(
        "dualpipe",
        "4",
        "8",
        &["--fb", "2.5", "--svg", s(&svg), "--trace", s(&trace)],
    )
    .ok();
    let picture = std::fs::read_to_string(&svg).expect("the svg file exists");
    assert!(picture.contains("<svg") && picture.trim_end().ends_with("</svg>"));
    let events: Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).expect("the trace is JSON");
    let events = events["traceEvents"]
        .as_array()
        .expect("a Chrome trace object with `traceEvents`");
    // One complete ("X") event per compute op on the compute threads (tid 0).
    let compute_events = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == 0)
        .count();
    let schedule = dualpipe([
        "schedule",
        "--schedule",
        "dualpipe",
        "--ranks",
        "4",
        "--micro-batches",
        "8",
        "--format",
        "json",
    ]);
    schedule.ok();
    let compute_ops = schedule.json()["programs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p.as_array().unwrap())
        .filter(|op| ["F", "B", "I", "W", "FB"].contains(&op["op"].as_str().unwrap()))
        .count();
    assert_eq!(
        compute_events, compute_ops,
        "trace events vs the schedule's compute ops"
    );
    assert_eq!(
        dir.entries(),
        vec!["t.svg", "t.trace.json"],
        "no temp files left"
    );
}

#[test]
fn same_flags_give_the_same_bytes() {
    let a = simulate("dualpipev", "4", "10", &["--format", "json", "--fb", "2"]);
    let b = simulate("dualpipev", "4", "10", &["--format", "json", "--fb", "2"]);
    assert_eq!(a.ok().stdout, b.ok().stdout);
}

#[test]
fn bad_input_is_a_one_line_usage_error() {
    // (schedule, ranks, micro-batches, extra flags, what the message must name)
    type Case = (
        &'static str,
        &'static str,
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    );
    let cases: [Case; 12] = [
        ("dualpipe", "3", "8", &[], &["even", "ranks", "3"]),
        ("1f1b", "4", "0", &[], &["micro-batch", "0"]),
        ("zigzag", "4", "8", &[], &["zigzag", "--schedule"]),
        ("1f1b", "4", "8", &["--f", "-1"], &["-1", "--f"]),
        ("1f1b", "4", "8", &["--b", "-2"], &["-2", "--b"]),
        ("1f1b", "4", "8", &["--w", "-0.5"], &["-0.5", "--w"]),
        ("1f1b", "4", "8", &["--fb", "-1"], &["-1", "--fb"]),
        ("1f1b", "4", "8", &["--latency", "-1"], &["latency", "-1"]),
        ("1f1b", "4", "8", &["--bandwidth", "0"], &["bandwidth", "0"]),
        ("1f1b", "4", "8", &["--w", "3"], &["W", "B"]),
        ("1f1b", "4", "8", &["--f", "nan"], &["NaN"]),
        (
            "1f1b",
            "4",
            "8",
            &["--virtual-stages", "3"],
            &["--virtual-stages"],
        ),
    ];
    for (kind, ranks, mbs, extra, needles) in cases {
        simulate(kind, ranks, mbs, extra).usage_error(needles);
    }
}

/// Every generated kind, written by `schedule --format json` and `--format csv`, simulates
/// through `--schedule-file` to the same report as `--schedule KIND`.
#[test]
fn schedule_files_of_every_kind_simulate_like_the_generated_schedule() {
    let dir = TempDir::new("schedule-file");
    for (kind, ranks, mbs) in [
        ("gpipe", "4", "8"),
        ("1f1b", "4", "8"),
        ("interleaved", "2", "8"),
        ("zb1p", "4", "8"),
        ("dualpipe", "4", "8"),
        ("dualpipev", "3", "7"),
    ] {
        let expected = simulate_json(kind, ranks, mbs, &["--fb", "2.5"]);
        for format in ["json", "csv"] {
            let file = dir.join(&format!("{kind}.{format}"));
            dualpipe([
                "schedule",
                "--schedule",
                kind,
                "--ranks",
                ranks,
                "--micro-batches",
                mbs,
                "--format",
                format,
                "--output",
                s(&file),
            ])
            .ok();
            let run = dualpipe([
                "simulate",
                "--schedule-file",
                s(&file),
                "--fb",
                "2.5",
                "--format",
                "json",
            ]);
            run.ok();
            assert_eq!(run.json(), expected, "{kind} through {format}");
            // Without an extension: chosen by content.
            let bare = dir.join(&format!("{kind}-{format}"));
            std::fs::copy(&file, &bare).unwrap();
            let run = dualpipe([
                "simulate",
                "--schedule-file",
                s(&bare),
                "--fb",
                "2.5",
                "--format",
                "json",
            ]);
            run.ok();
            assert_eq!(
                run.json(),
                expected,
                "{kind} through {format}, no extension"
            );
        }
    }
}

#[test]
fn bad_schedule_files_are_one_line_usage_errors() {
    let dir = TempDir::new("schedule-file-bad");
    let bad_json = dir.write("bad.json", "{\"schedule\": \"1f1b\", \"ranks\": 2,");
    dualpipe(["simulate", "--schedule-file", s(&bad_json)])
        .usage_error(&["bad.json", "not valid JSON"]);
    // 1f1b on 2 ranks and 2 micro-batches, rank 1's last backward removed: the validator says
    // which rank misses which op.
    let cut = dir.write("cut.csv", "0F0,0F1,0B0,0B1\n1F0,1B0,1F1\n");
    dualpipe(["simulate", "--schedule-file", s(&cut)])
        .usage_error(&["cut.csv", "rank 1", "backward"]);
    let cell = dir.write("cell.csv", "0F0,0X1\n");
    dualpipe(["simulate", "--schedule-file", s(&cell)]).usage_error(&[
        "cell.csv",
        "rank 0, cell 1",
        "unknown action",
    ]);
    dualpipe(["simulate", "--schedule-file", s(&dir.join("missing.json"))])
        .usage_error(&["missing.json", "--schedule-file"]);
    let binary = dir.write("binary.csv", [0xffu8, 0xfe, 0x00]);
    dualpipe(["simulate", "--schedule-file", s(&binary)]).usage_error(&["binary.csv", "UTF-8"]);
    // The file replaces --schedule / --ranks / --micro-batches; giving both is a flag error.
    dualpipe(["simulate", "--schedule-file", s(&cut), "--schedule", "1f1b"])
        .flag_error(&["--schedule"]);
    dualpipe(["simulate", "--ranks", "4", "--micro-batches", "8"]).flag_error(&["--schedule"]);
}

#[test]
fn costs_whose_sums_overflow_are_a_usage_error_not_an_infinite_makespan() {
    simulate(
        "dualpipe",
        "4",
        "8",
        &[
            "--f", "1e308", "--b", "1e308", "--w", "1e308", "--fb", "1e308",
        ],
    )
    .usage_error(&["overflow", "--f"]);
    // Large costs whose sums fit still simulate.
    let doc = simulate_json(
        "dualpipe",
        "4",
        "8",
        &[
            "--f", "1e300", "--b", "2e300", "--w", "1e300", "--fb", "3e300",
        ],
    );
    assert!(doc["makespan"].as_f64().unwrap() > 1e300);
}

#[test]
fn negative_counts_reach_the_range_checks() {
    for (flag, value) in [
        ("--ranks", "-4"),
        ("--micro-batches", "-1"),
        ("--virtual-stages", "-2"),
        ("--message-bytes", "-5"),
    ] {
        let mut args = vec![
            "simulate",
            "--schedule",
            "interleaved",
            "--ranks",
            "4",
            "--micro-batches",
            "8",
        ];
        match args.iter().position(|a| a == &flag) {
            Some(at) => args[at + 1] = value,
            None => args.extend([flag, value]),
        }
        let run = dualpipe(&args);
        run.flag_error(&[flag, "cannot be negative", value]);
        assert!(
            !run.stderr.contains("unexpected argument"),
            "{}",
            run.stderr
        );
    }
}
