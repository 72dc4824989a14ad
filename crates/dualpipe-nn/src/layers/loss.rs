//! Mean-squared error.

use candle_core::{DType, Tensor};

use crate::error::{NnError, TensorContext};

/// `mean((y - t)²)` over every element, as f64.
pub fn mse_loss(y: &Tensor, target: &Tensor) -> Result<f64, NnError> {
    (y - target)
        .and_then(|d| d.sqr())
        .and_then(|d| d.to_dtype(DType::F64))
        .and_then(|d| d.mean_all())
        .and_then(|d| d.to_scalar::<f64>())
        .ctx("MSE loss")
}

/// The gradient of `scale * mean((y - t)²)` with respect to `y`: `2 scale (y - t) / numel`.
pub fn mse_grad(y: &Tensor, target: &Tensor, scale: f64) -> Result<Tensor, NnError> {
    let numel = y.elem_count() as f64;
    (y - target)
        .and_then(|d| d.affine(2.0 * scale / numel, 0.0))
        .ctx("MSE gradient")
}
