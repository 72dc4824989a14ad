//! `dualpipe train --model gpt` (the default): tiny runs, the JSON members of the model issue,
//! `--save` / `--init-from` / `eval` agreeing on the documented window order, and flag errors.

use serde_json::Value;

use crate::{dualpipe, s, TempDir};

/// A tiny GPT (width 16, 2 heads, sequences of 8 bytes, 2 ranks of one block, 4 micro-batches
/// of 2 sequences); a flag in `extra` replaces the same flag here.
const TINY: [(&str, &str); 9] = [
    ("--d-model", "16"),
    ("--heads", "2"),
    ("--seq-len", "8"),
    ("--ranks", "2"),
    ("--micro-batches", "4"),
    ("--micro-batch-size", "2"),
    ("--layers-per-stage", "1"),
    ("--steps", "2"),
    ("--eval-every", "1"),
];

fn train(extra: &[&str]) -> crate::Run {
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
fn json_has_the_model_members() {
    let doc = train_json(&[]);
    assert_eq!(doc["model"], "gpt");
    assert_eq!(doc["d_model"], 16);
    assert_eq!(doc["data"], "the markov task");
    assert_eq!(doc["evaluations"].as_array().unwrap().len(), 2);
    let eval_loss = doc["eval_loss"].as_f64().unwrap();
    let best = doc["best_loss"].as_f64().unwrap();
    assert!(eval_loss > best && best > 0.5, "{eval_loss} {best}");
    assert!(doc["accuracy"].is_null());
    assert!(doc["tokens_per_second"].as_f64().unwrap() > 0.0);
    assert_eq!(doc["samples"].as_array().unwrap().len(), 4);
    let addition = train_json(&["--task", "addition", "--steps", "1"]);
    let accuracy = addition["accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&accuracy), "{accuracy}");
    assert!(addition["best_loss"].is_null());
}

#[test]
fn table_shows_validation_and_samples() {
    let run = train(&[]);
    run.ok();
    for needle in [
        "gpt (d_model 16",
        "validation",
        "gap",
        "samples",
        "tokens/s",
    ] {
        assert!(run.stdout.contains(needle), "{needle}:\n{}", run.stdout);
    }
}

/// Bytes of exactly `windows` windows of 9 bytes (seq 8), in a fixed pseudo-random text.
fn text(windows: usize) -> Vec<u8> {
    let words = [
        "the ", "pipe ", "dual ", "stage ", "of ", "a ", "rank ", "moves ",
    ];
    let mut out = Vec::new();
    let mut i = 7usize;
    while out.len() < windows * 9 {
        out.extend_from_slice(words[i % words.len()].as_bytes());
        i = i.wrapping_mul(31).wrapping_add(11) % 1009;
    }
    out.truncate(windows * 9);
    out
}

#[test]
fn saved_weights_resume_and_evaluate_on_the_documented_windows() {
    let dir = TempDir::new("gpt-save");
    // 4 micro-batches of 2 sequences: step 1 reads exactly the file's 8 windows, in order.
    let data = dir.write("text.txt", text(8));
    let saved = dir.join("w.safetensors");
    let common = [
        "--data",
        s(&data),
        "--validation-fraction",
        "0",
        "--shuffle",
        "false",
        "--dtype",
        "f64",
        "--optimizer",
        "sgd",
        "--momentum",
        "0",
    ];
    let mut first = common.to_vec();
    first.extend(["--save", s(&saved)]);
    let doc = train_json(&first);
    assert!(doc["eval_loss"].is_null(), "no validation part");
    assert!(saved.exists());
    // eval over the file = the mean of its windows' losses = step 1's loss from the weights.
    let eval = dualpipe([
        "eval",
        "--weights",
        s(&saved),
        "--data",
        s(&data),
        "--seq-len",
        "8",
        "--dtype",
        "f64",
        "--format",
        "json",
    ]);
    eval.ok();
    let eval_loss = eval.json()["loss"].as_f64().unwrap();
    let mut resumed = common.to_vec();
    resumed.extend(["--init-from", s(&saved), "--steps", "1"]);
    // The architecture comes from the file: drop the tiny model's shape flags.
    let run = dualpipe(
        ["train", "--format", "json", "--quiet"]
            .into_iter()
            .chain(resumed.iter().copied())
            .chain([
                "--ranks",
                "2",
                "--micro-batches",
                "4",
                "--micro-batch-size",
                "2",
            ]),
    );
    run.ok();
    let loss = run.json()["losses"][0].as_f64().unwrap();
    assert!(
        (loss - eval_loss).abs() <= 1e-12 * eval_loss,
        "{loss} vs {eval_loss}"
    );
    // The file's architecture is taken; a flag that disagrees names both values.
    let mut clash = resumed.clone();
    clash.extend(["--d-model", "32"]);
    train(&clash).usage_error(&["--d-model", "32", "16"]);
    // So does a partition of another number of blocks.
    dualpipe(
        ["train"]
            .into_iter()
            .chain(resumed.iter().copied())
            .chain(["--ranks", "2", "--partition", "1,1,1"]),
    )
    .usage_error(&[
        "the partition 1,1,1 holds 3 blocks but the weights file has layers = 2; give a partition of 2 blocks",
    ]);
}

#[test]
fn bad_model_flags_are_usage_errors() {
    let dir = TempDir::new("gpt-bad");
    let missing = dir.join("missing.txt");
    train(&["--data", s(&missing)]).usage_error(&["missing.txt"]);
    let short = dir.write("short.txt", b"abc");
    train(&["--data", s(&short)]).usage_error(&["short.txt", "--seq-len"]);
    train(&["--heads", "3"]).usage_error(&["--heads", "--d-model"]);
    dualpipe(["train", "--model", "mlp", "--data", s(&short)])
        .usage_error(&["--data", "--model gpt"]);
    train(&["--task", "poetry"]).usage_error(&["--task", "poetry"]);
    train(&["--clip-grad", "-1"]).usage_error(&["--clip-grad"]);
    train(&["--lr-decay", "linear"]).usage_error(&["--lr-decay", "linear", "cosine"]);
    train(&["--lr-min", "0.0001"]).usage_error(&["--lr-min", "--lr-decay cosine"]);
    train(&["--lr-decay", "cosine", "--lr-min", "0.1"]).usage_error(&["--lr-min", "--lr 0.003"]);
    train(&["--lr-warmup", "2000000000"]).usage_error(&["--lr-warmup 2000000000"]);
    let not_weights = dir.write("w.safetensors", b"not safetensors");
    train(&["--init-from", s(&not_weights)]).usage_error(&["--init-from", "w.safetensors"]);
}
