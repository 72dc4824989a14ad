//! Mean-squared error.

use candle_core::Tensor;

use super::kernels;
use crate::error::NnError;

/// `mean((y - t)²)` over every element, as f64 (one fused pass).
pub fn mse_loss(y: &Tensor, target: &Tensor) -> Result<f64, NnError> {
    kernels::mse(y, target, "MSE loss")
}

/// The gradient of `scale * mean((y - t)²)` with respect to `y`: `2 scale (y - t) / numel`.
pub fn mse_grad(y: &Tensor, target: &Tensor, scale: f64) -> Result<Tensor, NnError> {
    let numel = y.elem_count() as f64;
    kernels::scaled_diff(y, target, 2.0 * scale / numel, "MSE gradient")
}
