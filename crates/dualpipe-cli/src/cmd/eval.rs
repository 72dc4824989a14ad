//! `dualpipe eval`: the mean next-token cross-entropy of a GPT weights file over a data file.

use std::path::{Path, PathBuf};

use dualpipe_nn::gpt::eval::evaluate;
use dualpipe_nn::gpt::{GptStage, GptWeights};
use dualpipe_nn::NnError;
use dualpipe_train::DType;

use super::output::{check_paths, write_output};
use super::simulate::Format;
use super::UsageError;

/// Flags of `dualpipe eval`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GPT weights: safetensors with the names and metadata of docs/models.md.
    #[arg(long, value_name = "FILE")]
    pub weights: PathBuf,
    /// Any file: its bytes are the tokens.
    #[arg(long, value_name = "FILE")]
    pub data: PathBuf,
    /// Tokens per window (windows are N+1 bytes) [default: the model's seq_len].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = super::count)]
    pub seq_len: Option<usize>,
    /// Element type of the computation: f32, f64, or mixed precision bf16 or f16 (f32
    /// weights, half-precision GEMMs).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Parses `--dtype`.
pub fn parse_dtype(name: &str) -> Result<DType, UsageError> {
    DType::from_name(name).ok_or_else(|| {
        UsageError(format!(
            "unknown dtype '{name}' (--dtype): use one of {}",
            DType::NAMES.join(", ")
        ))
    })
}

/// Reads `--data`: a regular file only (a FIFO or `/dev/zero` is refused before any read),
/// at most [`dualpipe_train::MAX_DATA_BYTES`].
fn read_data(path: &Path) -> Result<Vec<u8>, UsageError> {
    dualpipe_train::read_data(path).map_err(UsageError::from)
}

/// The message of a library error without the configuration-error prefix.
pub fn plain(e: NnError) -> String {
    match e {
        NnError::Config(msg) => msg,
        other => other.to_string(),
    }
}

/// Loads a whole model from a weights file.
pub fn load_model(path: &Path, dtype: DType) -> Result<GptStage, UsageError> {
    let bytes = dualpipe_train::read_weights_file(path)
        .map_err(|e| UsageError(format!("{} (--weights)", crate::parse::message(e))))?;
    let weights = GptWeights::from_safetensors(&bytes, dtype.candle())
        .map_err(|e| UsageError(format!("{} (--weights): {e}", path.display())))?;
    let mut model = GptStage::whole(&weights)
        .map_err(|e| UsageError(format!("{} (--weights): {}", path.display(), plain(e))))?;
    model
        .set_half(dtype.half())
        .map_err(|e| UsageError(format!("--dtype {dtype}: {}", plain(e))))?;
    Ok(model)
}

/// Runs `dualpipe eval`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let dtype = parse_dtype(&args.dtype)?;
    check_paths(
        &[
            ("--weights", Some(&args.weights)),
            ("--data", Some(&args.data)),
        ],
        ("--output", None),
        &[],
    )?;
    let model = load_model(&args.weights, dtype)?;
    let seq_len = args.seq_len.unwrap_or(model.config().seq_len);
    let bytes = read_data(&args.data)?;
    if seq_len == 0 || seq_len > model.config().seq_len {
        return Err(UsageError(format!(
            "--seq-len {seq_len} must be between 1 and the model's seq_len {}",
            model.config().seq_len
        ))
        .into());
    }
    let report = evaluate(&model, &bytes, seq_len)
        .map_err(|e| UsageError(format!("{} (--data): {}", args.data.display(), plain(e))))?;
    let text = match args.format {
        Format::Json => format!(
            "{}\n",
            serde_json::json!({
                "loss": report.loss,
                "bits_per_byte": report.bits_per_byte,
                "windows": report.windows,
                "tokens": report.tokens,
                "seq_len": seq_len,
            })
        ),
        Format::Table => format!(
            "loss           {:.6}\nbits_per_byte  {:.6}\nwindows        {} of {} bytes ({} tokens)\n",
            report.loss,
            report.bits_per_byte,
            report.windows,
            seq_len + 1,
            report.tokens
        ),
    };
    write_output(None, &text)
}
