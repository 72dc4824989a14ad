//! The pre-norm transformer block.

use candle_core::Tensor;
use dualpipe_schedule::Chunk;

use super::GptWeights;
use crate::error::NnError;
use crate::layers::{CausalSelfAttention, Linear, Mlp, Param, RmsNorm};

/// `h₁ = h + attn(norm1(h))`, `y = h₁ + mlp(norm2(h₁))`. The residual sums are folded into
/// the output projections' GEMMs (forward) and the norms' input-gradient passes (backward).
#[derive(Debug)]
pub struct Block {
    norm1: RmsNorm,
    attn: CausalSelfAttention,
    norm2: RmsNorm,
    mlp: Mlp,
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
            mlp: Mlp::from_layers(linear("mlp.fc1")?, linear("mlp.fc2")?)?,
        })
    }

    /// Parameters in the order of the block's tensor names: norm1, qkv, proj, norm2, fc1, fc2.
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
        self.mlp.apply(&self.norm2.apply(&h1)?, Some(&h1))
    }

    /// Forward of the chunk, saving what its backward needs.
    pub fn forward(&mut self, key: Chunk, h: &Tensor, seq: usize) -> Result<Tensor, NnError> {
        let a = self.norm1.forward(key, h)?;
        let h1 = self.attn.forward(key, &a, seq, Some(h))?;
        let b = self.norm2.forward(key, &h1)?;
        self.mlp.forward(key, &b, Some(&h1))
    }

    /// The input gradient of the chunk; weight gradients wait for [`Block::backward_weight`].
    pub fn backward_input(&mut self, key: Chunk, dy: &Tensor) -> Result<Tensor, NnError> {
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
        self.norm1.pending() + self.attn.pending() + self.norm2.pending() + self.mlp.pending()
    }

    /// Bytes of the saved tensors of its layers.
    pub fn saved_bytes(&self) -> usize {
        self.norm1.saved_bytes()
            + self.attn.saved_bytes()
            + self.norm2.saved_bytes()
            + self.mlp.saved_bytes()
    }
}
