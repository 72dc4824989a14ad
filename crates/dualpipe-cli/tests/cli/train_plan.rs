//! `dualpipe train --profile`, `--plan`, `--partition`, `--slow-rank` and
//! `--rebalance-stages`: a measured profile that `dualpipe plan` accepts, its plan trained end to
//! end, a resume on the shape of a re-plan after a device is gone, and one-line errors.

use std::path::Path;

use serde_json::Value;

use crate::{dualpipe, TempDir};

/// A small GPT in f64, quiet, JSON summary.
fn gpt(extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "train",
        "--format",
        "json",
        "--quiet",
        "--dtype",
        "f64",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--seq-len",
        "8",
        "--micro-batch-size",
        "2",
        "--eval-every",
        "0",
        "--seed",
        "3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn losses(v: &Value) -> Vec<f64> {
    v["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// `dualpipe plan` of 1F1B with 8 micro-batches on `topo` and `profile` (plus `extra`), its
/// JSON written to `out` and returned.
fn plan_1f1b(topo: &str, profile: &Path, extra: &[&str], out: &Path) -> Value {
    let mut args = vec!["plan", "--topology", topo, "--profile", s(profile)];
    args.extend(["--schedules", "1f1b", "--micro-batches", "8"]);
    args.extend(extra);
    args.extend(["--format", "json", "--output", s(out)]);
    dualpipe(args).ok();
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

/// `devices` devices in one node; device `slow` (if any) at speed 0.5.
fn topology(dir: &TempDir, name: &str, devices: usize, slow: Option<usize>) -> String {
    topology_with_memory(dir, name, devices, slow, 1e10)
}

/// As [`topology`], each device with `memory` bytes.
fn topology_with_memory(
    dir: &TempDir,
    name: &str,
    devices: usize,
    slow: Option<usize>,
    memory: f64,
) -> String {
    let list: Vec<String> = (0..devices)
        .map(|d| {
            let speed = if Some(d) == slow { 0.5 } else { 1.0 };
            format!(r#"{{"name": "gpu{d}", "speed": {speed}, "memory": {memory:e}}}"#)
        })
        .collect();
    let text = format!(
        r#"{{"links": {{"intra_node": {{"latency": 1e-6, "bandwidth": 1e10}},
            "inter_node": {{"latency": 1e-5, "bandwidth": 1e9}},
            "inter_datacenter": {{"latency": 0.1, "bandwidth": 1e8}}}},
          "datacenters": [{{"name": "dc", "nodes": [{{"name": "n", "devices": [{}]}}]}}]}}"#,
        list.join(",")
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn a_measured_profile_plans_and_its_plan_trains() {
    let dir = TempDir::new("train-plan");
    let profile = dir.join("profile.json");
    dualpipe(gpt(&[
        "--ranks",
        "4",
        "--layers-per-stage",
        "2",
        "--profile",
        s(&profile),
    ]))
    .ok();
    let p: Value = serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    let layers = p["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 8);
    for l in layers {
        for key in ["f", "i", "w", "activation_bytes", "parameter_bytes"] {
            assert!(l[key].as_f64().unwrap() > 0.0, "{key}: {l}");
        }
    }
    assert_eq!(p["message_bytes"], 2 * 8 * 16 * 8);
    let topo = topology(&dir, "topo.json", 4, Some(1));
    let plan = dir.join("plan.json");
    let doc = plan_1f1b(&topo, &profile, &[], &plan);
    let stages: Vec<usize> = doc["plans"][0]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| {
            (st["end_layer"].as_u64().unwrap() - st["first_layer"].as_u64().unwrap()) as usize
        })
        .collect();
    assert_eq!(stages.iter().sum::<usize>(), 8);
    let partition = stages
        .iter()
        .map(|b| b.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let planned = dualpipe(gpt(&["--plan", s(&plan), "--steps", "2"]));
    planned.ok();
    let planned = planned.json();
    assert_eq!(planned["schedule"], "1f1b");
    assert_eq!(planned["micro_batches"], 8);
    // The plan's partition, given by hand, and the even split train the same model.
    let by_hand = dualpipe(gpt(&[
        "--schedule",
        "1f1b",
        "--micro-batches",
        "8",
        "--partition",
        &partition,
        "--steps",
        "2",
    ]));
    by_hand.ok();
    let even = dualpipe(gpt(&[
        "--schedule",
        "1f1b",
        "--micro-batches",
        "8",
        "--steps",
        "2",
    ]));
    even.ok();
    let by_hand = by_hand.json();
    assert_eq!(losses(&planned), losses(&by_hand));
    assert_eq!(losses(&planned), losses(&even.json()));
    let split: Vec<Value> = stages.iter().map(|&b| Value::from(b)).collect();
    assert_eq!(by_hand["partition"], Value::Array(split));
    assert!(
        even.json().get("partition").is_none(),
        "an even split has none"
    );
    // A flag that disagrees with the plan names both values.
    dualpipe(gpt(&["--plan", s(&plan), "--micro-batches", "4"]))
        .usage_error(&["--micro-batches 4 disagrees with the plan's 8"]);
    dualpipe(gpt(&["--plan", s(&plan), "--schedule", "gpipe"]))
        .usage_error(&["--schedule gpipe disagrees with the plan's 1f1b"]);
    // A bad field of the plan file is named as such, not as a flag the user did not give.
    let text = std::fs::read_to_string(&plan).unwrap();
    for (from, to, want) in [
        (
            "\"micro_batches\": 8",
            "\"micro_batches\": 0",
            "plans[0].micro_batches: 0",
        ),
        (
            "\"virtual_stages\": 1",
            "\"virtual_stages\": 7",
            "plans[0].virtual_stages: 7",
        ),
    ] {
        let bad = dir.join("bad-plan.json");
        assert!(text.contains(from), "{text}");
        std::fs::write(&bad, text.replacen(from, to, 1)).unwrap();
        let run = dualpipe(gpt(&["--plan", s(&bad), "--steps", "2"]));
        run.usage_error(&[want]);
        assert!(!run.stderr.contains("--micro-batches"), "{}", run.stderr);
    }
    // The profile also plans dualpipe.
    dualpipe([
        "plan",
        "--topology",
        &topo,
        "--profile",
        s(&profile),
        "--schedules",
        "dualpipe",
        "--micro-batches",
        "8",
    ])
    .ok();
}

#[test]
fn a_plan_for_tight_memory_recomputes_and_trains_the_same_losses() {
    let dir = TempDir::new("train-plan-recompute");
    let profile = dir.join("profile.json");
    let shape = ["--schedule", "1f1b"];
    let mut args = shape.to_vec();
    args.extend(["--ranks", "4", "--layers-per-stage", "2"]);
    args.extend(["--profile", s(&profile), "--profile-repeats", "1"]);
    dualpipe(gpt(&args)).ok();
    let p: Value = serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    let field = |l: &Value, path: &[&str]| {
        path.iter()
            .fold(l, |v, k| &v[*k])
            .as_f64()
            .unwrap_or_else(|| panic!("{path:?} in {l}"))
    };
    let layers = p["layers"].as_array().unwrap();
    for l in layers {
        // Full recomputation keeps the block's input, selective also the attention's tensors;
        // between I and W a block keeps its linear layers' inputs and output gradients.
        let full = field(l, &["recompute", "full_bytes"]);
        let selective = field(l, &["recompute", "selective_bytes"]);
        let all = field(l, &["activation_bytes"]);
        assert!(0.0 < full && full < selective && selective < all, "{l}");
        assert!(field(l, &["w_bytes"]) > 0.0, "{l}");
        assert!(field(l, &["recompute", "selective_f"]) >= 0.0, "{l}");
    }
    // Devices that hold every stage's parameters and about 2.6 micro-batches of its
    // activations: the first rank of 1F1B keeps 4 in flight, so it must recompute.
    let stage =
        |k: usize, key: &str| field(&layers[2 * k], &[key]) + field(&layers[2 * k + 1], &[key]);
    let params = (0..4)
        .map(|k| stage(k, "parameter_bytes"))
        .fold(0.0, f64::max);
    let acts = (0..4)
        .map(|k| stage(k, "activation_bytes"))
        .fold(0.0, f64::max);
    let topo = topology_with_memory(&dir, "tight.json", 4, None, params + 2.6 * acts);
    let plan = dir.join("plan.json");
    let doc = plan_1f1b(&topo, &profile, &["--even"], &plan);
    let best = &doc["plans"][0];
    let modes: Vec<&str> = best["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| st["recompute"].as_str().unwrap_or("none"))
        .collect();
    assert_ne!(modes[0], "none", "{best}");
    for rank in best["placement"].as_array().unwrap() {
        assert!(
            field(rank, &["memory"]) <= field(rank, &["memory_capacity"]),
            "{rank}"
        );
    }
    // Recomputation changes no number: the planned run's f64 losses are the saving run's.
    let mut planned = shape.to_vec();
    planned.extend(["--plan", s(&plan), "--steps", "2"]);
    let planned = dualpipe(gpt(&planned));
    planned.ok();
    let mut saving = shape.to_vec();
    saving.extend(["--micro-batches", "8", "--steps", "2"]);
    let saving = dualpipe(gpt(&saving));
    saving.ok();
    let planned = planned.json();
    assert_eq!(losses(&planned), losses(&saving.json()));
    let ran = planned["recompute"].as_str().unwrap_or("none");
    assert!(
        ran.starts_with(modes[0]),
        "{ran} against the plan's {modes:?}"
    );
}

#[test]
fn training_resumes_on_the_shape_of_a_replan_after_a_device_is_gone() {
    let dir = TempDir::new("train-replan");
    let profile = dir.join("profile.json");
    dualpipe(gpt(&[
        "--ranks",
        "4",
        "--layers-per-stage",
        "2",
        "--profile",
        s(&profile),
        "--profile-repeats",
        "1",
    ]))
    .ok();
    let plan = |topo: &str, out: &Path, previous: Option<&Path>| {
        let mut a = vec![
            "plan".to_string(),
            "--topology".into(),
            topo.into(),
            "--profile".into(),
            s(&profile).into(),
            "--schedules".into(),
            "1f1b".into(),
            "--micro-batches".into(),
            "8".into(),
            "--format".into(),
            "json".into(),
            "--output".into(),
            s(out).into(),
        ];
        if let Some(p) = previous {
            a.extend(["--previous".to_string(), s(p).into()]);
        }
        dualpipe(&a).ok();
    };
    let old = dir.join("old.json");
    let new = dir.join("new.json");
    plan(&topology(&dir, "four.json", 4, Some(1)), &old, None);
    plan(&topology(&dir, "three.json", 3, Some(1)), &new, Some(&old));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&new).unwrap()).unwrap();
    assert_eq!(doc["plans"][0]["ranks"], 3);
    let ckpt = dir.join("ckpt");
    let full = dualpipe(gpt(&[
        "--plan",
        s(&old),
        "--steps",
        "4",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "2",
    ]));
    full.ok();
    let full = losses(&full.json());
    let resumed = dualpipe(gpt(&[
        "--plan",
        s(&new),
        "--steps",
        "4",
        "--resume-from",
        s(&ckpt.join("step-000002")),
    ]));
    resumed.ok();
    let resumed = resumed.json();
    assert_eq!(resumed["ranks"], 3);
    assert_eq!(resumed["first_step"], 3);
    let again = losses(&resumed);
    assert_eq!(again.len(), 2);
    for (a, b) in again.iter().zip(&full[2..]) {
        assert!(
            (a - b).abs() <= 1e-10 * b.abs().max(1.0),
            "{again:?} vs {full:?}"
        );
    }
}

#[test]
fn a_slow_rank_rebalances_and_bad_layout_flags_are_one_line() {
    let still = dualpipe(gpt(&[
        "--schedule",
        "1f1b",
        "--micro-batches",
        "8",
        "--steps",
        "6",
    ]));
    still.ok();
    let moved = dualpipe(
        gpt(&[
            "--schedule",
            "1f1b",
            "--micro-batches",
            "8",
            "--steps",
            "6",
            "--slow-rank",
            "1:8",
            "--rebalance-stages",
            "--rebalance-window",
            "1",
        ])
        .into_iter()
        .filter(|a| a != "--quiet"),
    );
    moved.ok();
    assert_eq!(losses(&still.json()), losses(&moved.json()));
    assert!(
        moved.stderr.contains("rebalanced after step"),
        "{}",
        moved.stderr
    );
    dualpipe(gpt(&["--partition", "3,2"])).usage_error(&["--partition 3,2 lists 2 stages"]);
    dualpipe(gpt(&["--partition", "4,x,2,2"])).usage_error(&["--partition", "'x'"]);
    dualpipe(gpt(&["--partition", "8,0,0,0"])).usage_error(&["stage 1 holds no block"]);
    dualpipe(gpt(&["--slow-rank", "7:2"]))
        .usage_error(&["--slow-rank 7:2", "rank 7 does not exist"]);
    dualpipe(gpt(&["--slow-rank", "fast"])).usage_error(&["--slow-rank 'fast'", "RANK:FACTOR"]);
    dualpipe(gpt(&["--rebalance-stages", "--rebalance-threshold", "-1"]))
        .usage_error(&["--rebalance-threshold -1"]);
    dualpipe(gpt(&["--plan", "/nonexistent/plan.json"]))
        .usage_error(&["cannot read --plan", "No such file"]);
}
