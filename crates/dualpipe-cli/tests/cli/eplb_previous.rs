//! `dualpipe eplb --previous`: the move plan from an earlier placement, checked against the
//! two placements it connects (the user's view: where each expert was, where it is now).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::{dualpipe, s, Run, TempDir};

const GPUS: usize = 8;
const NODES: usize = 2;
const REPLICAS: usize = 16;

/// The EPLB README's loads, and the same two layers swapped (a load shift).
const LOADS: &str = "90,132,40,61,104,165,39,4,73,56,183,86\n\
                     20,107,104,64,19,197,187,157,172,86,16,27\n";
const SHIFTED: &str = "20,107,104,64,19,197,187,157,172,86,16,27\n\
                       90,132,40,61,104,165,39,4,73,56,183,86\n";

fn eplb(loads: &Path, extra: &[&str]) -> Run {
    let (replicas, gpus, nodes) = (REPLICAS.to_string(), GPUS.to_string(), NODES.to_string());
    let mut args = vec![
        "eplb",
        "--loads",
        s(loads),
        "--replicas",
        &replicas,
        "--groups",
        "4",
        "--nodes",
        &nodes,
        "--gpus",
        &gpus,
    ];
    args.extend_from_slice(extra);
    let run = dualpipe(args);
    run.no_panic();
    run
}

fn plan(loads: &Path, extra: &[&str]) -> Value {
    let mut flags = vec!["--format", "json"];
    flags.extend_from_slice(extra);
    let run = eplb(loads, &flags);
    run.ok();
    run.json()
}

fn phy2log(doc: &Value) -> Vec<Vec<i64>> {
    doc["phy2log"]
        .as_array()
        .expect("phy2log")
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

fn count(experts: impl IntoIterator<Item = i64>) -> BTreeMap<i64, usize> {
    let mut m = BTreeMap::new();
    for e in experts {
        *m.entry(e).or_insert(0) += 1;
    }
    m
}

/// Checks `moves` and `rounds` against the previous and the new placement:
/// - a move takes an expert from a slot that held it to a slot that holds it now, across GPUs;
/// - on every GPU, the replicas that are new there (new minus old, as multisets) are exactly
///   the ones moved there (a reshuffle within a GPU costs no transfer);
/// - the rounds list every move once, and their counts and bytes add up.
fn check_moves(previous: &[Vec<i64>], doc: &Value, expert_bytes: u64) -> usize {
    let new = phy2log(doc);
    let per_gpu = REPLICAS / GPUS;
    let gpus_per_node = GPUS / NODES;
    let moves = doc["moves"].as_array().expect("`moves` with --previous");
    let field = |m: &Value, k: &str| {
        m[k].as_u64()
            .unwrap_or_else(|| panic!("move field `{k}` in {m}")) as usize
    };
    for m in moves {
        let (l, e) = (field(m, "layer"), field(m, "expert") as i64);
        let (src, dst) = (field(m, "src_gpu"), field(m, "dst_gpu"));
        let src_slot = src * per_gpu + field(m, "src_slot");
        let dst_slot = dst * per_gpu + field(m, "dst_slot");
        assert_ne!(src, dst, "a move stays on its GPU: {m}");
        assert_eq!(
            previous[l][src_slot], e,
            "the source did not hold the expert: {m}"
        );
        assert_eq!(
            new[l][dst_slot], e,
            "the destination does not hold the expert: {m}"
        );
        assert_eq!(
            m["inter_node"].as_bool(),
            Some(src / gpus_per_node != dst / gpus_per_node),
            "inter_node flag: {m}"
        );
    }
    for l in 0..new.len() {
        for g in 0..GPUS {
            let slots = g * per_gpu..(g + 1) * per_gpu;
            let mut arrived = count(new[l][slots.clone()].iter().copied());
            for (e, n) in count(previous[l][slots].iter().copied()) {
                if let Some(a) = arrived.get_mut(&e) {
                    *a = a.saturating_sub(n);
                }
            }
            arrived.retain(|_, n| *n > 0);
            let moved = count(
                moves
                    .iter()
                    .filter(|m| field(m, "layer") == l && field(m, "dst_gpu") == g)
                    .map(|m| field(m, "expert") as i64),
            );
            assert_eq!(arrived, moved, "layer {l} GPU {g}: new replicas vs moves");
        }
    }
    let rounds = doc["rounds"].as_array().expect("`rounds` with --previous");
    let mut seen = vec![0; moves.len()];
    for r in rounds {
        let ids: Vec<usize> = r["moves"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as usize)
            .collect();
        let inter = ids
            .iter()
            .filter(|&&i| moves[i]["inter_node"] == true)
            .count();
        let intra = ids.len() - inter;
        assert_eq!(field(r, "inter_node"), inter, "{r}");
        assert_eq!(field(r, "intra_node"), intra, "{r}");
        assert_eq!(
            r["inter_node_bytes"].as_u64(),
            Some(inter as u64 * expert_bytes),
            "{r}"
        );
        assert_eq!(
            r["intra_node_bytes"].as_u64(),
            Some(intra as u64 * expert_bytes),
            "{r}"
        );
        for i in ids {
            seen[i] += 1;
        }
    }
    assert!(
        seen.iter().all(|&n| n == 1),
        "every move in exactly one round: {seen:?}"
    );
    moves.len()
}

#[test]
fn a_load_shift_gives_moves_that_connect_the_two_placements() {
    let dir = TempDir::new("eplb-prev-shift");
    let loads = dir.write("loads.csv", LOADS);
    let shifted = dir.write("shifted.csv", SHIFTED);
    for policy in ["deepseek", "improved"] {
        let before = plan(&loads, &["--policy", policy]);
        let previous = dir.write(&format!("{policy}.json"), before.to_string());
        let after = plan(
            &shifted,
            &[
                "--policy",
                policy,
                "--previous",
                s(&previous),
                "--expert-bytes",
                "1000",
            ],
        );
        let n = check_moves(&phy2log(&before), &after, 1000);
        assert!(
            n > 0,
            "{policy}: swapping the layers' loads should move experts"
        );
    }
}

#[test]
fn an_unchanged_load_needs_no_moves() {
    let dir = TempDir::new("eplb-prev-same");
    let loads = dir.write("loads.csv", LOADS);
    for policy in ["deepseek", "improved"] {
        let before = plan(&loads, &["--policy", policy]);
        let previous = dir.write(&format!("{policy}.json"), before.to_string());
        let again = plan(&loads, &["--policy", policy, "--previous", s(&previous)]);
        assert_eq!(
            again["moves"],
            Value::Array(vec![]),
            "{policy}: {}",
            again["moves"]
        );
        assert_eq!(again["phy2log"], before["phy2log"], "{policy}");
    }
}

#[test]
fn the_improved_policy_moves_no_more_than_a_fresh_plan() {
    let dir = TempDir::new("eplb-prev-fewer");
    let loads = dir.write("loads.csv", LOADS);
    let shifted = dir.write("shifted.csv", SHIFTED);
    let previous = dir.write("prev.json", plan(&loads, &[]).to_string());
    let moves = |policy: &str| {
        plan(&shifted, &["--policy", policy, "--previous", s(&previous)])["moves"]
            .as_array()
            .unwrap()
            .len()
    };
    let (fresh, improved) = (moves("deepseek"), moves("improved"));
    assert!(
        improved <= fresh,
        "improved {improved} moves, deepseek {fresh}"
    );
}

#[test]
fn a_bare_phy2log_matrix_works_as_the_previous_placement() {
    let dir = TempDir::new("eplb-prev-bare");
    let loads = dir.write("loads.csv", LOADS);
    let shifted = dir.write("shifted.csv", SHIFTED);
    let before = plan(&loads, &[]);
    let full = dir.write("full.json", before.to_string());
    let bare = dir.write("bare.json", before["phy2log"].to_string());
    for policy in ["deepseek", "improved"] {
        assert_eq!(
            plan(&shifted, &["--policy", policy, "--previous", s(&full)]),
            plan(&shifted, &["--policy", policy, "--previous", s(&bare)]),
            "{policy}"
        );
    }
}

#[test]
fn the_table_summarises_the_moves() {
    let dir = TempDir::new("eplb-prev-table");
    let loads = dir.write("loads.csv", LOADS);
    let previous = dir.write("prev.json", plan(&loads, &[]).to_string());
    let shifted = dir.write("shifted.csv", SHIFTED);
    let run = eplb(&shifted, &["--previous", s(&previous)]);
    run.ok();
    assert!(run.stdout.contains("moves"), "{}", run.stdout);
}

#[test]
fn bad_previous_placements_and_options_are_one_line_usage_errors() {
    let dir = TempDir::new("eplb-prev-bad");
    let loads = dir.write("loads.csv", LOADS);
    let good: Value = plan(&loads, &[]);
    let mut rows = phy2log(&good);
    let with =
        |rows: &[Vec<i64>], name: &str| dir.write(name, serde_json::to_string(rows).unwrap());
    let one_layer = with(&rows[..1], "one-layer.json");
    rows[0][0] = 99;
    let unknown_expert = with(&rows, "unknown.json");
    rows[0] = vec![0; REPLICAS];
    let missing_expert = with(&rows, "missing-expert.json");
    let previous = dir.write("prev.json", good.to_string());

    eplb(&loads, &["--previous", s(&dir.join("nope.json"))]).usage_error(&["nope.json"]);
    eplb(
        &loads,
        &["--previous", s(&dir.write("broken.json", "[[1,2"))],
    )
    .usage_error(&["broken.json", "previous"]);
    eplb(&loads, &["--previous", s(&one_layer)]).usage_error(&["previous", "layers"]);
    eplb(&loads, &["--previous", s(&unknown_expert)]).usage_error(&["previous", "99"]);
    eplb(&loads, &["--previous", s(&missing_expert)]).usage_error(&["previous", "expert 1"]);
    dualpipe([
        "eplb",
        "--loads",
        s(&loads),
        "--replicas",
        "24",
        "--groups",
        "4",
        "--nodes",
        "2",
        "--gpus",
        "8",
        "--previous",
        s(&previous),
    ])
    .usage_error(&["previous", "24"]);
    // Improved-policy options without the improved policy.
    eplb(&loads, &["--policy", "deepseek", "--tolerance", "0.1"]).usage_error(&["--tolerance"]);
    let improved = ["--policy", "improved", "--previous", s(&previous)];
    let with_flag = |flag: &str, value: &str| {
        let mut v = improved.to_vec();
        v.extend_from_slice(&[flag, value]);
        eplb(&loads, &v)
    };
    with_flag("--tolerance", "nan").usage_error(&["tolerance"]);
    with_flag("--min-imbalance", "0.5").usage_error(&["min-imbalance", "0.5"]);
    with_flag("--tolerance", "-1").flag_error(&["-1"]);
    with_flag("--expert-bytes", "many").flag_error(&["--expert-bytes", "many"]);
    eplb(&loads, &["--policy", "best"]).flag_error(&["best", "--policy"]);
}

#[test]
fn tolerance_bounds_each_layer_against_a_fresh_plan() {
    let dir = TempDir::new("eplb-prev-tolerance");
    let loads = dir.write("loads.csv", LOADS);
    let shifted = dir.write("shifted.csv", SHIFTED);
    let before = plan(&loads, &[]);
    let previous = dir.write("prev.json", before.to_string());
    let fresh = plan(&shifted, &["--policy", "improved"]);
    let max_loads = |doc: &Value| -> Vec<f64> {
        doc["stats"]["after"]["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["max_load"].as_f64().unwrap())
            .collect()
    };
    let mut moves = Vec::new();
    for tolerance in ["0", "0.1", "0.5", "10"] {
        let doc = plan(
            &shifted,
            &[
                "--policy",
                "improved",
                "--previous",
                s(&previous),
                "--tolerance",
                tolerance,
            ],
        );
        check_moves(&phy2log(&before), &doc, 0);
        let t: f64 = tolerance.parse().unwrap();
        for (l, (kept, best)) in max_loads(&doc).iter().zip(max_loads(&fresh)).enumerate() {
            assert!(
                *kept <= (1.0 + t) * best * (1.0 + 1e-12),
                "--tolerance {t}, layer {l}: hottest GPU {kept}, fresh plan {best}"
            );
        }
        moves.push(doc["moves"].as_array().unwrap().len());
    }
    assert!(
        moves[3] <= moves[0],
        "a looser tolerance should not move more: {moves:?}"
    );
}

#[test]
fn min_imbalance_leaves_balanced_enough_layers_alone() {
    let dir = TempDir::new("eplb-prev-min-imbalance");
    let loads = dir.write("loads.csv", LOADS);
    let shifted = dir.write("shifted.csv", SHIFTED);
    let before = plan(&loads, &[]);
    let previous = dir.write("prev.json", before.to_string());
    let doc = plan(
        &shifted,
        &[
            "--policy",
            "improved",
            "--previous",
            s(&previous),
            "--min-imbalance",
            "1000",
        ],
    );
    assert_eq!(doc["moves"], Value::Array(vec![]), "{}", doc["moves"]);
    assert_eq!(doc["phy2log"], before["phy2log"]);
}

#[test]
fn same_input_and_previous_give_the_same_bytes() {
    let dir = TempDir::new("eplb-prev-determinism");
    let loads = dir.write("loads.csv", LOADS);
    let shifted = dir.write("shifted.csv", SHIFTED);
    let previous = dir.write("prev.json", plan(&loads, &[]).to_string());
    for format in ["json", "table"] {
        let flags = [
            "--policy",
            "improved",
            "--previous",
            s(&previous),
            "--format",
            format,
        ];
        let (a, b) = (eplb(&shifted, &flags), eplb(&shifted, &flags));
        assert_eq!(a.ok().stdout, b.ok().stdout, "{format}");
    }
}

#[test]
fn a_huge_expert_size_is_not_a_panic() {
    // Bytes per round add up move sizes; u64::MAX bytes per expert must either saturate (or
    // be reported) or be refused as a usage error naming the flag, never overflow and panic.
    let dir = TempDir::new("eplb-prev-bytes");
    let loads = dir.write("loads.csv", LOADS);
    let shifted = dir.write("shifted.csv", SHIFTED);
    let previous = dir.write("prev.json", plan(&loads, &[]).to_string());
    let max = u64::MAX.to_string();
    let run = eplb(
        &shifted,
        &[
            "--previous",
            s(&previous),
            "--expert-bytes",
            &max,
            "--format",
            "json",
        ],
    );
    run.no_panic();
    match run.code {
        Some(0) => {
            run.json();
        }
        Some(2) => {
            run.usage_error(&["--expert-bytes"]);
        }
        other => panic!("exit code {other:?}: {}", run.stderr),
    }
}
