//! Mixed precision: the half-precision formats a model can compute in while its master
//! weights and optimizer state stay f32.
//!
//! Under a [`Half`] format, the feed-forward GEMMs (the GPT's MLP and experts, the MLP
//! model's blocks) read their operands rounded to that format and accumulate the products in
//! f32 (the processor's bf16 dot-product instructions where it has them), the tensors the
//! layers keep for their backward are held in the half format (half the bytes of f32), and so
//! are the activations and gradients a GPT stage sends. Element-wise math (norms, softmax,
//! GELU, the loss) reads and writes f32, as PyTorch's autocast keeps those operations in f32,
//! and the GPT's attention, embeddings, router and output head compute in f32 (see
//! [`crate::gpt::GptStage::set_half`]).

use candle_core::DType;

/// A 16-bit floating-point format for mixed-precision compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Half {
    /// bfloat16: f32's 8-bit exponent with 8 bits of mantissa; no loss scaling needed.
    Bf16,
    /// IEEE half precision: 5-bit exponent, 11 bits of mantissa; gradients need loss scaling.
    F16,
}

impl Half {
    /// The candle element type of tensors in this format.
    pub fn dtype(self) -> DType {
        match self {
            Half::Bf16 => DType::BF16,
            Half::F16 => DType::F16,
        }
    }

    /// `"bf16"` or `"f16"`.
    pub fn name(self) -> &'static str {
        match self {
            Half::Bf16 => "bf16",
            Half::F16 => "f16",
        }
    }

    /// The largest finite value of the format.
    pub fn max_finite(self) -> f32 {
        match self {
            Half::Bf16 => half::bf16::MAX.to_f32(),
            Half::F16 => half::f16::MAX.to_f32(),
        }
    }
}
