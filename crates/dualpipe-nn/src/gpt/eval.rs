//! Evaluation (mean next-token cross-entropy over a text) and generation (greedy or seeded
//! sampling) with a whole model.

use rand::Rng;

use super::data::{ByteWindows, Problem};
use super::{GptStage, VOCAB};
use crate::error::NnError;
use crate::layers::cross_entropy;
use crate::rng::{self, Purpose};
use crate::stage::to_f64_vec;

/// Windows evaluated per forward pass.
const EVAL_ROWS: usize = 16;

/// The loss of a model over a text.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalReport {
    /// Mean next-token cross-entropy in nats.
    pub loss: f64,
    /// The same in bits per byte (`loss / ln 2`).
    pub bits_per_byte: f64,
    /// Windows evaluated.
    pub windows: usize,
    /// Tokens scored (`windows · seq_len`).
    pub tokens: usize,
}

/// The mean next-token cross-entropy of `model` over `bytes`' consecutive non-overlapping
/// windows of `seq_len + 1` bytes (a last partial window dropped); `seq_len` at most the
/// model's.
pub fn evaluate(model: &GptStage, bytes: &[u8], seq_len: usize) -> Result<EvalReport, NnError> {
    if seq_len > model.config().seq_len {
        return Err(NnError::Config(format!(
            "`seq_len` {seq_len} is longer than the model's seq_len {}",
            model.config().seq_len
        )));
    }
    let windows = ByteWindows::new(bytes.into(), seq_len, "the data file")?;
    evaluate_windows(model, &windows)
}

/// [`evaluate`] over prepared windows.
pub fn evaluate_windows(model: &GptStage, windows: &ByteWindows) -> Result<EvalReport, NnError> {
    evaluate_spread(model, windows, usize::MAX)
}

/// [`evaluate_windows`] over at most `max_windows` of them, spread evenly (window
/// `⌊i · n / max_windows⌋` for `i` in `0..max_windows` when there are `n > max_windows`; all of
/// them, with the same figures as [`evaluate_windows`], otherwise).
pub fn evaluate_spread(
    model: &GptStage,
    windows: &ByteWindows,
    max_windows: usize,
) -> Result<EvalReport, NnError> {
    let all = windows.len();
    let n = all.min(max_windows.max(1));
    let pick = |i: usize| {
        if n == all {
            i
        } else {
            (i as u128 * all as u128 / n as u128) as usize
        }
    };
    let mut total = 0.0;
    for start in (0..n).step_by(EVAL_ROWS) {
        let idx: Vec<usize> = (start..(start + EVAL_ROWS).min(n)).map(pick).collect();
        let mb = windows.micro_batch(&idx);
        let logits = model.logits(&mb.inputs, mb.seq)?;
        let (loss, _) = cross_entropy(&logits, &mb.targets, 1.0)?;
        total += loss * idx.len() as f64;
    }
    let loss = total / n as f64;
    Ok(EvalReport {
        loss,
        bits_per_byte: loss / std::f64::consts::LN_2,
        windows: n,
        tokens: n * windows.seq_len(),
    })
}

/// How [`generate`] picks each next byte.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Bytes to generate at most.
    pub max_tokens: usize,
    /// 0: greedy (the most likely byte, the lowest on ties); above: sample from
    /// `softmax(logits / temperature)`.
    pub temperature: f64,
    /// Seed of the sampling stream.
    pub seed: u64,
    /// Stop after generating this byte (it is included).
    pub stop: Option<u8>,
}

/// Continues `prompt` (at least one byte) by up to `sampling.max_tokens` bytes; the context is
/// the last `seq_len` bytes.
pub fn generate(model: &GptStage, prompt: &[u8], sampling: Sampling) -> Result<Vec<u8>, NnError> {
    let mut out = Vec::new();
    generate_each(model, prompt, sampling, |byte| {
        out.push(byte);
        true
    })?;
    Ok(out)
}

/// [`generate`], handing each byte to `each` as soon as it is chosen (to stream it); `each`
/// returning `false` stops the generation (the reader went away).
pub fn generate_each(
    model: &GptStage,
    prompt: &[u8],
    sampling: Sampling,
    mut each: impl FnMut(u8) -> bool,
) -> Result<(), NnError> {
    if prompt.is_empty() {
        return Err(NnError::Config(
            "the prompt must hold at least one byte".into(),
        ));
    }
    if !(sampling.temperature >= 0.0 && sampling.temperature.is_finite()) {
        return Err(NnError::Config(format!(
            "temperature {} must be a finite number ≥ 0",
            sampling.temperature
        )));
    }
    let seq_len = model.config().seq_len;
    let mut rng = rng::stream(sampling.seed, Purpose::Text, 2, 0);
    let mut text: Vec<u32> = prompt.iter().map(|&b| u32::from(b)).collect();
    for _ in 0..sampling.max_tokens {
        let ctx = &text[text.len().saturating_sub(seq_len)..];
        let logits = model.logits(ctx, ctx.len())?;
        let all = to_f64_vec(&logits)?;
        let last = &all[(ctx.len() - 1) * VOCAB..];
        let next = if sampling.temperature == 0.0 {
            argmax(last)
        } else {
            sample(last, sampling.temperature, rng.random::<f64>())
        };
        text.push(next as u32);
        if !each(next as u8) || sampling.stop == Some(next as u8) {
            break;
        }
    }
    Ok(())
}

fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// The index where the cumulative `softmax(v / t)` first exceeds `u ∈ [0, 1)`.
fn sample(v: &[f64], t: f64, u: f64) -> usize {
    let max = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = v.iter().map(|&x| ((x - max) / t).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    for (i, &x) in w.iter().enumerate() {
        acc += x / total;
        if u < acc {
            return i;
        }
    }
    v.len() - 1
}

/// The fraction of `problems` whose greedy continuation up to the first newline is exactly
/// the answer.
pub fn addition_accuracy(model: &GptStage, problems: &[Problem]) -> Result<f64, NnError> {
    if problems.is_empty() {
        return Ok(0.0);
    }
    let mut right = 0;
    for p in problems {
        let out = generate(
            model,
            p.prompt.as_bytes(),
            Sampling {
                max_tokens: p.answer.len() + 1,
                temperature: 0.0,
                seed: 0,
                stop: Some(b'\n'),
            },
        )?;
        if out.strip_suffix(b"\n") == Some(p.answer.as_bytes()) {
            right += 1;
        }
    }
    Ok(right as f64 / problems.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_and_sampling_pick_as_documented() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 0.0]), 1);
        let v = [0.0, 0.0f64.ln_1p(), 2f64.ln()];
        // weights 1, 1, 2 -> cumulative 0.25, 0.5, 1.0
        assert_eq!(sample(&v, 1.0, 0.1), 0);
        assert_eq!(sample(&v, 1.0, 0.3), 1);
        assert_eq!(sample(&v, 1.0, 0.9), 2);
    }

    #[test]
    fn a_spread_validation_scores_every_window_up_to_its_cap_then_evenly_spread_ones() {
        use crate::gpt::{GptConfig, GptWeights};
        let config = GptConfig {
            d_model: 8,
            heads: 2,
            layers: 1,
            seq_len: 4,
            dtype: candle_core::DType::F64,
            moe: None,
        };
        let model = GptStage::whole(&GptWeights::random(&config, 3).unwrap()).unwrap();
        let bytes: Vec<u8> = (0..200u32).map(|i| (i * 7 % 13) as u8 + b'a').collect();
        let windows = ByteWindows::new(bytes.as_slice().into(), 4, "text").unwrap();
        assert_eq!(windows.len(), 40);
        let all = evaluate_windows(&model, &windows).unwrap();
        let under = evaluate_spread(&model, &windows, 40).unwrap();
        assert_eq!(all.loss.to_bits(), under.loss.to_bits());
        let spread = evaluate_spread(&model, &windows, 10).unwrap();
        assert_eq!(spread.windows, 10);
        // Windows 0, 4, 8, ..., 36: the same as scoring those windows alone.
        let picked: Vec<u8> = (0..10)
            .flat_map(|i| windows.window(4 * i).to_vec())
            .collect();
        let alone = ByteWindows::new(picked.as_slice().into(), 4, "text").unwrap();
        let expected = evaluate_windows(&model, &alone).unwrap();
        assert!((spread.loss - expected.loss).abs() < 1e-12);
    }
}
