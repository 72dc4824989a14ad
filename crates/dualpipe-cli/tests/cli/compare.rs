//! `dualpipe compare`: one row per schedule that accepts the sizes; agrees with `simulate`.

use serde_json::Value;

use crate::{close, dualpipe, Run};

fn compare(ranks: &str, micro_batches: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "compare",
        "--ranks",
        ranks,
        "--micro-batches",
        micro_batches,
    ];
    args.extend_from_slice(extra);
    dualpipe(args)
}

#[test]
fn json_lists_every_kind_and_matches_simulate() {
    let run = compare("4", "8", &["--format", "json", "--fb", "2.5"]);
    run.ok();
    assert!(run.stderr.is_empty(), "stderr: {}", run.stderr);
    let doc = run.json();
    let rows = doc["schedules"]
        .as_array()
        .expect("`schedules` is an array");
    let kinds: Vec<&str> = rows
        .iter()
        .map(|r| r["schedule"].as_str().unwrap())
        .collect();
    for kind in [
        "gpipe",
        "1f1b",
        "interleaved",
        "zb1p",
        "dualpipe",
        "dualpipev",
    ] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    for row in rows {
        let kind = row["schedule"].as_str().unwrap();
        for key in [
            "makespan",
            "bubble_ratio",
            "peak_activations",
            "parameter_copies",
        ] {
            assert!(row[key].is_number(), "{kind}: `{key}` in {row}");
        }
        // The default basis is per stage chunk, the same costs `simulate` uses.
        let sim = dualpipe([
            "simulate",
            "--schedule",
            kind,
            "--ranks",
            "4",
            "--micro-batches",
            "8",
            "--fb",
            "2.5",
            "--format",
            "json",
        ]);
        sim.ok();
        let sim: Value = sim.json();
        for key in ["makespan", "bubble_ratio"] {
            let (a, b) = (row[key].as_f64().unwrap(), sim[key].as_f64().unwrap());
            assert!(close(a, b, 1e-9), "{kind} {key}: compare {a}, simulate {b}");
        }
    }
}

#[test]
fn kinds_that_reject_the_sizes_are_listed_with_the_reason() {
    let run = compare("3", "8", &["--format", "json", "--fb", "2.5"]);
    run.ok();
    let doc = run.json();
    let rows = doc["schedules"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["schedule"] != "dualpipe"), "{doc}");
    let rejected = doc["rejected"].as_array().expect("`rejected` is an array");
    let dualpipe = rejected
        .iter()
        .find(|r| r["schedule"] == "dualpipe")
        .expect("dualpipe is rejected on 3 ranks");
    assert!(
        dualpipe["reason"].as_str().unwrap().contains("even"),
        "{dualpipe}"
    );
}

#[test]
fn table_has_one_row_per_kind() {
    let run = compare("4", "8", &["--fb", "2.5"]);
    run.ok();
    for kind in [
        "gpipe",
        "1f1b",
        "interleaved",
        "zb1p",
        "dualpipe",
        "dualpipev",
    ] {
        assert!(
            run.stdout.lines().any(|l| l.starts_with(kind)),
            "no row for {kind}:\n{}",
            run.stdout
        );
    }
}

#[test]
fn bad_costs_are_one_line_usage_errors() {
    compare("4", "8", &["--f", "-1"]).usage_error(&["-1", "--f"]);
    compare("4", "8", &["--w", "5"]).usage_error(&["W", "B"]);
}

#[test]
fn sizes_no_schedule_accepts_are_a_usage_error() {
    // Zero micro-batches: every kind rejects it, so there is nothing to compare.
    let run = compare("4", "0", &["--fb", "2.5"]);
    run.usage_error(&["micro-batch"]);
}

#[test]
fn per_rank_costs_scale_chunks_of_kinds_with_more_stages_than_ranks() {
    let run = compare(
        "4",
        "8",
        &["--format", "json", "--fb", "2.5", "--per-rank-costs"],
    );
    run.ok();
    let doc = run.json();
    for row in doc["schedules"].as_array().unwrap() {
        let kind = row["schedule"].as_str().unwrap();
        let pp = row["pp"].as_f64().unwrap();
        let scale = row["chunk_scale"].as_f64().unwrap();
        assert!(
            close(scale, 4.0 / pp, 1e-12),
            "{kind}: chunk_scale {scale}, pp {pp}"
        );
        // The same as simulating with every duration multiplied by the scale.
        let cost = |x: f64| format!("{}", x * scale);
        let (f, b, w, fb) = (cost(1.0), cost(2.0), cost(1.0), cost(2.5));
        let sim = dualpipe([
            "simulate",
            "--schedule",
            kind,
            "--ranks",
            "4",
            "--micro-batches",
            "8",
            "--f",
            &f,
            "--b",
            &b,
            "--w",
            &w,
            "--fb",
            &fb,
            "--format",
            "json",
        ]);
        sim.ok();
        let (a, b) = (
            row["makespan"].as_f64().unwrap(),
            sim.json()["makespan"].as_f64().unwrap(),
        );
        assert!(close(a, b, 1e-9), "{kind}: compare {a}, simulate {b}");
    }
    assert!(
        doc["schedules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["chunk_scale"].as_f64() == Some(0.5)),
        "dualpipev and interleaved run half-size chunks: {doc}"
    );
}

#[test]
fn absurd_sizes_and_negative_counts_are_usage_errors_naming_the_flag() {
    dualpipe([
        "compare",
        "--ranks",
        "1000000000000",
        "--micro-batches",
        "8",
    ])
    .usage_error(&["at most --ranks"]);
    dualpipe(["compare", "--ranks", "1024", "--micro-batches", "1000000"])
        .usage_error(&["at most --micro-batches"]);
    let run = dualpipe(["compare", "--ranks", "-4", "--micro-batches", "8"]);
    run.flag_error(&["--ranks", "cannot be negative"]);
}
