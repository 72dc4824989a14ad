//! `dualpipe plan`: plans on a heterogeneous topology, JSON that `--previous` reads back, and
//! one-line errors with exit code 2 on bad files.

use std::path::PathBuf;

use crate::{dualpipe, TempDir};

fn data(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/plan");
    root.join(name).display().to_string()
}

#[test]
fn the_plan_gives_fast_devices_more_layers_and_beats_the_even_split() {
    let args = |extra: &[&str]| {
        let mut a = vec![
            "plan".to_string(),
            "--topology".into(),
            data("hetero.json"),
            "--profile".into(),
            data("gpt32.json"),
            "--schedules".into(),
            "1f1b,dualpipe".into(),
            "--micro-batches".into(),
            "16".into(),
            "--format".into(),
            "json".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let planned = dualpipe(args(&[]));
    planned.ok();
    let even = dualpipe(args(&["--even"]));
    even.ok();
    let p = planned.json();
    let e = even.json();
    let best = &p["plans"][0];
    let best_even = &e["plans"][0];
    assert!(
        best["step_time"].as_f64().unwrap() < 0.9 * best_even["step_time"].as_f64().unwrap(),
        "planned {} vs even {}",
        best["step_time"],
        best_even["step_time"]
    );
    for rank in best["placement"].as_array().unwrap() {
        let layers = rank["layers"].as_array().unwrap().len();
        let speed = rank["speed"].as_f64().unwrap();
        let copies = rank["stages"].as_array().unwrap().len();
        if best["schedule"] == "1f1b" {
            assert_eq!(copies, 1);
            // 32 layers on 4 devices of speed 1 and 4 of speed 0.5: the best bottleneck is 6
            // layer-times (5 or 6 layers on a fast device, 3 or 2 on a slow one); the even
            // split's slow devices take 8.
            assert!(layers as f64 / speed <= 6.0, "{rank}");
        }
    }
    // The table prints the same best plan.
    let table = dualpipe([
        "plan",
        "--topology",
        &data("hetero.json"),
        "--profile",
        &data("gpt32.json"),
        "--top",
        "2",
    ]);
    table.ok();
    assert!(table.stdout.contains("best: "), "{}", table.stdout);
    assert!(table.stdout.contains("dc0/fast/gpu0"), "{}", table.stdout);
}

#[test]
fn previous_plan_keeps_layers_when_a_node_is_gone() {
    let dir = TempDir::new("plan-previous");
    let before = dir.join("before.json");
    dualpipe([
        "plan",
        "--topology",
        &data("hetero.json"),
        "--profile",
        &data("gpt32.json"),
        "--schedules",
        "1f1b",
        "--micro-batches",
        "16",
        "--format",
        "json",
        "--output",
        before.to_str().unwrap(),
    ])
    .ok();
    let shrunk = |previous: Option<&str>| {
        let mut a = vec![
            "plan".to_string(),
            "--topology".into(),
            data("hetero-shrunk.json"),
            "--profile".into(),
            data("gpt32.json"),
            "--schedules".into(),
            "1f1b".into(),
            "--micro-batches".into(),
            "16".into(),
            "--format".into(),
            "json".into(),
        ];
        if let Some(p) = previous {
            a.push("--previous".into());
            a.push(p.into());
        }
        let run = dualpipe(a);
        run.ok();
        run.json()["plans"][0].clone()
    };
    let kept = shrunk(Some(before.to_str().unwrap()));
    let fresh = shrunk(None);
    let moves = kept["layer_moves"].as_u64().expect("moves are reported");
    assert!(moves < 32, "{kept}");
    assert!(fresh.get("layer_moves").is_none());
    // The same step time as a fresh plan: keeping layers costs no speed here.
    let (a, b) = (
        kept["step_time"].as_f64().unwrap(),
        fresh["step_time"].as_f64().unwrap(),
    );
    assert!((a - b).abs() <= 1e-9 * b, "{a} vs {b}");
}

#[test]
fn bad_files_are_one_line_errors() {
    let dir = TempDir::new("plan-bad");
    let topo = dir.join("topo.json");
    let text = std::fs::read_to_string(data("hetero.json"))
        .unwrap()
        .replacen("\"speed\": 1.0", "\"speed\": -1.0", 1);
    std::fs::write(&topo, text).unwrap();
    dualpipe([
        "plan",
        "--topology",
        topo.to_str().unwrap(),
        "--profile",
        &data("gpt32.json"),
    ])
    .usage_error(&["--topology", "devices[0].speed = -1", "relative speed from"]);
    let profile = dir.join("profile.json");
    std::fs::write(&profile, r#"{"message_bytes": 1, "layers": [{"f": 1}]}"#).unwrap();
    dualpipe([
        "plan",
        "--topology",
        &data("hetero.json"),
        "--profile",
        profile.to_str().unwrap(),
    ])
    .usage_error(&["--profile", "missing field", "docs/planning.md"]);
    dualpipe([
        "plan",
        "--topology",
        dir.join("absent.json").to_str().unwrap(),
        "--profile",
        &data("gpt32.json"),
    ])
    .usage_error(&["--topology", "cannot read"]);
    // Too few layers for the stages.
    std::fs::write(
        &profile,
        r#"{"message_bytes": 1, "layers": [{"f": 1, "i": 1, "w": 1, "activation_bytes": 1, "parameter_bytes": 1}]}"#,
    )
    .unwrap();
    dualpipe([
        "plan",
        "--topology",
        &data("hetero.json"),
        "--profile",
        profile.to_str().unwrap(),
        "--schedules",
        "1f1b",
    ])
    .usage_error(&["no plan fits", "1 layers"]);
    dualpipe([
        "plan",
        "--topology",
        &data("hetero.json"),
        "--profile",
        &data("gpt32.json"),
        "--previous",
        profile.to_str().unwrap(),
    ])
    .usage_error(&["--previous", "not a plan"]);
}
