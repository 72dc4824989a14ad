//! The transformer block's feed-forward part: `fc2(gelu(fc1(x)))`, no biases.

use candle_core::Tensor;
use dualpipe_schedule::Chunk;

use super::{Gelu, Linear, Param};
use crate::error::NnError;
use crate::precision::Half;

/// `y = fc2(gelu(fc1(x)))` with `fc1: [4d, d]`, `fc2: [d, 4d]` and exact (erf) GELU.
#[derive(Debug)]
pub struct Mlp {
    fc1: Linear,
    act: Gelu,
    fc2: Linear,
}

impl Mlp {
    /// The layer from its two linear maps (`fc1: d → f`, `fc2: f → d`).
    pub fn from_layers(fc1: Linear, fc2: Linear) -> Result<Self, NnError> {
        if fc1.output_dim() != fc2.input_dim() || fc2.output_dim() != fc1.input_dim() {
            return Err(NnError::Config(format!(
                "MLP layers do not fit: fc1 {}→{}, fc2 {}→{}",
                fc1.input_dim(),
                fc1.output_dim(),
                fc2.input_dim(),
                fc2.output_dim()
            )));
        }
        Ok(Mlp {
            fc1,
            act: Gelu::new(),
            fc2,
        })
    }

    /// Computes in mixed precision with `half` (both GEMMs and the saved tensors), or in the
    /// weights' dtype with `None`.
    pub fn set_half(&mut self, half: Option<Half>) -> Result<(), NnError> {
        self.fc1.set_half(half)?;
        self.act.set_half(half);
        self.fc2.set_half(half)
    }

    /// The format `fc1` reads its input in (`None`: the weights' dtype).
    pub fn input_half(&self) -> Option<Half> {
        self.fc1.half()
    }

    /// fc1's weight, then fc2's.
    pub fn params(&self) -> Vec<&Param> {
        let mut p = self.fc1.params();
        p.extend(self.fc2.params());
        p
    }

    /// The parameters mutably, in the order of [`Mlp::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.fc1.params_mut();
        p.extend(self.fc2.params_mut());
        p
    }

    /// `mlp(x) (+ residual)` without saving anything.
    pub fn apply(&self, x: &Tensor, residual: Option<&Tensor>) -> Result<Tensor, NnError> {
        let h = self.act.apply(&self.fc1.apply(x)?)?;
        self.fc2.apply_plus(&h, residual)
    }

    /// `mlp(x) (+ residual)`, saving what the chunk's backward needs.
    pub fn forward(
        &mut self,
        key: Chunk,
        x: &Tensor,
        residual: Option<&Tensor>,
    ) -> Result<Tensor, NnError> {
        let h = self.fc1.forward(key, x)?;
        let a = self.act.forward(key, &h)?;
        self.fc2.forward_plus(key, &a, residual)
    }

    /// The input gradient (weight gradients wait for [`Mlp::backward_weight`]).
    pub fn backward_input(&mut self, key: Chunk, dy: &Tensor) -> Result<Tensor, NnError> {
        let da = self.fc2.backward_input(key, dy)?;
        let dh = self.act.backward_input(key, &da)?;
        self.fc1.backward_input(key, &dh)
    }

    /// Both layers' weight-gradient GEMMs of the chunk.
    pub fn backward_weight(&mut self, key: Chunk) -> Result<(), NnError> {
        self.fc2.backward_weight(key)?;
        self.fc1.backward_weight(key)
    }

    /// Saved per-chunk tensors not yet consumed.
    pub fn pending(&self) -> usize {
        self.fc1.pending() + self.act.pending() + self.fc2.pending()
    }

    /// Bytes of the saved tensors of its layers.
    pub fn saved_bytes(&self) -> usize {
        self.fc1.saved_bytes() + self.act.saved_bytes() + self.fc2.saved_bytes()
    }
}
