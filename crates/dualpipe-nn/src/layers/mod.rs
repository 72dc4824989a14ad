//! Layers with the backward split in two: `backward_input` computes only the gradient for the
//! layer's input and saves what the weight gradient needs; `backward_weight` later runs the
//! weight-gradient GEMMs (the zero-bubble split). State between the calls is keyed by the
//! [`Chunk`](dualpipe_schedule::Chunk) being computed, so many micro-batches can be in flight.
//!
//! A full backward (`B`) is `backward_input` followed at once by `backward_weight`.

mod attention;
mod block;
mod embedding;
mod gelu;
pub(crate) mod kernels;
mod linear;
mod loss;
mod mlp;
pub mod moe;
mod rms_norm;

pub use attention::CausalSelfAttention;
pub use block::MlpBlock;
pub use embedding::Embedding;
pub use gelu::Gelu;
#[doc(hidden)]
pub use kernels::{bench_amx_peak, bench_gemm, bench_gemm_bf16};
pub use linear::Linear;
pub use loss::{cross_entropy, mse_grad, mse_loss};
pub use mlp::Mlp;
pub use moe::{MoeConfig, MoeLayer};
pub use rms_norm::{RmsNorm, RMS_NORM_EPS};

use candle_core::Tensor;

use crate::error::{NnError, TensorContext};
use crate::precision::Half;

/// Bytes of a tensor's elements (`elements · element size`): what a saved tensor holds.
pub fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

/// `t` as a layer keeps it for its backward: rounded to `half` under mixed precision, else
/// as is (a reference, no copy).
pub(crate) fn store(t: &Tensor, half: Option<Half>) -> Result<Tensor, NnError> {
    match half {
        Some(h) => kernels::to_half(t, h),
        None => Ok(t.clone()),
    }
}

/// A saved tensor as f32 again if [`store`] rounded it to a half format, else as is.
pub(crate) fn restore(t: &Tensor) -> Result<Tensor, NnError> {
    match t.dtype() {
        candle_core::DType::BF16 | candle_core::DType::F16 => kernels::to_f32(t),
        _ => Ok(t.clone()),
    }
}

/// A trainable tensor and the gradient accumulated for it since the last
/// [`Param::zero_grad`].
#[derive(Clone, Debug)]
pub struct Param {
    /// The current value.
    pub value: Tensor,
    /// The accumulated gradient (same shape and dtype as `value`).
    pub grad: Tensor,
}

impl Param {
    /// A parameter with value `value` and a zero gradient.
    pub fn new(value: Tensor) -> Result<Self, NnError> {
        // A model's parameters are made before its ranks' threads start: the allocator's
        // settings (one arena for every thread) must be in place by then.
        kernels::keep_freed_memory();
        let grad = value.zeros_like().ctx("Param::new")?;
        Ok(Param { value, grad })
    }

    /// Adds `g` to the accumulated gradient.
    pub fn accumulate(&mut self, g: &Tensor) -> Result<(), NnError> {
        self.grad = (&self.grad + g).ctx("accumulating a gradient")?;
        Ok(())
    }

    /// Resets the accumulated gradient to zero.
    pub fn zero_grad(&mut self) -> Result<(), NnError> {
        self.grad = self.value.zeros_like().ctx("zero_grad")?;
        Ok(())
    }
}
