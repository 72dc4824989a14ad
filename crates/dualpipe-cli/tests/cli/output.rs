//! `--output FILE` (and the picture files): written whole on success, never created or
//! touched by a failing run, no temp files left behind.

use crate::{dualpipe, s, TempDir};

const KEEP: &str = "an earlier result the user wants to keep\n";

/// Commands that succeed, as (name, flags without --output).
fn good_commands(loads: &str) -> Vec<(&'static str, Vec<String>)> {
    let v = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        (
            "schedule-json",
            v(&[
                "schedule",
                "--schedule",
                "dualpipe",
                "--ranks",
                "4",
                "--micro-batches",
                "8",
                "--format",
                "json",
            ]),
        ),
        (
            "schedule-csv",
            v(&[
                "schedule",
                "--schedule",
                "zb1p",
                "--ranks",
                "4",
                "--micro-batches",
                "8",
                "--format",
                "csv",
            ]),
        ),
        (
            "schedule-table",
            v(&[
                "schedule",
                "--schedule",
                "1f1b",
                "--ranks",
                "2",
                "--micro-batches",
                "4",
            ]),
        ),
        (
            "simulate-json",
            v(&[
                "simulate",
                "--schedule",
                "1f1b",
                "--ranks",
                "4",
                "--micro-batches",
                "8",
                "--format",
                "json",
            ]),
        ),
        (
            "simulate-table",
            v(&[
                "simulate",
                "--schedule",
                "1f1b",
                "--ranks",
                "4",
                "--micro-batches",
                "8",
            ]),
        ),
        (
            "compare-json",
            v(&[
                "compare",
                "--ranks",
                "4",
                "--micro-batches",
                "8",
                "--fb",
                "2",
                "--format",
                "json",
            ]),
        ),
        (
            "eplb-json",
            v(&[
                "eplb",
                "--loads",
                loads,
                "--replicas",
                "8",
                "--groups",
                "2",
                "--nodes",
                "2",
                "--gpus",
                "4",
                "--format",
                "json",
            ]),
        ),
        (
            "eplb-table",
            v(&[
                "eplb",
                "--loads",
                loads,
                "--replicas",
                "8",
                "--groups",
                "2",
                "--nodes",
                "2",
                "--gpus",
                "4",
            ]),
        ),
    ]
}

#[test]
fn output_file_holds_exactly_what_stdout_would() {
    let dir = TempDir::new("out-good");
    let loads = dir.write("loads.csv", "5,1,7,3,2,8\n1,1,9,4,4,2\n");
    for (name, flags) in good_commands(s(&loads)) {
        let to_stdout = dualpipe(&flags);
        to_stdout.ok();
        let file = dir.join(&format!("{name}.out"));
        // Over an existing file: replaced whole.
        std::fs::write(&file, KEEP).unwrap();
        let mut with_output = flags.clone();
        with_output.extend(["--output".to_string(), s(&file).to_string()]);
        let run = dualpipe(&with_output);
        run.ok();
        assert!(
            run.stdout.is_empty(),
            "{name}: stdout with --output: {}",
            run.stdout
        );
        let written = std::fs::read_to_string(&file).unwrap();
        assert_eq!(
            written, to_stdout.stdout,
            "{name}: the file differs from stdout"
        );
    }
    let mut expected: Vec<String> = good_commands("")
        .into_iter()
        .map(|(n, _)| format!("{n}.out"))
        .chain(["loads.csv".to_string()])
        .collect();
    expected.sort();
    assert_eq!(dir.entries(), expected, "no temp files left behind");
}

/// Failing commands, as (name, flags without --output).
fn bad_commands(loads: &str) -> Vec<(&'static str, Vec<String>)> {
    let v = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        (
            "schedule-odd-ranks",
            v(&[
                "schedule",
                "--schedule",
                "dualpipe",
                "--ranks",
                "3",
                "--micro-batches",
                "8",
                "--format",
                "json",
            ]),
        ),
        (
            "schedule-unknown",
            v(&[
                "schedule",
                "--schedule",
                "zigzag",
                "--ranks",
                "4",
                "--micro-batches",
                "8",
            ]),
        ),
        (
            "simulate-negative",
            v(&[
                "simulate",
                "--schedule",
                "1f1b",
                "--ranks",
                "4",
                "--micro-batches",
                "8",
                "--f",
                "-1",
            ]),
        ),
        (
            "compare-negative",
            v(&[
                "compare",
                "--ranks",
                "4",
                "--micro-batches",
                "8",
                "--b",
                "-1",
            ]),
        ),
        (
            "eplb-replicas",
            v(&[
                "eplb",
                "--loads",
                loads,
                "--replicas",
                "9",
                "--groups",
                "2",
                "--nodes",
                "2",
                "--gpus",
                "4",
            ]),
        ),
        (
            "eplb-missing",
            v(&[
                "eplb",
                "--loads",
                "/nonexistent/loads.csv",
                "--replicas",
                "8",
                "--groups",
                "2",
                "--nodes",
                "2",
                "--gpus",
                "4",
            ]),
        ),
    ]
}

#[test]
fn a_failing_run_creates_no_file() {
    let dir = TempDir::new("out-bad-new");
    let loads = dir.write("loads.csv", "5,1,7,3,2,8\n");
    for (name, flags) in bad_commands(s(&loads)) {
        let file = dir.join(&format!("{name}.out"));
        let mut args = flags.clone();
        args.extend(["--output".to_string(), s(&file).to_string()]);
        dualpipe(&args).usage_error(&[]);
        assert!(
            !file.exists(),
            "{name}: a failing run created {}",
            file.display()
        );
    }
    assert_eq!(dir.entries(), vec!["loads.csv"], "nothing else appeared");
}

#[test]
fn a_failing_run_leaves_an_existing_file_untouched() {
    let dir = TempDir::new("out-bad-existing");
    let loads = dir.write("loads.csv", "5,1,7,3,2,8\n");
    for (name, flags) in bad_commands(s(&loads)) {
        let file = dir.write(&format!("{name}.out"), KEEP);
        let mut args = flags.clone();
        args.extend(["--output".to_string(), s(&file).to_string()]);
        dualpipe(&args).usage_error(&[]);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), KEEP, "{name}");
    }
}

#[test]
fn a_failing_simulation_writes_no_pictures() {
    let dir = TempDir::new("out-bad-pictures");
    let (out, svg, trace) = (dir.join("o.json"), dir.join("o.svg"), dir.join("o.trace"));
    dualpipe([
        "simulate",
        "--schedule",
        "dualpipe",
        "--ranks",
        "3",
        "--micro-batches",
        "8",
        "--output",
        s(&out),
        "--svg",
        s(&svg),
        "--trace",
        s(&trace),
    ])
    .usage_error(&["even"]);
    dualpipe([
        "train",
        "--model",
        "mlp",
        "--ranks",
        "3",
        "--steps",
        "1",
        "--hidden",
        "8",
        "--micro-batch-size",
        "2",
        "--svg",
        s(&svg),
        "--trace",
        s(&trace),
    ])
    .usage_error(&["even"]);
    assert!(dir.entries().is_empty(), "{:?}", dir.entries());
}

#[test]
fn an_unwritable_output_path_is_one_clear_error() {
    let dir = TempDir::new("out-unwritable");
    let target = dir.join("no-such-dir/result.json");
    let run = dualpipe([
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--format",
        "json",
        "--output",
        s(&target),
    ]);
    run.no_panic();
    assert_ne!(
        run.code,
        Some(0),
        "writing into a missing folder cannot succeed"
    );
    assert!(run.stdout.is_empty());
    let lines = run.stderr_lines();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains("result.json"),
        "{}",
        lines[0]
    );
    assert!(dir.entries().is_empty(), "{:?}", dir.entries());
}

#[test]
fn an_output_path_that_is_a_folder_is_one_clear_error() {
    let dir = TempDir::new("out-folder");
    let folder = dir.join("results");
    std::fs::create_dir(&folder).unwrap();
    let run = dualpipe([
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--output",
        s(&folder),
    ]);
    run.no_panic();
    assert_ne!(run.code, Some(0));
    assert_eq!(run.stderr_lines().len(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("results"), "{}", run.stderr);
    assert!(folder.is_dir(), "the folder is still there");
    assert_eq!(dir.entries(), vec!["results"], "no temp files left behind");
}
