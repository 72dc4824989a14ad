//! Losses: mean-squared error and next-token cross-entropy.

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

/// The mean next-token cross-entropy of `logits: [n, vocab]` against `targets` (`n` token
/// ids), as f64, and its gradient scaled by `scale`: `scale (softmax(logits) − onehot) / n`.
pub fn cross_entropy(
    logits: &Tensor,
    targets: &[u32],
    scale: f64,
) -> Result<(f64, Tensor), NnError> {
    kernels::cross_entropy(logits, targets, scale)
}
