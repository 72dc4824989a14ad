//! `dualpipe train`: tiny runs (a few milliseconds each), the summary in both formats, the
//! trace and picture files, determinism, bad flags.

use serde_json::Value;

use crate::{dualpipe, floats, s, Run, TempDir};

/// A tiny MLP: 2 steps, width 16, 4 rows per micro-batch, one block per stage; each pair
/// gives way to the same flag in a test's own flags (the GPT's tests are in `train_gpt.rs`).
const TINY: [(&str, &str); 5] = [
    ("--model", "mlp"),
    ("--steps", "2"),
    ("--hidden", "16"),
    ("--micro-batch-size", "4"),
    ("--layers-per-stage", "1"),
];

fn train(extra: &[&str]) -> Run {
    let mut args = vec!["train"];
    for (flag, value) in TINY {
        if !extra.contains(&flag) {
            args.extend_from_slice(&[flag, value]);
        }
    }
    args.extend_from_slice(extra);
    dualpipe(args)
}

fn train_json(extra: &[&str]) -> Value {
    let mut flags = vec!["--format", "json", "--quiet"];
    flags.extend_from_slice(extra);
    let run = train(&flags);
    run.ok();
    run.json()
}

#[test]
fn json_summary_has_the_documented_keys() {
    let doc = train_json(&["--ranks", "2", "--micro-batches", "4", "--steps", "3"]);
    let losses = floats(&doc["losses"]);
    assert_eq!(losses.len(), 3, "one loss per step");
    assert_eq!(doc["steps"], 3);
    assert!(
        losses.iter().all(|l| l.is_finite() && *l >= 0.0),
        "{losses:?}"
    );
    assert_eq!(doc["final_loss"].as_f64(), losses.last().copied());
    for key in [
        "samples_per_second",
        "step_seconds_median",
        "bubble_ratio",
        "comm_wait_seconds",
    ] {
        let v = doc[key]
            .as_f64()
            .unwrap_or_else(|| panic!("`{key}` is not a number: {doc}"));
        assert!(v.is_finite() && v >= 0.0, "{key} = {v}");
    }
    assert!(doc["samples_per_second"].as_f64().unwrap() > 0.0);
    assert!(doc["bubble_ratio"].as_f64().unwrap() < 1.0);
    assert_eq!(doc["schedule"], "dualpipe", "the default schedule");
    assert_eq!(
        (doc["ranks"].as_u64(), doc["micro_batches"].as_u64()),
        (Some(2), Some(4))
    );
}

#[test]
fn table_summary_shows_losses_unless_quiet() {
    let run = train(&["--ranks", "2", "--micro-batches", "4"]);
    run.ok();
    assert!(run.stdout.contains("final loss"), "{}", run.stdout);
    assert!(run.stdout.contains("step  loss"), "{}", run.stdout);
    assert!(
        run.stderr.is_empty(),
        "no progress bar off a terminal: {:?}",
        run.stderr
    );
    let quiet = train(&["--ranks", "2", "--micro-batches", "4", "--quiet"]);
    quiet.ok();
    assert!(quiet.stdout.contains("final loss"), "{}", quiet.stdout);
    assert!(!quiet.stdout.contains("step  loss"), "{}", quiet.stdout);
}

#[test]
fn every_schedule_trains() {
    for (kind, ranks, mbs) in [
        ("gpipe", "2", "4"),
        ("1f1b", "2", "4"),
        ("interleaved", "2", "4"),
        ("zb1p", "2", "4"),
        ("dualpipe", "2", "4"),
        ("dualpipev", "2", "4"),
    ] {
        let doc = train_json(&["--schedule", kind, "--ranks", ranks, "--micro-batches", mbs]);
        assert_eq!(doc["schedule"], kind);
        assert_eq!(floats(&doc["losses"]).len(), 2, "{kind}");
    }
}

#[test]
fn schedules_that_split_the_same_model_learn_the_same_thing() {
    // Same seed, same model stages, same data: a schedule only reorders the work, so the
    // losses agree (up to the order floating-point sums happen in).
    let losses = |kind: &str| {
        let doc = train_json(&[
            "--schedule",
            kind,
            "--ranks",
            "2",
            "--micro-batches",
            "4",
            "--steps",
            "3",
            "--dtype",
            "f64",
            "--seed",
            "5",
        ]);
        (
            doc["model_stages"].as_u64().unwrap(),
            floats(&doc["losses"]),
        )
    };
    let groups: [&[&str]; 2] = [
        &["gpipe", "1f1b", "zb1p", "dualpipe"],
        &["interleaved", "dualpipev"],
    ];
    for group in groups {
        let (stages, reference) = losses(group[0]);
        for kind in &group[1..] {
            let (s, l) = losses(kind);
            assert_eq!(s, stages, "{kind} vs {}: model stages", group[0]);
            for (step, (a, b)) in l.iter().zip(&reference).enumerate() {
                assert!(
                    crate::close(*a, *b, 1e-9),
                    "step {step}: {kind} loss {a}, {} loss {b}",
                    group[0]
                );
            }
        }
    }
}

#[test]
fn same_seed_same_losses_other_seed_other_losses() {
    let flags = [
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--steps",
        "3",
        "--seed",
        "11",
    ];
    let a = train_json(&flags);
    let b = train_json(&flags);
    assert_eq!(
        a["losses"], b["losses"],
        "same seed, same losses (bit for bit)"
    );
    let mut other = flags;
    other[7] = "12";
    let c = train_json(&other);
    assert_ne!(
        a["losses"], c["losses"],
        "seed 12 should train on other data"
    );
    assert_eq!(c["seed"], 12);
}

#[test]
fn trace_and_svg_files_are_written() {
    let dir = TempDir::new("train-files");
    let (trace, svg) = (dir.join("step.trace.json"), dir.join("step.svg"));
    train(&[
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--quiet",
        "--trace",
        s(&trace),
        "--svg",
        s(&svg),
    ])
    .ok();
    let events: Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).expect("the trace is JSON");
    assert!(
        events.is_array() || events["traceEvents"].is_array(),
        "{events}"
    );
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.contains("<svg") && picture.trim_end().ends_with("</svg>"));
    assert_eq!(dir.entries(), vec!["step.svg", "step.trace.json"]);
}

#[test]
fn bad_flags_are_one_line_usage_errors() {
    let cases: [(&[&str], &[&str]); 15] = [
        (&["--data-parallel", "0"], &["--data-parallel", "0"]),
        (&["--bucket-mb", "0"], &["--bucket-mb", "0"]),
        (
            &["--gradient-compression", "2bit"],
            &["2bit", "--gradient-compression"],
        ),
        (
            &["--ranks", "64", "--data-parallel", "8"],
            &["--ranks", "--data-parallel", "512"],
        ),
        (&["--ranks", "3"], &["even", "ranks", "3"]),
        (&["--ranks", "0"], &["--ranks", "0"]),
        (&["--micro-batches", "0"], &["--micro-batches", "0"]),
        (
            &["--micro-batches", "3", "--ranks", "2"],
            &["micro-batches", "3"],
        ),
        (&["--micro-batch-size", "0"], &["--micro-batch-size"]),
        (&["--schedule", "zigzag"], &["zigzag", "--schedule"]),
        (&["--optimizer", "lion"], &["lion", "--optimizer"]),
        (&["--dtype", "f8"], &["f8", "--dtype"]),
        (&["--lr", "-1"], &["--lr", "-1"]),
        (&["--lr", "0"], &["--lr"]),
        (
            &["--schedule", "gpipe", "--virtual-stages", "2"],
            &["--virtual-stages"],
        ),
    ];
    for (flags, needles) in cases {
        train(flags).usage_error(needles);
    }
    train(&["--steps", "0"]).usage_error(&["--steps", "0"]);
    train(&["--bogus"]).flag_error(&["--bogus"]);
    dualpipe(["train", "--hidden", "wide"]).flag_error(&["--hidden", "wide"]);
    dualpipe(["train", "--seed", "-3"]).flag_error(&["-3"]);
}

#[test]
fn absurd_sizes_are_usage_errors_not_panics() {
    // u64::MAX rows or width cannot be allocated; the user should hear which flag is too big
    // (exit 2, one line), not see an arithmetic-overflow panic.
    let max = u64::MAX.to_string();
    for flag in ["--hidden", "--micro-batch-size"] {
        train(&[
            "--ranks",
            "2",
            "--micro-batches",
            "2",
            "--quiet",
            flag,
            &max,
        ])
        .usage_error(&[flag]);
    }
    // A hundred million blocks per stage: refused up front (it would allocate for minutes).
    train(&[
        "--ranks",
        "2",
        "--micro-batches",
        "2",
        "--layers-per-stage",
        "100000000",
    ])
    .usage_error(&["--layers-per-stage"]);
}

#[test]
fn training_learns_with_either_optimizer_and_precision_barely_matters() {
    let run = |optimizer: &str, dtype: &str| {
        floats(
            &train_json(&[
                "--ranks",
                "2",
                "--micro-batches",
                "4",
                "--steps",
                "30",
                "--lr",
                "0.01",
                "--optimizer",
                optimizer,
                "--dtype",
                dtype,
            ])["losses"],
        )
    };
    for optimizer in ["adamw", "sgd"] {
        let (f32s, f64s) = (run(optimizer, "f32"), run(optimizer, "f64"));
        let (first, last) = (f64s[0], f64s[29]);
        assert!(
            last < 0.75 * first,
            "{optimizer}: the loss should fall over 30 steps: {first} -> {last}"
        );
        for (step, (a, b)) in f32s.iter().zip(&f64s).enumerate() {
            assert!(
                crate::close(*a, *b, 1e-4),
                "{optimizer} step {step}: f32 loss {a}, f64 loss {b}"
            );
        }
    }
}

#[test]
fn the_local_transport_is_the_default() {
    let flags = [
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--steps",
        "3",
        "--seed",
        "3",
    ];
    let default = train_json(&flags);
    let mut local = flags.to_vec();
    local.extend_from_slice(&["--transport", "local", "--recv-timeout", "30"]);
    assert_eq!(train_json(&local)["losses"], default["losses"]);
}

#[test]
fn transport_flags_are_checked() {
    // Without MPI compiled in, or without an MPI launcher around the process, `--transport
    // mpi` cannot start: one line that says so either way.
    train(&["--ranks", "2", "--micro-batches", "4", "--transport", "mpi"]).usage_error(&["mpi"]);
    train(&["--transport", "carrier-pigeon"]).flag_error(&["carrier-pigeon", "--transport"]);
    train(&["--recv-timeout", "0"]).usage_error(&["--recv-timeout"]);
    train(&["--recv-timeout", "soon"]).flag_error(&["--recv-timeout", "soon"]);
}

#[test]
fn a_diverging_run_fails_naming_the_step_and_the_learning_rate() {
    // A learning rate of 1e300 turns the loss into NaN within a couple of steps: the run must
    // fail (exit 1) and say so, not report a NaN loss with exit 0.
    let run = train(&["--lr", "1e300", "--steps", "5", "--quiet"]);
    run.no_panic();
    assert_eq!(run.code, Some(1), "stderr:\n{}", run.stderr);
    assert!(run.stderr.contains("diverged at step"), "{}", run.stderr);
    assert!(run.stderr.contains("--lr"), "{}", run.stderr);
}

#[test]
fn absurd_step_counts_are_usage_errors_without_reserving_memory() {
    // 10^12 and 10^17 steps used to reserve memory for every step up front (an abort and a
    // capacity-overflow panic); now they are refused against the documented cap.
    for steps in ["1000000000000", "100000000000000000"] {
        train(&["--steps", steps, "--quiet"]).usage_error(&["--steps", steps]);
    }
    // Not an integer: a clear parse error naming the flag and the value.
    train(&["--steps", "1e17"]).flag_error(&["--steps", "1e17", "whole number"]);
    train(&["--steps", "2.5"]).flag_error(&["--steps", "2.5"]);
}

#[test]
fn memory_beyond_the_cap_is_refused_naming_the_flag() {
    // 550 GB of parameters and 3.7 TB of activations: over the documented 256 GiB cap on any
    // machine (and over a small machine's available memory long before).
    train(&[
        "--ranks",
        "2",
        "--micro-batches",
        "2",
        "--hidden",
        "8192",
        "--layers-per-stage",
        "16",
    ])
    .usage_error(&["--hidden 8192", "GiB"]);
    train(&["--micro-batch-size", "100000000", "--quiet"])
        .usage_error(&["--micro-batch-size 100000000", "GiB"]);
}

#[test]
fn size_errors_blame_the_flag_that_is_too_big() {
    train(&[
        "--micro-batch-size",
        "1",
        "--micro-batches",
        "1000000000000",
    ])
    .usage_error(&["fewer --micro-batches"]);
    train(&["--ranks", "1000000000000"]).usage_error(&["--ranks 1000000000000"]);
}

#[test]
fn too_many_local_ranks_point_to_the_mpi_transport() {
    train(&[
        "--schedule",
        "gpipe",
        "--ranks",
        "4096",
        "--micro-batches",
        "2",
        "--quiet",
    ])
    .usage_error(&["--ranks 4096", "--transport mpi"]);
}

#[test]
fn output_paths_are_checked_before_training() {
    let dir = TempDir::new("train-output-check");
    let missing = dir.join("nodir").join("t.json");
    for flag in ["--trace", "--svg", "--output"] {
        // 10^6 steps would take minutes: a usage error (exit 2) shows nothing ran first.
        train(&["--steps", "1000000", "--quiet", flag, s(&missing)]).usage_error(&["nodir"]);
    }
    assert!(dir.entries().is_empty(), "{:?}", dir.entries());
}

#[test]
fn output_writes_the_summary_to_a_file() {
    let dir = TempDir::new("train-output");
    let path = dir.join("summary.json");
    let run = train(&[
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--format",
        "json",
        "--quiet",
        "--output",
        s(&path),
    ]);
    run.ok();
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(floats(&doc["losses"]).len(), 2);
    assert_eq!(dir.entries(), vec!["summary.json"]);
}

#[test]
fn help_shows_the_real_defaults() {
    let run = dualpipe(["train", "--help"]);
    run.ok();
    let steps = run
        .stdout
        .split("--steps")
        .nth(1)
        .and_then(|rest| rest.split("--lr").next())
        .unwrap_or_default();
    // The GPT's default, and the MLP's beside it.
    assert!(
        steps.contains("[default: 300; 600 with --model mlp]"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("[default: dualpipe]"), "{}", run.stdout);
}

#[test]
fn the_receive_timeout_applies_to_local_ranks() {
    // A microsecond is shorter than any forward of the default width: the last rank's first
    // receive times out, and the step fails naming the timeout (exit 1), instead of the flag
    // being ignored.
    let run = dualpipe([
        "train",
        "--steps",
        "2",
        "--quiet",
        "--recv-timeout",
        "0.000001",
    ]);
    run.no_panic();
    assert_eq!(run.code, Some(1), "stderr:\n{}", run.stderr);
    assert!(run.stderr.to_lowercase().contains("time"), "{}", run.stderr);
}

#[test]
fn negative_numbers_reach_the_range_checks() {
    train(&["--recv-timeout", "-5"]).usage_error(&["--recv-timeout", "-5"]);
    train(&["--lr", "-0.5"]).usage_error(&["--lr", "-0.5"]);
    train(&["--hidden", "-4"]).flag_error(&["--hidden", "-4", "whole number"]);
    train(&["--ranks", "-2"]).flag_error(&["--ranks", "-2", "whole number"]);
}

#[test]
fn a_schedule_file_trains_exactly_like_the_generated_schedule() {
    let dir = TempDir::new("train-schedule-file");
    for (kind, ranks, mbs, ext) in [
        ("dualpipe", "4", "8", "json"),
        ("1f1b", "2", "4", "csv"),
        ("dualpipev", "2", "4", "csv"),
    ] {
        let shape = ["--schedule", kind, "--ranks", ranks, "--micro-batches", mbs];
        let exported = dualpipe(
            ["schedule"]
                .iter()
                .chain(shape.iter())
                .chain(["--format", ext].iter()),
        );
        exported.ok();
        let file = dir.path().join(format!("{kind}.{ext}"));
        std::fs::write(&file, &exported.stdout).unwrap();
        let mut generated_flags = vec!["--dtype", "f64"];
        generated_flags.extend_from_slice(&shape);
        let generated = train_json(&generated_flags);
        let from_file = train_json(&["--dtype", "f64", "--schedule-file", s(&file)]);
        assert_eq!(from_file["losses"], generated["losses"], "{kind} via {ext}");
        assert_eq!(from_file["schedule"], kind);
    }
}

#[test]
fn a_broken_schedule_file_is_refused_before_training() {
    let dir = TempDir::new("train-schedule-file-bad");
    let file = dir.path().join("broken.csv");
    // Rank 1 never runs the backward of micro-batch 1.
    std::fs::write(&file, "0F0,0F1,0B0,0B1\n1F0,1F1,1B0\n").unwrap();
    train(&["--schedule-file", s(&file)]).usage_error(&["broken.csv"]);
    let both = train(&["--schedule-file", s(&file), "--ranks", "2"]);
    assert_eq!(both.code, Some(2), "{}", both.stderr);
    assert!(
        both.stderr.contains("cannot be used with '--ranks"),
        "{}",
        both.stderr
    );
}

#[test]
fn data_parallel_runs_report_the_exchange() {
    let run = train(&[
        "--model",
        "mlp",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--hidden",
        "8",
        "--steps",
        "2",
        "--data-parallel",
        "2",
        "--gradient-compression",
        "int8",
        "--format",
        "json",
    ]);
    run.ok();
    let doc = run.json();
    assert_eq!(doc["data_parallel"], 2);
    assert_eq!(doc["gradient_compression"], "int8");
    let sent = doc["grad_bytes_sent"].as_u64().unwrap();
    let full = doc["grad_bytes_uncompressed"].as_u64().unwrap();
    assert!(sent > 0 && sent < full, "{sent} of {full}");
    assert!(doc["communication_overhead"].as_f64().unwrap() >= 0.0);
    assert_eq!(doc["grad_exchange_started"], "in-pipeline");
}

#[test]
fn a_tiny_run_writes_its_summary_and_files() {
    let dir = TempDir::new("train-tiny-files");
    let (trace_path, svg_path, out_path) =
        (dir.join("t.json"), dir.join("t.svg"), dir.join("s.json"));
    let paths = [
        ("--trace", &trace_path),
        ("--svg", &svg_path),
        ("--output", &out_path),
    ];
    let tiny = "--ranks 2 --micro-batches 4 --hidden 8 --steps 3 --format json --quiet";
    let mut flags: Vec<&str> = tiny.split_whitespace().collect();
    flags.extend(paths.iter().flat_map(|(flag, path)| [*flag, s(path)]));
    train(&flags).ok();
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    assert_eq!(summary["losses"].as_array().unwrap().len(), 3);
    assert_eq!(summary["final_loss"], summary["losses"][2]);
    for key in [
        "samples_per_second",
        "step_seconds_median",
        "bubble_ratio",
        "comm_wait_seconds",
    ] {
        assert!(summary[key].as_f64().unwrap() >= 0.0, "{key}");
    }
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
    assert!(trace.is_object() || trace.is_array());
    assert!(std::fs::read_to_string(&svg_path)
        .unwrap()
        .starts_with("<svg"));
}

#[cfg(not(feature = "mpi"))]
#[test]
fn mpi_without_the_feature_says_how_to_build_it() {
    train(&["--transport", "mpi"]).usage_error(&["--features mpi"]);
}
