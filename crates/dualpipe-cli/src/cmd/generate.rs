//! `dualpipe generate`: continue a prompt with a GPT weights file.

use std::path::PathBuf;

use dualpipe_nn::gpt::eval::{generate, Sampling};

use super::eval::{load_model, parse_dtype};
use super::output::{check_outputs, write_output};
use super::UsageError;

/// Flags of `dualpipe generate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GPT weights: safetensors with the names and metadata of docs/models.md.
    #[arg(long, value_name = "FILE")]
    pub weights: PathBuf,
    /// The text to continue (at least one byte).
    #[arg(long)]
    pub prompt: String,
    /// Bytes to generate.
    #[arg(long, default_value_t = 200)]
    pub max_tokens: usize,
    /// 0: greedy (the most likely byte); above: sample from softmax(logits / T).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Seed of the sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Element type of the computation: f32 or f64.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

/// Runs `dualpipe generate`: prints the prompt and its continuation (as lossy UTF-8).
pub fn run(args: Args) -> anyhow::Result<()> {
    let dtype = parse_dtype(&args.dtype)?;
    if args.prompt.is_empty() {
        return Err(UsageError("--prompt is empty: give at least one byte".into()).into());
    }
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        return Err(UsageError(format!(
            "--temperature {} must be a finite number ≥ 0",
            args.temperature
        ))
        .into());
    }
    check_outputs(None, &[])?;
    let model = load_model(&args.weights, dtype)?;
    let out = generate(
        &model,
        args.prompt.as_bytes(),
        Sampling {
            max_tokens: args.max_tokens,
            temperature: args.temperature,
            seed: args.seed,
            stop: None,
        },
    )?;
    // Bytes that are not UTF-8 (a byte model can produce any) print as U+FFFD.
    let text = format!("{}{}\n", args.prompt, String::from_utf8_lossy(&out));
    write_output(None, &text)?;
    Ok(())
}
