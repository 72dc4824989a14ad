//! The residual MLP block.

use candle_core::{DType, Tensor};
use dualpipe_schedule::Chunk;
use rand_chacha::ChaCha8Rng;

use super::{Gelu, Linear, Param};
use crate::error::NnError;

/// `y = x + Linear₂(GELU(Linear₁(x)))` with `Linear₁: h → 4h` and `Linear₂: 4h → h`, both with
/// bias. The residual connection keeps deep stacks (stages × layers per stage) trainable.
#[derive(Debug)]
pub struct MlpBlock {
    up: Linear,
    act: Gelu,
    down: Linear,
}

impl MlpBlock {
    /// A block from its two layers (`up: h → f`, `down: f → h`).
    pub fn from_layers(up: Linear, down: Linear) -> Result<Self, NnError> {
        if up.output_dim() != down.input_dim() || down.output_dim() != up.input_dim() {
            return Err(NnError::Config(format!(
                "MlpBlock layers do not fit: up {}→{}, down {}→{}",
                up.input_dim(),
                up.output_dim(),
                down.input_dim(),
                down.output_dim()
            )));
        }
        Ok(MlpBlock {
            up,
            act: Gelu::new(),
            down,
        })
    }

    /// A block of width `hidden` drawn from `rng` (up layer first, then down), PyTorch's default
    /// uniform initialisation scaled by `gain`.
    pub fn random(
        rng: &mut ChaCha8Rng,
        hidden: usize,
        gain: f64,
        dtype: DType,
    ) -> Result<Self, NnError> {
        let up = Linear::random(rng, hidden, 4 * hidden, true, gain, dtype)?;
        let down = Linear::random(rng, 4 * hidden, hidden, true, gain, dtype)?;
        Self::from_layers(up, down)
    }

    /// Computes in mixed precision with `half` (both GEMMs and the saved tensors), or in the
    /// weights' dtype with `None`.
    pub fn set_half(&mut self, half: Option<crate::Half>) -> Result<(), NnError> {
        self.up.set_half(half)?;
        self.act.set_half(half);
        self.down.set_half(half)
    }

    /// Parameters in a fixed order: up weight, up bias, down weight, down bias.
    pub fn params(&self) -> Vec<&Param> {
        let mut p = self.up.params();
        p.extend(self.down.params());
        p
    }

    /// Parameters mutably, in the order of [`MlpBlock::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.up.params_mut();
        p.extend(self.down.params_mut());
        p
    }

    /// The block's output without saving anything.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor, NnError> {
        let h = self.act.apply(&self.up.apply(x)?)?;
        self.down.apply_plus(&h, Some(x))
    }

    /// Forward of the chunk, saving what its backward needs.
    pub fn forward(&mut self, key: Chunk, x: &Tensor) -> Result<Tensor, NnError> {
        let h = self.up.forward(key, x)?;
        let a = self.act.forward(key, &h)?;
        self.down.forward_plus(key, &a, Some(x))
    }

    /// Input gradient of the chunk: `dx = dy + up.bi(gelu.bi(down.bi(dy)))`. Weight gradients
    /// wait for [`MlpBlock::backward_weight`].
    pub fn backward_input(&mut self, key: Chunk, dy: &Tensor) -> Result<Tensor, NnError> {
        let da = self.down.backward_input(key, dy)?;
        let dh = self.act.backward_input(key, &da)?;
        self.up.backward_input_plus(key, &dh, Some(dy))
    }

    /// The chunk's weight gradients (both layers' GEMMs).
    pub fn backward_weight(&mut self, key: Chunk) -> Result<(), NnError> {
        self.down.backward_weight(key)?;
        self.up.backward_weight(key)
    }

    /// Saved per-chunk tensors not yet consumed (0 after every chunk's W ran).
    pub fn pending(&self) -> usize {
        self.up.pending() + self.act.pending() + self.down.pending()
    }
}
