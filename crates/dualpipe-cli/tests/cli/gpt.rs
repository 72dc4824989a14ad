//! `dualpipe eval` and `dualpipe generate` on a seeded random GPT weights file written by the
//! library: the loss against an independent computation, determinism, bad inputs.

use dualpipe_nn::gpt::eval::{evaluate, generate, Sampling};
use dualpipe_nn::gpt::{DType, GptConfig, GptStage, GptWeights};

use crate::{dualpipe, s, TempDir};

fn weights(dir: &TempDir) -> (std::path::PathBuf, GptWeights) {
    let config = GptConfig {
        d_model: 16,
        heads: 2,
        layers: 2,
        seq_len: 8,
        dtype: DType::F64,
        moe: None,
    };
    let w = GptWeights::random(&config, 3).unwrap();
    (
        dir.write("model.safetensors", w.to_safetensors().unwrap()),
        w,
    )
}

const TEXT: &[u8] =
    b"To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n";

#[test]
fn eval_reports_the_library_loss() {
    let dir = TempDir::new("gpt-eval");
    let (path, w) = weights(&dir);
    let data = dir.write("text.txt", TEXT);
    let run = dualpipe([
        "eval",
        "--weights",
        s(&path),
        "--data",
        s(&data),
        "--seq-len",
        "6",
        "--dtype",
        "f64",
        "--format",
        "json",
    ]);
    run.ok();
    let doc = run.json();
    let want = evaluate(&GptStage::whole(&w).unwrap(), TEXT, 6).unwrap();
    let loss = doc["loss"].as_f64().unwrap();
    assert!(
        (loss - want.loss).abs() <= 1e-12 * want.loss,
        "{loss} vs {}",
        want.loss
    );
    // A random byte model is close to uniform: ln 256 ≈ 5.545 nats.
    assert!((loss - 256f64.ln()).abs() < 0.5, "{loss}");
    let bpb = doc["bits_per_byte"].as_f64().unwrap();
    assert!((bpb - loss / std::f64::consts::LN_2).abs() < 1e-12);
    assert_eq!(doc["windows"], TEXT.len() / 7);
    let table = dualpipe(["eval", "--weights", s(&path), "--data", s(&data)]);
    table.ok();
    assert!(table.stdout.contains("bits_per_byte"), "{}", table.stdout);
}

#[test]
fn generate_is_greedy_at_zero_and_seeded_above() {
    let dir = TempDir::new("gpt-generate");
    let (path, w) = weights(&dir);
    let args = |t: &str, seed: &str| {
        dualpipe([
            "generate",
            "--weights",
            s(&path),
            "--prompt",
            "To be",
            "--max-tokens",
            "12",
            "--temperature",
            t,
            "--seed",
            seed,
            "--dtype",
            "f64",
        ])
    };
    let greedy = args("0", "1");
    greedy.ok();
    let want = generate(
        &GptStage::whole(&w).unwrap(),
        b"To be",
        Sampling {
            max_tokens: 12,
            temperature: 0.0,
            seed: 1,
            stop: None,
        },
    )
    .unwrap();
    let mut expected = b"To be".to_vec();
    expected.extend(want);
    expected.push(b'\n');
    assert_eq!(greedy.stdout_bytes, expected, "the model's bytes, exactly");
    assert_eq!(
        args("0", "2").stdout_bytes,
        greedy.stdout_bytes,
        "greedy ignores the seed"
    );
    let a = args("1.0", "5");
    a.ok();
    assert_eq!(
        args("1.0", "5").stdout_bytes,
        a.stdout_bytes,
        "sampling is seeded"
    );
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let dir = TempDir::new("gpt-bad");
    let (path, _) = weights(&dir);
    let data = dir.write("text.txt", TEXT);
    let junk = dir.write("junk.safetensors", b"not a weights file");
    dualpipe(["eval", "--weights", s(&junk), "--data", s(&data)])
        .usage_error(&["junk.safetensors", "safetensors"]);
    dualpipe([
        "eval",
        "--weights",
        s(&dir.join("missing")),
        "--data",
        s(&data),
    ])
    .usage_error(&["cannot read", "--weights"]);
    dualpipe([
        "eval",
        "--weights",
        s(&path),
        "--data",
        s(&data),
        "--seq-len",
        "64",
    ])
    .usage_error(&["--seq-len", "64"]);
    let tiny = dir.write("tiny.txt", b"abc");
    dualpipe(["eval", "--weights", s(&path), "--data", s(&tiny)]).usage_error(&["3 bytes"]);
    dualpipe(["generate", "--weights", s(&path), "--prompt", ""]).usage_error(&["--prompt"]);
    dualpipe([
        "generate",
        "--weights",
        s(&path),
        "--prompt",
        "a",
        "--temperature=-1",
    ])
    .usage_error(&["--temperature"]);
    dualpipe([
        "generate",
        "--weights",
        s(&path),
        "--prompt",
        "a",
        "--dtype",
        "f8",
    ])
    .usage_error(&["--dtype", "bf16"]);
}
