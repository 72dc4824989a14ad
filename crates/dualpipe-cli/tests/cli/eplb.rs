//! `dualpipe eplb`: the plan in both formats, every input format, history predictors, golden
//! parity through the CLI, bad input.

use std::path::Path;

use serde_json::Value;

use crate::{dualpipe, golden_dir, s, Run, TempDir};

/// Two layers of twelve experts (the EPLB README's example loads).
const LOADS: [[f64; 12]; 2] = [
    [
        90., 132., 40., 61., 104., 165., 39., 4., 73., 56., 183., 86.,
    ],
    [
        20., 107., 104., 64., 19., 197., 187., 157., 172., 86., 16., 27.,
    ],
];

fn loads_csv() -> String {
    LOADS
        .iter()
        .map(|row| {
            row.iter()
                .map(|v| format!("{v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn loads_json() -> String {
    serde_json::to_string(&LOADS).unwrap()
}

/// A little-endian f64 `.npy` (format 1.0) of the given shape and values.
fn npy(shape: &[usize], values: &[f64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}");
    // magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple
    // of 64 and ended by a newline.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in values {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes
}

fn eplb(loads: &Path, replicas: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "eplb",
        "--loads",
        s(loads),
        "--replicas",
        replicas,
        "--groups",
        "4",
        "--nodes",
        "2",
        "--gpus",
        "8",
    ];
    args.extend_from_slice(extra);
    dualpipe(args)
}

fn eplb_json(loads: &Path, extra: &[&str]) -> Value {
    let mut flags = vec!["--format", "json"];
    flags.extend_from_slice(extra);
    let run = eplb(loads, "16", &flags);
    run.ok();
    assert!(run.stderr.is_empty(), "stderr: {}", run.stderr);
    run.json()
}

fn int_rows(v: &Value) -> Vec<Vec<i64>> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected a matrix, got {v}"))
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect()
        })
        .collect()
}

/// The plan's three maps agree with each other and with the sizes.
fn check_plan(doc: &Value, layers: usize, experts: usize, replicas: usize) {
    let phy2log = int_rows(&doc["phy2log"]);
    let logcnt = int_rows(&doc["logcnt"]);
    let log2phy: Vec<Vec<Vec<i64>>> = doc["log2phy"]
        .as_array()
        .expect("log2phy is an array")
        .iter()
        .map(int_rows)
        .collect();
    assert_eq!(phy2log.len(), layers);
    assert_eq!(logcnt.len(), layers);
    assert_eq!(log2phy.len(), layers);
    for l in 0..layers {
        assert_eq!(phy2log[l].len(), replicas, "layer {l}: one entry per slot");
        assert_eq!(logcnt[l].len(), experts);
        assert_eq!(logcnt[l].iter().sum::<i64>(), replicas as i64, "layer {l}");
        assert_eq!(log2phy[l].len(), experts);
        for e in 0..experts {
            assert!(logcnt[l][e] >= 1, "layer {l} expert {e} has no replica");
            let slots: Vec<i64> = log2phy[l][e].iter().copied().filter(|&p| p >= 0).collect();
            assert_eq!(slots.len() as i64, logcnt[l][e], "layer {l} expert {e}");
            for p in slots {
                assert_eq!(phy2log[l][p as usize], e as i64, "layer {l} slot {p}");
            }
        }
    }
}

#[test]
fn json_has_the_plan_and_balance_stats() {
    let dir = TempDir::new("eplb-json");
    let doc = eplb_json(&dir.write("loads.csv", loads_csv()), &[]);
    check_plan(&doc, 2, 12, 16);
    let stats = &doc["stats"];
    let before = stats["before"]["total"]["imbalance"]
        .as_f64()
        .expect("stats.before");
    let after = stats["after"]["total"]["imbalance"]
        .as_f64()
        .expect("stats.after");
    assert!(
        after >= 1.0 && after < before,
        "imbalance {before} -> {after}"
    );
    assert_eq!(stats["after"]["layers"].as_array().unwrap().len(), 2);
}

#[test]
fn table_summarises_balance_per_layer_and_gpu() {
    let dir = TempDir::new("eplb-table");
    let run = eplb(&dir.write("loads.csv", loads_csv()), "16", &[]);
    run.ok();
    let text = &run.stdout;
    assert!(text.contains("2 layers x 12 experts"), "{text}");
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("total")),
        "{text}"
    );
    for gpu in 0..8 {
        assert!(
            text.contains(&format!("GPU {gpu:>3}")),
            "GPU {gpu}:\n{text}"
        );
    }
}

#[test]
fn csv_json_and_npy_inputs_give_the_same_plan() {
    let dir = TempDir::new("eplb-formats");
    let flat: Vec<f64> = LOADS.iter().flatten().copied().collect();
    let from_csv = eplb_json(&dir.write("l.csv", loads_csv()), &[]);
    let from_json = eplb_json(&dir.write("l.json", loads_json()), &[]);
    let from_npy = eplb_json(&dir.write("l.npy", npy(&[2, 12], &flat)), &[]);
    assert_eq!(from_csv, from_json, "csv vs json");
    assert_eq!(from_csv, from_npy, "csv vs npy");
}

#[test]
fn a_history_is_predicted_before_planning() {
    let dir = TempDir::new("eplb-history");
    let last = dir.write("last.json", loads_json());
    // An older step with other loads, then the README loads.
    let old: Vec<Vec<f64>> = LOADS
        .iter()
        .map(|row| row.iter().rev().copied().collect())
        .collect();
    let history = dir.write(
        "history.json",
        serde_json::to_string(&vec![
            old.clone(),
            LOADS.iter().map(|r| r.to_vec()).collect(),
        ])
        .unwrap(),
    );
    let plan_of_last = eplb_json(&last, &[]);
    assert_eq!(eplb_json(&history, &["--window", "1"]), plan_of_last);
    assert_eq!(eplb_json(&history, &["--ema", "1"]), plan_of_last);
    // The mean of the two steps is a different load matrix, so a different plan.
    let mean = eplb_json(&history, &[]);
    assert_ne!(mean["phy2log"], plan_of_last["phy2log"]);
    // The same history as a 3-D .npy.
    let flat: Vec<f64> = old
        .iter()
        .flatten()
        .chain(LOADS.iter().flatten())
        .copied()
        .collect();
    let npy_history = dir.write("history.npy", npy(&[2, 2, 12], &flat));
    assert_eq!(eplb_json(&npy_history, &[]), mean);
}

#[test]
fn same_input_gives_the_same_bytes() {
    let dir = TempDir::new("eplb-determinism");
    let loads = dir.write("loads.csv", loads_csv());
    for format in ["json", "table"] {
        let a = eplb(&loads, "16", &["--format", format]);
        let b = eplb(&loads, "16", &["--format", format]);
        assert_eq!(a.ok().stdout, b.ok().stdout, "{format}");
    }
}

#[test]
fn golden_cases_match_the_reference_through_the_cli() {
    let dir = golden_dir("eplb");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let case: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let flag = |k: &str| case[k].as_u64().unwrap().to_string();
        let run = dualpipe([
            "eplb",
            "--loads",
            s(&path),
            "--replicas",
            &flag("num_replicas"),
            "--groups",
            &flag("num_groups"),
            "--nodes",
            &flag("num_nodes"),
            "--gpus",
            &flag("num_gpus"),
            "--policy",
            "deepseek",
            "--format",
            "json",
        ]);
        run.ok();
        let ours = run.json();
        for key in ["phy2log", "log2phy", "logcnt"] {
            assert_eq!(ours[key], case[key], "{}: {key}", path.display());
        }
        checked += 1;
    }
    assert!(checked > 0, "no golden cases in {}", dir.display());
}

#[test]
fn bad_input_is_a_one_line_usage_error() {
    let dir = TempDir::new("eplb-bad");
    let good = dir.write("loads.csv", loads_csv());
    eplb(&good, "15", &[]).usage_error(&["15", "multiple", "GPUs"]);
    eplb(&good, "8", &[]).usage_error(&["8 replicas", "12 experts"]);
    eplb(&dir.join("missing.csv"), "16", &[]).usage_error(&["missing.csv"]);
    eplb(&dir.write("bad.csv", "1,2,x\n"), "16", &[]).usage_error(&["bad.csv", "line 1", "x"]);
    eplb(&dir.write("bad.json", "[[1,2],[3"), "16", &[]).usage_error(&["bad.json", "JSON"]);
    eplb(&dir.write("ragged.json", "[[1,2,3],[4,5]]"), "16", &[])
        .usage_error(&["ragged.json", "layer 1"]);
    eplb(&dir.write("negative.json", "[[1,-2,3,4]]"), "8", &[])
        .usage_error(&["negative.json", "-2"]);
    eplb(&dir.write("empty.csv", ""), "16", &[]).usage_error(&["empty.csv", "empty"]);
    eplb(&dir.write("bad.npy", "not numpy"), "16", &[]).usage_error(&["bad.npy", "npy"]);
    let mut truncated = npy(&[2, 12], &[1.0; 24]);
    truncated.truncate(truncated.len() - 8);
    eplb(&dir.write("truncated.npy", truncated), "16", &[]).usage_error(&["truncated.npy"]);
    eplb(&dir.write("loads.xlsx", "?"), "16", &[]).usage_error(&["loads.xlsx"]);
    dualpipe([
        "eplb",
        "--loads",
        s(&good),
        "--replicas",
        "16",
        "--groups",
        "5",
        "--nodes",
        "2",
        "--gpus",
        "8",
    ])
    .usage_error(&["12 experts", "5 groups"]);
    dualpipe([
        "eplb",
        "--loads",
        s(&good),
        "--replicas",
        "16",
        "--groups",
        "4",
        "--nodes",
        "3",
        "--gpus",
        "8",
    ])
    .usage_error(&["8 GPUs", "3 nodes"]);
    dualpipe([
        "eplb",
        "--loads",
        s(&good),
        "--replicas",
        "16",
        "--groups",
        "4",
        "--nodes",
        "2",
        "--gpus",
        "0",
    ])
    .usage_error(&["0"]);
    eplb(&good, "16", &["--ema", "2"]).usage_error(&["alpha"]);
    eplb(&good, "16", &["--format", "xml"]).flag_error(&["xml", "--format"]);
    dualpipe(["eplb", "--replicas", "16"]).flag_error(&["--loads"]);
}

#[test]
fn numbers_and_files_found_by_the_reliability_probe() {
    let dir = TempDir::new("eplb-probe");
    // Loads that overflow f32, and a layer whose loads add up past it, name the file and cell.
    let mut huge = LOADS;
    huge[1][3] = 1e308;
    eplb(
        &dir.write("huge.json", serde_json::to_string(&huge).unwrap()),
        "16",
        &[],
    )
    .usage_error(&["huge.json", "layer 1, expert 3", "largest f32"]);
    let mut sum = LOADS;
    sum[0][0] = 3e38;
    sum[0][1] = 3e38;
    eplb(
        &dir.write("sum.json", serde_json::to_string(&sum).unwrap()),
        "16",
        &[],
    )
    .usage_error(&["sum.json", "layer 0", "add up"]);
    // A byte-order mark is accepted; a `;`-separated line is not taken for a header.
    let good = eplb_json(&dir.write("loads.csv", loads_csv()), &[]);
    let bom = eplb_json(
        &dir.write("bom.csv", format!("\u{feff}{}", loads_csv())),
        &[],
    );
    assert_eq!(good["phy2log"], bom["phy2log"]);
    eplb(
        &dir.write("semi.csv", "1;2;3;4;5;6;7;8;9;10;11;12\n"),
        "16",
        &[],
    )
    .usage_error(&["semi.csv", "line 1", "commas"]);
    // A negative value reaches the range check instead of being taken for a flag.
    eplb(&dir.path().join("loads.csv"), "16", &["--ema", "-0.5"]).usage_error(&["alpha", "-0.5"]);
    // Truncated .npy preambles and a .npy with more data than its shape.
    eplb(&dir.write("magic.npy", b"\x93NUMPY\x01\x00"), "16", &[])
        .usage_error(&["magic.npy", "preamble is truncated"]);
    eplb(
        &dir.write("v2.npy", b"\x93NUMPY\x02\x00\x00\x00"),
        "16",
        &[],
    )
    .usage_error(&["v2.npy", "preamble is truncated"]);
    let mut extra = npy(&[2, 12], &[1.0; 24]);
    extra.extend_from_slice(&[0u8; 16]);
    eplb(&dir.write("extra.npy", extra), "16", &[])
        .usage_error(&["extra.npy", "header does not describe the data"]);
    // Sizes past the cap are refused before allocating, naming the flag.
    eplb(
        &dir.path().join("loads.csv"),
        "1073741824",
        &["--policy", "deepseek"],
    )
    .usage_error(&["--replicas 1073741824", "cap"]);
    // A previous plan for another topology, and byte counts that would saturate.
    let prev = dir.write(
        "prev.json",
        eplb(&dir.path().join("loads.csv"), "16", &["--format", "json"])
            .ok()
            .stdout
            .clone(),
    );
    dualpipe([
        "eplb",
        "--loads",
        s(&dir.path().join("loads.csv")),
        "--replicas",
        "16",
        "--groups",
        "4",
        "--nodes",
        "1",
        "--gpus",
        "4",
        "--previous",
        s(&prev),
    ])
    .usage_error(&[
        "--previous",
        "prev.json",
        "16 replicas on 8 GPUs in 2 nodes",
        "16 replicas on 4 GPUs in 1 nodes",
    ]);
    eplb(
        &dir.path().join("loads.csv"),
        "16",
        &[
            "--previous",
            s(&prev),
            "--expert-bytes",
            "18446744073709551615",
        ],
    )
    .usage_error(&["--expert-bytes", "overflows"]);
    eplb(
        &dir.path().join("loads.csv"),
        "16",
        &["--previous", s(&dir.path().join("gone.json"))],
    )
    .usage_error(&["--previous", "gone.json"]);
}
