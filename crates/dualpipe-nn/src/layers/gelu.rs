//! GELU with the exact (erf) formula.

use std::collections::HashMap;

use candle_core::{DType, Tensor};
use dualpipe_schedule::Chunk;

use super::{kernels, restore, store, tensor_bytes};
use crate::error::NnError;
use crate::precision::Half;

/// `gelu(x) = x Φ(x) = x (1 + erf(x / √2)) / 2`, the exact form (PyTorch's default
/// `nn.GELU()`, candle's `gelu_erf`), not the tanh approximation. f64 evaluates erf with libm;
/// f32 with a vectorized approximation whose error is below f32 rounding (see `kernels`).
///
/// Its derivative is `Φ(x) + x φ(x)` with `φ(x) = exp(-x²/2) / √(2π)`. No parameters, so
/// `backward_weight` does nothing.
///
/// Under mixed precision ([`Gelu::set_half`]) the saved derivative is held in the half format,
/// and the values and the input gradient come out in it: what follows a GELU is a `Linear`
/// that reads its input (and its output gradient) in that format anyway.
#[derive(Debug, Default)]
pub struct Gelu {
    saved_derivative: HashMap<Chunk, Tensor>,
    half: Option<Half>,
}

impl Gelu {
    /// A GELU layer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps the saved derivatives in `half` (mixed precision), or in the input's dtype.
    pub fn set_half(&mut self, half: Option<Half>) {
        self.half = half;
    }

    /// The exact GELU of `x` (one fused pass), without saving anything: the values
    /// [`Gelu::forward`] gives, under mixed precision too (inference then runs the GELU
    /// training ran).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor, NnError> {
        match self.half {
            // The derivative made with the values is dropped.
            Some(h) if x.dtype() == DType::F32 => Ok(kernels::gelu_forward_half(x, h)?.0),
            _ => kernels::gelu(x),
        }
    }

    /// `gelu(x)`; saves `gelu'(x)`, computed in the same pass, for the chunk's backward.
    pub fn forward(&mut self, key: Chunk, x: &Tensor) -> Result<Tensor, NnError> {
        let (y, d) = match self.half {
            // The derivative rounded as it is made (the values of `store`).
            Some(h) if x.dtype() == DType::F32 => kernels::gelu_forward_half(x, h)?,
            _ => {
                let (y, d) = kernels::gelu_forward(x)?;
                (y, store(&d, self.half)?)
            }
        };
        self.saved_derivative.insert(key, d);
        Ok(y)
    }

    /// `dx = dy (Φ(x) + x φ(x))`.
    pub fn backward_input(&mut self, key: Chunk, dy: &Tensor) -> Result<Tensor, NnError> {
        let d = self.saved_derivative.remove(&key).ok_or_else(|| {
            NnError::Stage(format!("GELU: backward_input of {key} before its forward"))
        })?;
        match (dy.dtype(), d.dtype()) {
            (DType::F32, DType::BF16 | DType::F16) => kernels::mul_rounded(dy, &d, "GELU backward"),
            _ => kernels::mul(dy, &restore(&d)?, "GELU backward"),
        }
    }

    /// `Φ(x) + x φ(x)` elementwise.
    pub fn derivative(x: &Tensor) -> Result<Tensor, NnError> {
        kernels::gelu_derivative(x)
    }

    /// Chunks whose forward ran but whose backward has not.
    pub fn pending(&self) -> usize {
        self.saved_derivative.len()
    }

    /// Bytes of the saved derivatives.
    pub fn saved_bytes(&self) -> usize {
        self.saved_derivative.values().map(tensor_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn apply_gives_the_values_of_forward_in_every_precision() {
        let v: Vec<f32> = (0..3000).map(|i| -6.0 + i as f32 * 4e-3).collect();
        let x = Tensor::from_vec(v, (30, 100), &Device::Cpu).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            let t = t.to_dtype(DType::F32).unwrap();
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        for half in [None, Some(Half::Bf16), Some(Half::F16)] {
            let mut gelu = Gelu::new();
            gelu.set_half(half);
            let key = Chunk {
                dir: 0,
                stage: 0,
                mb: 0,
            };
            let y = gelu.forward(key, &x).unwrap();
            assert_eq!(bits(&gelu.apply(&x).unwrap()), bits(&y), "{half:?}");
        }
    }
}
