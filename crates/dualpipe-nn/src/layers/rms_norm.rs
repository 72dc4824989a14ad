//! RMSNorm with a learned weight.

use std::collections::HashMap;

use candle_core::{DType, Tensor};
use dualpipe_schedule::Chunk;

use super::{kernels, tensor_bytes, Param};
use crate::error::NnError;
use crate::precision::Half;

/// The `eps` added to the mean square (PyTorch's `nn.RMSNorm(d, eps=1e-5)`).
pub const RMS_NORM_EPS: f64 = 1e-5;

/// `y = x / √(mean(x²) + eps) ⊙ w` per row of `x: [n, d]`, `w: [d]`.
///
/// `backward_input` computes the input gradient and keeps `(x, 1/rms, dy)`;
/// `backward_weight` accumulates `dw += Σ_rows dy ⊙ x / rms`.
#[derive(Debug)]
pub struct RmsNorm {
    weight: Param,
    /// The format the output is rounded to (what reads it reads it so), or `None`: the
    /// input's dtype.
    output: Option<Half>,
    saved_input: HashMap<Chunk, (Tensor, Tensor)>,
    saved_grad: HashMap<Chunk, (Tensor, Tensor, Tensor)>,
}

impl RmsNorm {
    /// The layer with weight `w: [d]`.
    pub fn from_tensor(weight: Tensor) -> Result<Self, NnError> {
        if weight.dims().len() != 1 {
            return Err(NnError::Config(format!(
                "RMSNorm weight has shape {:?}, expected [d]",
                weight.dims()
            )));
        }
        Ok(RmsNorm {
            weight: Param::new(weight)?,
            output: None,
            saved_input: HashMap::new(),
            saved_grad: HashMap::new(),
        })
    }

    /// The weight.
    pub fn params(&self) -> Vec<&Param> {
        vec![&self.weight]
    }

    /// The weight, mutably.
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        vec![&mut self.weight]
    }

    /// Rounds the output to `half` as it is made (mixed precision, when what reads it reads
    /// it in that format: the same values, without an f32 tensor between), or gives it in the
    /// input's dtype (`None`, the default). The norm itself, its saved input and its
    /// gradients stay in the input's dtype.
    pub fn set_output_half(&mut self, half: Option<Half>) {
        self.output = half;
    }

    /// The normalized rows without saving anything.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor, NnError> {
        Ok(self.normalize(x)?.0)
    }

    /// `(y, 1/rms)`, `y` in the output format.
    fn normalize(&self, x: &Tensor) -> Result<(Tensor, Tensor), NnError> {
        match self.output {
            Some(h) if x.dtype() == DType::F32 => {
                kernels::rms_norm_forward_half(x, &self.weight.value, RMS_NORM_EPS, h)
            }
            _ => kernels::rms_norm_forward(x, &self.weight.value, RMS_NORM_EPS),
        }
    }

    /// The normalized rows; keeps `x` and `1/rms` for the chunk's backward.
    pub fn forward(&mut self, key: Chunk, x: &Tensor) -> Result<Tensor, NnError> {
        let (y, inv) = self.normalize(x)?;
        self.saved_input.insert(key, (x.clone(), inv));
        Ok(y)
    }

    /// `dx (+ residual)`, the residual added in the same pass.
    pub fn backward_input(
        &mut self,
        key: Chunk,
        dy: &Tensor,
        residual: Option<&Tensor>,
    ) -> Result<Tensor, NnError> {
        let (x, inv) = self.saved_input.remove(&key).ok_or_else(|| {
            NnError::Stage(format!(
                "RMSNorm: backward_input of {key} before its forward"
            ))
        })?;
        let dx = kernels::rms_norm_backward_input(dy, &x, &self.weight.value, &inv, residual)?;
        self.saved_grad.insert(key, (x, inv, dy.clone()));
        Ok(dx)
    }

    /// Accumulates the chunk's weight gradient.
    pub fn backward_weight(&mut self, key: Chunk) -> Result<(), NnError> {
        let (x, inv, dy) = self.saved_grad.remove(&key).ok_or_else(|| {
            NnError::Stage(format!(
                "RMSNorm: backward_weight of {key} before its backward_input"
            ))
        })?;
        self.weight.grad = kernels::rms_norm_backward_weight(&dy, &x, &inv, &self.weight.grad)?;
        Ok(())
    }

    /// Chunks whose weight gradient has not run yet.
    pub fn pending(&self) -> usize {
        self.saved_input.len() + self.saved_grad.len()
    }

    /// Bytes of the tensors saved for chunks whose weight gradient has not run yet.
    pub fn saved_bytes(&self) -> usize {
        self.saved_input
            .values()
            .map(|(x, inv)| tensor_bytes(x) + tensor_bytes(inv))
            .sum::<usize>()
            + self
                .saved_grad
                .values()
                .map(|(x, inv, dy)| tensor_bytes(x) + tensor_bytes(inv) + tensor_bytes(dy))
                .sum::<usize>()
    }
}
