//! `dualpipe train --experts E --top-k K`: the MoE GPT learns the default Markov task under
//! DualPipe, reports the router's load per step, writes and reads its weights, and refuses
//! flags that do not fit in one line.

use serde_json::Value;

use crate::{dualpipe, TempDir};

/// A small MoE GPT on DualPipe (2 ranks, 2 model stages of one block).
const MOE: [&str; 24] = [
    "train",
    "--experts",
    "4",
    "--top-k",
    "2",
    "--d-model",
    "16",
    "--heads",
    "2",
    "--seq-len",
    "8",
    "--ranks",
    "2",
    "--micro-batches",
    "4",
    "--micro-batch-size",
    "4",
    "--layers-per-stage",
    "1",
    "--format",
    "json",
    "--quiet",
    "--eval-every",
    "0",
];

fn moe_run(extra: &[&str]) -> Value {
    let mut args: Vec<&str> = MOE.to_vec();
    args.extend_from_slice(extra);
    let run = dualpipe(args);
    run.ok();
    run.json()
}

#[test]
fn moe_training_learns_and_reports_the_expert_load() {
    let doc = moe_run(&["--steps", "40", "--lr", "0.01"]);
    let losses: Vec<f64> = doc["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let head: f64 = losses[..5].iter().sum::<f64>() / 5.0;
    let tail: f64 = losses[35..].iter().sum::<f64>() / 5.0;
    assert!(tail < head - 0.5, "the loss falls: {head} -> {tail}");
    let loads = doc["expert_load_imbalance"].as_array().unwrap();
    assert_eq!(loads.len(), 40, "one record per step");
    for (i, load) in loads.iter().enumerate() {
        assert_eq!(load["step"], i);
        let layers = load["layers"].as_array().unwrap();
        assert_eq!(
            layers.len(),
            2,
            "every block is an MoE block (2 stages of one)"
        );
        let counts = load["counts"].as_array().unwrap();
        for c in counts {
            let c: Vec<u64> = c
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(c.len(), 4);
            // Dropless: 4 micro-batches of 4 sequences of 8 tokens, 2 experts each.
            assert_eq!(c.iter().sum::<u64>(), 4 * 4 * 8 * 2);
        }
        let ratio = load["max_over_mean"].as_f64().unwrap();
        assert!((1.0..=4.0).contains(&ratio), "{ratio}");
        assert!(layers.contains(&load["worst_layer"]));
    }
}

#[test]
fn dense_runs_have_no_expert_load() {
    let mut args: Vec<&str> = MOE.to_vec();
    args.drain(1..5);
    args.extend_from_slice(&["--steps", "1"]);
    let run = dualpipe(args);
    run.ok();
    assert!(run.json().get("expert_load_imbalance").is_none());
}

#[test]
fn moe_weights_round_trip_through_save_and_init_from() {
    let dir = TempDir::new("moe_save");
    let path = dir.path().join("moe.safetensors");
    let p = path.to_str().unwrap();
    let first = moe_run(&["--steps", "2", "--save", p, "--shared-experts", "1"]);
    assert!(first["final_loss"].as_f64().unwrap().is_finite());
    // The file fixes the experts; a disagreeing flag is one line naming both values.
    let again = moe_run(&["--steps", "1", "--init-from", p]);
    assert!(again["final_loss"].as_f64().unwrap().is_finite());
    let mut args: Vec<&str> = MOE.to_vec();
    args[2] = "8";
    args.extend_from_slice(&["--steps", "1", "--init-from", p]);
    let run = dualpipe(args);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("--experts is 8") && run.stderr.contains("experts = 4"),
        "{}",
        run.stderr
    );
}

#[test]
fn bad_moe_flags_are_one_line_errors() {
    for (extra, needle) in [
        (vec!["--experts", "4", "--top-k", "5"], "--top-k 5"),
        (vec!["--experts", "0"], "--experts is 0"),
        (vec!["--experts", "4", "--aux-loss", "-1"], "--aux-loss -1"),
        (
            vec![
                "--experts",
                "4",
                "--data-parallel",
                "2",
                "--eplb-every",
                "5",
            ],
            "add --expert-parallel",
        ),
        (
            vec![
                "--experts",
                "4",
                "--data-parallel",
                "2",
                "--expert-parallel",
                "--redundant-experts",
                "1",
            ],
            "multiple of 2",
        ),
        (
            vec![
                "--experts",
                "4",
                "--data-parallel",
                "2",
                "--link-latency",
                "0.001",
            ],
            "--link-latency is about the expert all-to-all; add --expert-parallel",
        ),
        (
            vec![
                "--experts",
                "4",
                "--data-parallel",
                "2",
                "--expert-parallel",
                "--link-bandwidth",
                "0",
            ],
            "--link-bandwidth 0: it must be a positive number",
        ),
    ] {
        let mut args: Vec<&str> = MOE.to_vec();
        args.drain(1..5);
        args.extend_from_slice(&extra);
        args.extend_from_slice(&["--steps", "1"]);
        let run = dualpipe(args);
        assert_eq!(run.code, Some(2), "{extra:?}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{extra:?}: {}", run.stderr);
        assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
    }
    let run = dualpipe(["train", "--top-k", "2", "--steps", "1"]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("add --experts"), "{}", run.stderr);
    let run = dualpipe(["train", "--model", "mlp", "--experts", "2", "--steps", "1"]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains("--experts applies to --model gpt"),
        "{}",
        run.stderr
    );
}

#[test]
fn expert_parallel_runs_report_the_load_per_worker_and_the_rebalances() {
    let doc = moe_run(&[
        "--steps",
        "4",
        "--data-parallel",
        "2",
        "--expert-parallel",
        "--redundant-experts",
        "2",
        "--eplb-every",
        "2",
    ]);
    assert_eq!(doc["eplb_rebalances"], 2);
    assert!(doc["experts_moved"].as_u64().is_some());
    assert!(doc["experts_moved_from_scratch"].as_u64().is_some());
    // The experts really travel: weights and optimizer state, only when one moved.
    let bytes = doc["expert_bytes_moved"].as_u64().unwrap();
    assert_eq!(
        bytes > 0,
        doc["experts_moved"].as_u64().unwrap() > 0,
        "{bytes}"
    );
    for load in doc["expert_load_imbalance"].as_array().unwrap() {
        let ratio = load["worker_max_over_mean"].as_f64().unwrap();
        assert!((1.0..=2.0).contains(&ratio), "{ratio}");
        for rows in load["worker_rows"].as_array().unwrap() {
            assert_eq!(rows.as_array().unwrap().len(), 2, "one entry per worker");
        }
    }
    // The emulated link and the FB pair's overlap change no loss.
    let link = ["--steps", "2", "--data-parallel", "2", "--expert-parallel"];
    let overlapped = moe_run(&[&link[..], &["--link-latency", "0.001"]].concat());
    let sequential =
        moe_run(&[&link[..], &["--link-latency", "0.001", "--no-moe-overlap"]].concat());
    assert_eq!(overlapped["losses"], sequential["losses"]);
    // The overlapped pairs really ran: their all-to-alls and token holds are counted, and
    // the sequential run has none (each run is its own process, so the tallies are its own).
    let count = |doc: &Value, what: &str| doc["expert_waits"][what]["count"].as_u64().unwrap();
    for what in [
        "pair_forward",
        "pair_backward",
        "token_held",
        "token_regain",
        "held_forward",
        "held_backward",
        "regain_forward",
        "regain_backward",
        "pair_forward_due",
        "pair_backward_due",
        "start_forward",
        "start_backward",
        "thread_start",
        "pair_span",
    ] {
        assert!(
            count(&overlapped, what) > 0,
            "{what}: {}",
            overlapped["expert_waits"]
        );
        assert_eq!(count(&sequential, what), 0, "{what}");
    }
    for what in ["forward", "backward", "forward_due", "backward_due"] {
        assert!(
            count(&sequential, what) > 0,
            "{what}: {}",
            sequential["expert_waits"]
        );
    }
    // Without expert parallelism the JSON has neither figure.
    let plain = moe_run(&["--steps", "1", "--data-parallel", "2"]);
    assert!(plain.get("eplb_rebalances").is_none());
    assert!(plain.get("expert_waits").is_none());
    assert!(plain["expert_load_imbalance"][0]
        .get("worker_rows")
        .is_none());
}
