//! GELU with the exact (erf) formula.

use std::collections::HashMap;

use candle_core::Tensor;
use dualpipe_schedule::Chunk;

use crate::error::{NnError, TensorContext};

/// `gelu(x) = x Φ(x) = x (1 + erf(x / √2)) / 2`, the exact form (PyTorch's default
/// `nn.GELU()`, candle's `gelu_erf`), not the tanh approximation.
///
/// Its derivative is `Φ(x) + x φ(x)` with `φ(x) = exp(-x²/2) / √(2π)`. No parameters, so
/// `backward_weight` does nothing.
#[derive(Debug, Default)]
pub struct Gelu {
    saved_input: HashMap<Chunk, Tensor>,
}

impl Gelu {
    /// A GELU layer.
    pub fn new() -> Self {
        Self::default()
    }

    /// The exact GELU of `x`.
    pub fn apply(x: &Tensor) -> Result<Tensor, NnError> {
        x.gelu_erf().ctx("GELU forward")
    }

    /// `gelu(x)`; saves `x` for the chunk's backward.
    pub fn forward(&mut self, key: Chunk, x: &Tensor) -> Result<Tensor, NnError> {
        let y = Self::apply(x)?;
        self.saved_input.insert(key, x.clone());
        Ok(y)
    }

    /// `dx = dy (Φ(x) + x φ(x))`.
    pub fn backward_input(&mut self, key: Chunk, dy: &Tensor) -> Result<Tensor, NnError> {
        let x = self.saved_input.remove(&key).ok_or_else(|| {
            NnError::Stage(format!("GELU: backward_input of {key} before its forward"))
        })?;
        (dy * Self::derivative(&x)?).ctx("GELU backward")
    }

    /// `Φ(x) + x φ(x)` elementwise.
    pub fn derivative(x: &Tensor) -> Result<Tensor, NnError> {
        let inv_sqrt_2pi = 1.0 / (2.0 * std::f64::consts::PI).sqrt();
        let cdf = x
            .affine(std::f64::consts::FRAC_1_SQRT_2, 0.0)
            .and_then(|t| t.erf())
            .and_then(|t| t.affine(0.5, 0.5))
            .ctx("GELU derivative Φ")?;
        let pdf = x
            .sqr()
            .and_then(|t| t.affine(-0.5, 0.0))
            .and_then(|t| t.exp())
            .and_then(|t| t.affine(inv_sqrt_2pi, 0.0))
            .ctx("GELU derivative φ")?;
        (x * pdf).and_then(|t| t + cdf).ctx("GELU derivative")
    }

    /// Chunks whose forward ran but whose backward has not.
    pub fn pending(&self) -> usize {
        self.saved_input.len()
    }
}
