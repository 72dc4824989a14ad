//! `dualpipe schedule`: the three formats, re-import, golden parity, bad input.

use std::collections::BTreeMap;

use dualpipe_schedule::format::{csv, json};
use dualpipe_schedule::ScheduleKind;
use serde_json::Value;

use crate::{dualpipe, golden_dir};

const COMPUTE: [&str; 5] = ["F", "B", "I", "W", "FB"];

fn schedule(kind: &str, ranks: usize, micro_batches: usize, format: &str) -> String {
    let (r, m) = (ranks.to_string(), micro_batches.to_string());
    let run = dualpipe([
        "schedule",
        "--schedule",
        kind,
        "--ranks",
        &r,
        "--micro-batches",
        &m,
        "--format",
        format,
    ]);
    run.ok();
    assert!(
        run.stderr.is_empty(),
        "{kind}: a successful run wrote to stderr: {}",
        run.stderr
    );
    run.stdout
}

/// Each rank's compute ops, as the JSON objects the user sees.
fn compute_ops(doc: &Value) -> Vec<Vec<Value>> {
    programs(doc)
        .iter()
        .map(|p| {
            p.iter()
                .filter(|op| COMPUTE.contains(&op["op"].as_str().unwrap_or("")))
                .cloned()
                .collect()
        })
        .collect()
}

/// Each rank's communication ops (no WAIT) as a sorted multiset of canonical strings.
fn comm_ops(doc: &Value) -> Vec<Vec<String>> {
    programs(doc)
        .iter()
        .map(|p| {
            let mut ops: Vec<String> = p
                .iter()
                .filter(|op| {
                    let name = op["op"].as_str().unwrap_or("");
                    !COMPUTE.contains(&name) && name != "WAIT"
                })
                .map(|op| {
                    // serde_json's map is sorted by key, so this is canonical.
                    let sorted: BTreeMap<String, Value> = op
                        .as_object()
                        .unwrap()
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    serde_json::to_string(&sorted).unwrap()
                })
                .collect();
            ops.sort();
            ops
        })
        .collect()
}

fn programs(doc: &Value) -> Vec<Vec<Value>> {
    doc["programs"]
        .as_array()
        .expect("`programs` is an array")
        .iter()
        .map(|p| p.as_array().expect("a rank's program is an array").clone())
        .collect()
}

#[test]
fn table_names_the_schedule_and_every_rank() {
    let text = schedule("dualpipe", 4, 8, "table");
    assert!(
        text.starts_with("schedule dualpipe: 4 ranks, 8 micro-batches"),
        "{text}"
    );
    for rank in 0..4 {
        assert!(
            text.contains(&format!("rank {rank} ")),
            "rank {rank}:\n{text}"
        );
    }
    assert!(text.contains("validated"), "{text}");
    assert!(
        !text.contains('\x1b'),
        "no colour codes when piped:\n{text}"
    );
}

#[test]
fn json_has_the_golden_keys_and_reimports_losslessly() {
    for (kind, ranks, mbs) in [
        ("gpipe", 3, 4),
        ("1f1b", 4, 8),
        ("interleaved", 2, 4),
        ("zb1p", 4, 8),
        ("dualpipe", 4, 8),
        ("dualpipev", 2, 5),
    ] {
        let text = schedule(kind, ranks, mbs, "json");
        let doc: Value = serde_json::from_str(&text).expect("schedule JSON parses");
        assert_eq!(doc["schedule"], kind);
        assert_eq!(doc["ranks"], ranks);
        assert_eq!(doc["micro_batches"], mbs);
        assert_eq!(programs(&doc).len(), ranks, "{kind}: one program per rank");
        let comms = comm_ops(&doc).iter().map(Vec::len).sum::<usize>();
        assert!(
            comms > 0 || ranks == 1,
            "{kind}: JSON is the lowered schedule"
        );

        let parsed = json::from_str(&text)
            .unwrap_or_else(|e| panic!("{kind}: the JSON output does not re-import: {e}"));
        assert_eq!(parsed.kind.name(), kind);
        assert_eq!((parsed.ranks, parsed.micro_batches), (ranks, mbs));
        let again: Value = serde_json::from_str(&json::to_string(&parsed)).unwrap();
        assert_eq!(again, doc, "{kind}: JSON -> schedule -> JSON changed it");
    }
}

#[test]
fn csv_reimports_to_the_same_compute_ops_as_json() {
    for (kind, ranks, mbs) in [
        ("1f1b", 4, 8),
        ("interleaved", 2, 4),
        ("zb1p", 3, 6),
        ("dualpipe", 4, 8),
        ("dualpipev", 2, 5),
    ] {
        let text = schedule(kind, ranks, mbs, "csv");
        assert_eq!(text.lines().count(), ranks, "{kind}: one CSV row per rank");
        let k = ScheduleKind::from_name(kind).unwrap();
        let from_csv = csv::from_str(&text, Some(k))
            .unwrap_or_else(|e| panic!("{kind}: the CSV output does not re-import: {e}"));
        let from_json = json::from_str(&schedule(kind, ranks, mbs, "json")).unwrap();
        assert_eq!(
            from_csv.compute_only().programs,
            from_json.compute_only().programs,
            "{kind}: CSV and JSON disagree on the compute ops"
        );
    }
}

#[test]
fn dualpipe_4x8_matches_the_golden_reference() {
    let dir = golden_dir("dualpipe");
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("dualpipe-pp4-mb8.json")).unwrap())
            .unwrap();
    let ours: Value = serde_json::from_str(&schedule("dualpipe", 4, 8, "json")).unwrap();
    assert_eq!(
        (&ours["ranks"], &ours["micro_batches"]),
        (&golden["ranks"], &golden["micro_batches"])
    );
    let (g, o) = (compute_ops(&golden), compute_ops(&ours));
    assert_eq!(g.len(), 4);
    for rank in 0..4 {
        assert!(
            g[rank].len() >= 8,
            "rank {rank}: the golden file lists compute ops"
        );
        assert_eq!(
            o[rank], g[rank],
            "rank {rank}: compute ops differ from the reference"
        );
    }
    assert_eq!(
        comm_ops(&ours),
        comm_ops(&golden),
        "communication sets differ"
    );
}

#[test]
fn every_golden_schedule_matches_through_the_cli() {
    let dir = golden_dir("dualpipe");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let golden: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let kind = golden["schedule"].as_str().unwrap();
        let ranks = golden["ranks"].as_u64().unwrap() as usize;
        let mbs = golden["micro_batches"].as_u64().unwrap() as usize;
        let ours: Value = serde_json::from_str(&schedule(kind, ranks, mbs, "json")).unwrap();
        assert_eq!(
            compute_ops(&ours),
            compute_ops(&golden),
            "{}: compute ops differ",
            path.display()
        );
        assert_eq!(
            comm_ops(&ours),
            comm_ops(&golden),
            "{}: communication sets differ",
            path.display()
        );
        checked += 1;
    }
    assert!(checked > 0, "no golden schedules in {}", dir.display());
}

#[test]
fn same_flags_give_the_same_bytes() {
    for format in ["table", "json", "csv"] {
        assert_eq!(
            schedule("dualpipe", 4, 10, format),
            schedule("dualpipe", 4, 10, format),
            "{format}"
        );
    }
}

#[test]
fn bad_configurations_are_one_line_usage_errors() {
    let cases: [(&[&str], &[&str]); 6] = [
        (&["dualpipe", "3", "8"], &["dualpipe", "even", "ranks", "3"]),
        (&["dualpipe", "4", "0"], &["micro-batch", "0"]),
        (&["1f1b", "4", "0"], &["micro-batch", "0"]),
        (&["gpipe", "0", "4"], &["rank", "0"]),
        (&["zigzag", "4", "8"], &["zigzag", "--schedule", "dualpipe"]),
        (&["dualpipe", "4", "7"], &["dualpipe", "7"]),
    ];
    for (config, needles) in cases {
        dualpipe([
            "schedule",
            "--schedule",
            config[0],
            "--ranks",
            config[1],
            "--micro-batches",
            config[2],
        ])
        .usage_error(needles);
    }
}

#[test]
fn bad_flags_are_usage_errors() {
    dualpipe([
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "-1",
        "--micro-batches",
        "4",
    ])
    .flag_error(&["-1"]);
    dualpipe([
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "4",
        "--micro-batches",
        "x",
    ])
    .flag_error(&["--micro-batches", "x"]);
    dualpipe(["schedule", "--ranks", "4", "--micro-batches", "4"]).flag_error(&["--schedule"]);
    dualpipe([
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "4",
        "--micro-batches",
        "4",
        "--format",
        "yaml",
    ])
    .flag_error(&["yaml", "--format"]);
}

#[test]
fn interleaved_with_three_virtual_stages_round_trips_in_both_formats() {
    let run = |format: &str| {
        let r = dualpipe([
            "schedule",
            "--schedule",
            "interleaved",
            "--ranks",
            "2",
            "--micro-batches",
            "4",
            "--virtual-stages",
            "3",
            "--format",
            format,
        ]);
        r.ok();
        r.stdout.clone()
    };
    let from_json = json::from_str(&run("json")).expect("JSON re-imports");
    assert_eq!(
        from_json.placement.stages(),
        6,
        "2 ranks x 3 virtual stages"
    );
    let from_csv =
        csv::from_str(&run("csv"), Some(ScheduleKind::Interleaved)).expect("CSV re-imports");
    assert_eq!(
        from_csv.compute_only().programs,
        from_json.compute_only().programs
    );
}

#[test]
fn absurd_sizes_are_refused_before_allocating_naming_the_flag() {
    // Finding 11: passed the op-count guard and aborted; now refused at once.
    dualpipe([
        "schedule",
        "--schedule",
        "gpipe",
        "--ranks",
        "1024",
        "--micro-batches",
        "16384",
        "--format",
        "json",
    ])
    .usage_error(&["--micro-batches 2048 with 1024 ranks", "cap"]);
    // Finding 17: the flag that is too large is the one named.
    let run = dualpipe([
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "1000000000000",
        "--micro-batches",
        "8",
    ]);
    run.usage_error(&["at most --ranks"]);
    assert!(
        !run.stderr.contains("at most --micro-batches"),
        "{}",
        run.stderr
    );
    dualpipe([
        "schedule",
        "--schedule",
        "interleaved",
        "--ranks",
        "4",
        "--micro-batches",
        "8",
        "--virtual-stages",
        "1000000",
    ])
    .usage_error(&["at most --virtual-stages"]);
    dualpipe([
        "schedule",
        "--schedule",
        "dualpipe",
        "--ranks",
        "100000",
        "--micro-batches",
        "2",
    ])
    .usage_error(&["at most --ranks"]);
}

#[test]
fn fixed_stage_kinds_name_their_own_stages_per_rank() {
    // Finding 29: DualPipeV has 2 stages per rank, so that is what the hint says.
    dualpipe([
        "schedule",
        "--schedule",
        "dualpipev",
        "--ranks",
        "4",
        "--micro-batches",
        "8",
        "--virtual-stages",
        "3",
    ])
    .usage_error(&["dualpipev", "2 stages per rank", "--virtual-stages 2"]);
    let two = dualpipe([
        "schedule",
        "--schedule",
        "dualpipev",
        "--ranks",
        "4",
        "--micro-batches",
        "8",
        "--virtual-stages",
        "2",
    ]);
    two.ok();
    assert!(
        two.stdout.starts_with("schedule dualpipev: 4 ranks"),
        "{}",
        two.stdout
    );
    dualpipe([
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "4",
        "--micro-batches",
        "8",
        "--virtual-stages",
        "2",
    ])
    .usage_error(&["1f1b", "1 stage per rank", "interleaved"]);
}

#[test]
fn negative_counts_reach_the_range_checks() {
    for flag in ["--ranks", "--micro-batches", "--virtual-stages"] {
        let mut args = vec![
            "schedule",
            "--schedule",
            "interleaved",
            "--ranks",
            "4",
            "--micro-batches",
            "8",
        ];
        match args.iter().position(|a| a == &flag) {
            Some(at) => args[at + 1] = "-3",
            None => args.extend([flag, "-3"]),
        }
        let run = dualpipe(&args);
        run.flag_error(&[flag, "cannot be negative", "-3"]);
        assert!(
            !run.stderr.contains("unexpected argument"),
            "{}",
            run.stderr
        );
    }
    dualpipe([
        "schedule",
        "--schedule",
        "1f1b",
        "--ranks",
        "2.5",
        "--micro-batches",
        "8",
    ])
    .flag_error(&["--ranks", "whole number"]);
}
