//! A GPT-style byte-level language model with the backward split into I and W, as pipeline
//! stages of the runtime (see docs/models.md for the architecture and the weight names).
//!
//! - [`GptConfig`]: the architecture (`d_model`, `heads`, `layers`, `seq_len`, vocabulary 256);
//! - [`GptWeights`]: every tensor by its documented name, seeded initialisation, safetensors
//!   bytes with the architecture in the metadata;
//! - [`GptStage`]: one pipeline stage (stage 0 the embeddings, the last the final norm and the
//!   head), implementing [`dualpipe_runtime::Stage`];
//! - [`data`]: windows over any file's bytes and the seeded addition task;
//! - [`markov`]: a seeded Markov text whose entropy rate (the best possible loss) is known;
//! - [`eval`]: the loss over a file and text generation.

mod block;
pub mod data;
pub mod eval;
pub mod markov;
pub mod pipeline;
mod stage;
mod weights;

/// The mixture-of-experts layer, a layer like the others (in [`crate::layers::moe`]).
pub use crate::layers::moe;
pub use crate::layers::moe::{MoeConfig, MoeLayer};
pub use block::{Block, FeedForward};
pub use stage::{GptStage, TokenBatch, TokenMicroBatch};
pub use weights::{expert_prefix, tensor_names, GptWeights, WeightsError};

/// The element type of a model's tensors (candle's; F32 or F64 are supported).
pub use candle_core::DType;

use crate::error::NnError;

/// The byte-level vocabulary: every byte is a token.
pub const VOCAB: usize = 256;

/// Most scalars a model may hold (a bad flag fails before allocating).
pub const MAX_PARAMETERS: usize = 1 << 31;

/// The architecture of the model: pre-norm blocks `h + attn(norm1(h))`, `h + mlp(norm2(h))`
/// over `tok_emb + pos_emb`, then `lm_head(norm_f(h))`; no biases. With [`GptConfig::moe`],
/// the MoE blocks' `mlp` is a mixture of experts ([`MoeLayer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptConfig {
    /// Width of the hidden states.
    pub d_model: usize,
    /// Attention heads (dividing `d_model`).
    pub heads: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Longest sequence (rows of the position embedding).
    pub seq_len: usize,
    /// Element type of parameters and activations (F32 or F64).
    pub dtype: DType,
    /// The mixture-of-experts feed-forward and which blocks have it (`None`: every block
    /// dense).
    pub moe: Option<MoeConfig>,
}

impl GptConfig {
    /// Checks the shape: every size positive, heads dividing the width, the parameter count
    /// bounded by [`MAX_PARAMETERS`], f32 or f64.
    pub fn validate(&self) -> Result<(), NnError> {
        for (name, v) in [
            ("d_model", self.d_model),
            ("heads", self.heads),
            ("layers", self.layers),
            ("seq_len", self.seq_len),
        ] {
            if v == 0 {
                return Err(NnError::Config(format!("{name} must be at least 1")));
            }
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(NnError::Config(format!(
                "heads ({}) must divide d_model ({})",
                self.heads, self.d_model
            )));
        }
        if let Some(moe) = &self.moe {
            moe.validate()?;
        }
        if !matches!(self.dtype, DType::F32 | DType::F64) {
            return Err(NnError::Config(format!(
                "dtype {:?} is not supported; use f32 or f64",
                self.dtype
            )));
        }
        match self.checked_parameter_count() {
            Some(n) if n <= MAX_PARAMETERS => Ok(()),
            _ => Err(NnError::Config(format!(
                "d_model {}, layers {} and seq_len {} give more than {MAX_PARAMETERS} parameters; use a smaller model",
                self.d_model, self.layers, self.seq_len
            ))),
        }
    }

    fn checked_parameter_count(&self) -> Option<usize> {
        let d = self.d_model;
        let dd = d.checked_mul(d)?;
        let block = dd.checked_mul(12)?.checked_add(2 * d)?;
        let mut blocks = block.checked_mul(self.layers)?;
        if let Some(m) = &self.moe {
            // An MoE block swaps the dense MLP (8d²) for the router (E·d), the selection bias
            // (E) and E + S experts of 2·H·d.
            let experts = m.experts.checked_add(m.shared_experts)?;
            let moe = experts
                .checked_mul(m.expert_hidden)?
                .checked_mul(d)?
                .checked_mul(2)?
                .checked_add(m.experts.checked_mul(d)?)?
                .checked_add(m.experts)?;
            let n = (0..self.layers).filter(|&l| m.is_moe_block(l)).count();
            blocks = blocks
                .checked_sub(dd.checked_mul(8)?.checked_mul(n)?)?
                .checked_add(moe.checked_mul(n)?)?;
        }
        let emb = VOCAB.checked_mul(d)?.checked_mul(2)?;
        let pos = self.seq_len.checked_mul(d)?;
        blocks.checked_add(emb)?.checked_add(pos)?.checked_add(d)
    }

    /// Scalars in the model: per dense block `12 d² + 2d`, per MoE block `4 d² + 2d + E·d + E
    /// + (E + S)·2·H·d`, plus `2·256·d + seq_len·d + d`.
    pub fn parameter_count(&self) -> usize {
        self.checked_parameter_count().unwrap_or(usize::MAX)
    }

    /// The width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.heads
    }
}

/// The blocks of model stage `stage` when `layers` blocks are split evenly over `stages`.
pub fn stage_layers(
    layers: usize,
    stages: usize,
    stage: usize,
) -> Result<std::ops::Range<usize>, NnError> {
    if stages == 0 || !layers.is_multiple_of(stages) || stage >= stages {
        return Err(NnError::Config(format!(
            "{layers} blocks do not split evenly into {stages} stages (stage {stage})"
        )));
    }
    let per = layers / stages;
    Ok(stage * per..(stage + 1) * per)
}
