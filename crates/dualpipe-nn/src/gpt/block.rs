//! The pre-norm transformer block.

use std::collections::HashMap;

use candle_core::Tensor;
use dualpipe_schedule::Chunk;
use dualpipe_schedule::Recompute;

use super::weights::moe_bias_name;
use super::{GptWeights, MoeLayer};
use crate::error::{NnError, TensorContext};
use crate::layers::{CausalSelfAttention, Linear, Mlp, Param, RmsNorm};
use crate::precision::Half;

/// A block's feed-forward part: the dense MLP or a mixture of experts.
#[derive(Debug)]
pub enum FeedForward {
    /// `fc2(gelu(fc1(x)))`.
    Dense(Mlp),
    /// Routed (and shared) experts.
    Moe(MoeLayer),
}

impl FeedForward {
    fn params(&self) -> Vec<&Param> {
        match self {
            FeedForward::Dense(m) => m.params(),
            FeedForward::Moe(m) => m.params(),
        }
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        match self {
            FeedForward::Dense(m) => m.params_mut(),
            FeedForward::Moe(m) => m.params_mut(),
        }
    }

    fn apply(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor, NnError> {
        match self {
            FeedForward::Dense(m) => m.apply(x, Some(residual)),
            FeedForward::Moe(m) => m.apply(x, Some(residual)),
        }
    }

    fn forward(&mut self, key: Chunk, x: &Tensor, residual: &Tensor) -> Result<Tensor, NnError> {
        match self {
            FeedForward::Dense(m) => m.forward(key, x, Some(residual)),
            FeedForward::Moe(m) => m.forward(key, x, Some(residual)),
        }
    }

    fn backward_input(&mut self, key: Chunk, dy: &Tensor) -> Result<Tensor, NnError> {
        match self {
            FeedForward::Dense(m) => m.backward_input(key, dy),
            FeedForward::Moe(m) => m.backward_input(key, dy),
        }
    }

    fn backward_weight(&mut self, key: Chunk) -> Result<(), NnError> {
        match self {
            FeedForward::Dense(m) => m.backward_weight(key),
            FeedForward::Moe(m) => m.backward_weight(key),
        }
    }

    fn pending(&self) -> usize {
        match self {
            FeedForward::Dense(m) => m.pending(),
            FeedForward::Moe(m) => m.pending(),
        }
    }

    fn saved_bytes(&self) -> usize {
        match self {
            FeedForward::Dense(m) => m.saved_bytes(),
            FeedForward::Moe(m) => m.saved_bytes(),
        }
    }
}

/// `h₁ = h + attn(norm1(h))`, `y = h₁ + ff(norm2(h₁))` with `ff` the dense MLP or the MoE
/// layer. The residual sums are folded into the output projections' GEMMs (forward) and the
/// norms' input-gradient passes (backward).
///
/// With [`Recompute::Full`] a chunk's forward keeps only the block's input and the saving
/// forward runs again from it at the start of the chunk's input backward; with
/// [`Recompute::Selective`] the attention saves as usual and the forward keeps the block's
/// input and the attention's output (the second norm's input), the norms and the
/// feed-forward part running again. MoE blocks always save (their forward routes and counts
/// tokens, and may exchange them with other workers).
#[derive(Debug)]
pub struct Block {
    norm1: RmsNorm,
    attn: CausalSelfAttention,
    norm2: RmsNorm,
    mlp: FeedForward,
    recompute: Recompute,
    /// Per chunk whose forward did not save everything: its input, the attention's output
    /// (selective) and the sequence length.
    kept: HashMap<Chunk, Kept>,
}

/// What a recomputing block keeps of one chunk's forward.
#[derive(Debug)]
struct Kept {
    input: Tensor,
    attn_out: Option<Tensor>,
    seq: usize,
}

impl Kept {
    fn bytes(&self) -> usize {
        crate::layers::tensor_bytes(&self.input)
            + self
                .attn_out
                .as_ref()
                .map_or(0, crate::layers::tensor_bytes)
    }
}

impl Block {
    /// Block `l` built from the weights' `blocks.{l}.*` tensors.
    pub fn from_weights(weights: &GptWeights, l: usize) -> Result<Self, NnError> {
        let c = weights.config();
        let w = |s: &str| weights.get(&format!("blocks.{l}.{s}.weight")).cloned();
        let linear = |s: &str| Linear::from_tensors(w(s)?, None);
        Ok(Block {
            norm1: RmsNorm::from_tensor(w("norm1")?)?,
            attn: CausalSelfAttention::from_layers(
                linear("attn.qkv")?,
                linear("attn.proj")?,
                c.heads,
            )?,
            norm2: RmsNorm::from_tensor(w("norm2")?)?,
            mlp: match c.moe {
                Some(m) if m.is_moe_block(l) => {
                    let expert = |prefix: String| {
                        Mlp::from_layers(
                            linear(&format!("{prefix}.fc1"))?,
                            linear(&format!("{prefix}.fc2"))?,
                        )
                    };
                    let routed = (0..m.experts)
                        .map(|e| expert(format!("moe.experts.{e}")))
                        .collect::<Result<Vec<_>, _>>()?;
                    let shared = (0..m.shared_experts)
                        .map(|s| expert(format!("moe.shared.{s}")))
                        .collect::<Result<Vec<_>, _>>()?;
                    let bias = weights
                        .get(&moe_bias_name(l))?
                        .to_dtype(candle_core::DType::F64)
                        .and_then(|t| t.to_vec1::<f64>())
                        .ctx("the selection bias")?;
                    FeedForward::Moe(MoeLayer::new(
                        linear("moe.router")?,
                        bias,
                        routed,
                        shared,
                        m.top_k,
                    )?)
                }
                _ => FeedForward::Dense(Mlp::from_layers(linear("mlp.fc1")?, linear("mlp.fc2")?)?),
            },
            recompute: Recompute::None,
            kept: HashMap::new(),
        })
    }

    /// Computes in mixed precision with `half` (the attention's and feed-forward's GEMMs and
    /// saved tensors; the norms compute in f32 and round their outputs for the GEMMs that read
    /// them), or in the weights' dtype with `None`.
    pub fn set_half(&mut self, half: Option<Half>) -> Result<(), NnError> {
        self.attn.set_half(half)?;
        match &mut self.mlp {
            FeedForward::Dense(m) => m.set_half(half)?,
            FeedForward::Moe(m) => m.set_half(half)?,
        }
        self.set_norm_outputs();
        Ok(())
    }

    /// Each norm gives its output in the format its reader reads it in: the qkv projection's
    /// and (dense) fc1's; an MoE layer's router reads f32.
    fn set_norm_outputs(&mut self) {
        self.norm1.set_output_half(self.attn.input_half());
        self.norm2.set_output_half(match &self.mlp {
            FeedForward::Dense(m) => m.input_half(),
            FeedForward::Moe(_) => None,
        });
    }

    /// Whether the attention projections' GEMMs follow the mixed-precision format too (see
    /// [`CausalSelfAttention::set_half_projections`](crate::layers::CausalSelfAttention::set_half_projections)).
    pub fn set_half_projections(&mut self, on: bool) -> Result<(), NnError> {
        self.attn.set_half_projections(on)?;
        self.set_norm_outputs();
        Ok(())
    }

    /// What the block's forwards keep from now on (set it between steps: chunks already
    /// forwarded keep what they saved). An MoE block always saves everything.
    pub fn set_recompute(&mut self, recompute: Recompute) {
        self.recompute = recompute;
    }

    /// What the block's forwards keep: [`Recompute::None`] for an MoE block, whatever was set.
    pub fn recompute(&self) -> Recompute {
        match self.mlp {
            FeedForward::Moe(_) => Recompute::None,
            FeedForward::Dense(_) => self.recompute,
        }
    }

    /// The MoE layer, if this block has one.
    pub fn moe(&self) -> Option<&MoeLayer> {
        match &self.mlp {
            FeedForward::Moe(m) => Some(m),
            FeedForward::Dense(_) => None,
        }
    }

    /// The MoE layer mutably, if this block has one.
    pub fn moe_mut(&mut self) -> Option<&mut MoeLayer> {
        match &mut self.mlp {
            FeedForward::Moe(m) => Some(m),
            FeedForward::Dense(_) => None,
        }
    }

    /// Parameters in the order of the block's tensor names: norm1, qkv, proj, norm2, then
    /// fc1, fc2 (dense) or the MoE layer's ([`MoeLayer::params`]).
    pub fn params(&self) -> Vec<&Param> {
        let mut p = self.norm1.params();
        p.extend(self.attn.params());
        p.extend(self.norm2.params());
        p.extend(self.mlp.params());
        p
    }

    /// The parameters mutably, in the order of [`Block::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.norm1.params_mut();
        p.extend(self.attn.params_mut());
        p.extend(self.norm2.params_mut());
        p.extend(self.mlp.params_mut());
        p
    }

    /// The block's output on sequences of `seq` rows, without saving anything.
    pub fn apply(&self, h: &Tensor, seq: usize) -> Result<Tensor, NnError> {
        let h1 = self.attn.apply(&self.norm1.apply(h)?, seq, Some(h))?;
        self.mlp.apply(&self.norm2.apply(&h1)?, &h1)
    }

    /// Forward of the chunk, saving what its backward needs (or, recomputing, what the
    /// recomputation starts from: see [`Block`]).
    pub fn forward(&mut self, key: Chunk, h: &Tensor, seq: usize) -> Result<Tensor, NnError> {
        match self.recompute() {
            Recompute::None => self.forward_saving(key, h, seq),
            Recompute::Full => {
                let y = self.apply(h, seq)?;
                self.keep(key, h, None, seq);
                Ok(y)
            }
            Recompute::Selective => {
                let h1 = self
                    .attn
                    .forward(key, &self.norm1.apply(h)?, seq, Some(h))?;
                let y = self.mlp.apply(&self.norm2.apply(&h1)?, &h1)?;
                self.keep(key, h, Some(h1), seq);
                Ok(y)
            }
        }
    }

    fn keep(&mut self, key: Chunk, h: &Tensor, attn_out: Option<Tensor>, seq: usize) {
        self.kept.insert(
            key,
            Kept {
                input: h.clone(),
                attn_out,
                seq,
            },
        );
    }

    /// The forward that saves everything the backward needs.
    fn forward_saving(&mut self, key: Chunk, h: &Tensor, seq: usize) -> Result<Tensor, NnError> {
        let a = self.norm1.forward(key, h)?;
        let h1 = self.attn.forward(key, &a, seq, Some(h))?;
        let b = self.norm2.forward(key, &h1)?;
        self.mlp.forward(key, &b, &h1)
    }

    /// Runs again what a recomputing forward of the chunk did not save (nothing for a chunk
    /// that saved everything).
    fn recompute_saved(&mut self, key: Chunk) -> Result<(), NnError> {
        let Some(kept) = self.kept.remove(&key) else {
            return Ok(());
        };
        match kept.attn_out {
            None => {
                self.forward_saving(key, &kept.input, kept.seq)?;
            }
            Some(h1) => {
                self.norm1.forward(key, &kept.input)?;
                let b = self.norm2.forward(key, &h1)?;
                self.mlp.forward(key, &b, &h1)?;
            }
        }
        Ok(())
    }

    /// The input gradient of the chunk (first recomputing what its forward did not save);
    /// weight gradients wait for [`Block::backward_weight`].
    pub fn backward_input(&mut self, key: Chunk, dy: &Tensor) -> Result<Tensor, NnError> {
        self.recompute_saved(key)?;
        let db = self.mlp.backward_input(key, dy)?;
        let dh1 = self.norm2.backward_input(key, &db, Some(dy))?;
        let da = self.attn.backward_input(key, &dh1)?;
        self.norm1.backward_input(key, &da, Some(&dh1))
    }

    /// Every weight gradient of the chunk.
    pub fn backward_weight(&mut self, key: Chunk) -> Result<(), NnError> {
        self.mlp.backward_weight(key)?;
        self.norm2.backward_weight(key)?;
        self.attn.backward_weight(key)?;
        self.norm1.backward_weight(key)
    }

    /// Saved per-chunk tensors not yet consumed.
    pub fn pending(&self) -> usize {
        self.kept.len()
            + self.norm1.pending()
            + self.attn.pending()
            + self.norm2.pending()
            + self.mlp.pending()
    }

    /// Bytes of the saved tensors of its layers.
    pub fn saved_bytes(&self) -> usize {
        self.kept.values().map(Kept::bytes).sum::<usize>()
            + self.norm1.saved_bytes()
            + self.attn.saved_bytes()
            + self.norm2.saved_bytes()
            + self.mlp.saved_bytes()
    }
}
