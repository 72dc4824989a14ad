//! `y = x Wᵀ + b`.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use dualpipe_schedule::Chunk;
use rand_chacha::ChaCha8Rng;

use super::Param;
use crate::error::{NnError, TensorContext};
use crate::rng;

/// A fully connected layer `y = x Wᵀ + b` on rows `x: [n, in]`, with `W: [out, in]` and an
/// optional bias `b: [out]`.
///
/// - forward saves `x` for the chunk;
/// - `backward_input(dy)` returns `dx = dy W` and saves `dy` (no weight GEMM here);
/// - `backward_weight` accumulates `dW += dyᵀ x` and `db += Σ_rows dy`, then drops both.
#[derive(Debug)]
pub struct Linear {
    weight: Param,
    bias: Option<Param>,
    saved_input: HashMap<Chunk, Tensor>,
    saved_grad: HashMap<Chunk, (Tensor, Tensor)>,
}

impl Linear {
    /// A layer with the given weight `[out, in]` and optional bias `[out]`.
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>) -> Result<Self, NnError> {
        let (out, _) = weight.dims2().ctx("Linear weight must be [out, in]")?;
        if let Some(b) = &bias {
            if b.dims() != [out] {
                return Err(NnError::Config(format!(
                    "Linear bias has shape {:?}, expected [{out}]",
                    b.dims()
                )));
            }
        }
        Ok(Linear {
            weight: Param::new(weight)?,
            bias: bias.map(Param::new).transpose()?,
            saved_input: HashMap::new(),
            saved_grad: HashMap::new(),
        })
    }

    /// A layer drawn from `rng`: weight and bias uniform in `±gain/sqrt(in)` (PyTorch's default
    /// for `gain = 1`), drawn in f64 and then cast to `dtype`, so f32 and f64 models agree up to
    /// rounding.
    pub fn random(
        rng: &mut ChaCha8Rng,
        input: usize,
        output: usize,
        bias: bool,
        gain: f64,
        dtype: DType,
    ) -> Result<Self, NnError> {
        let bound = gain / (input as f64).sqrt();
        let w = Tensor::from_vec(
            rng::uniform(rng, input * output, bound),
            (output, input),
            &Device::Cpu,
        )
        .and_then(|t| t.to_dtype(dtype))
        .ctx("Linear::random weight")?;
        let b = if bias {
            Some(
                Tensor::from_vec(rng::uniform(rng, output, bound), output, &Device::Cpu)
                    .and_then(|t| t.to_dtype(dtype))
                    .ctx("Linear::random bias")?,
            )
        } else {
            None
        };
        Self::from_tensors(w, b)
    }

    /// Input features.
    pub fn input_dim(&self) -> usize {
        self.weight.value.dims()[1]
    }

    /// Output features.
    pub fn output_dim(&self) -> usize {
        self.weight.value.dims()[0]
    }

    /// The weight, then the bias if any.
    pub fn params(&self) -> Vec<&Param> {
        std::iter::once(&self.weight)
            .chain(self.bias.as_ref())
            .collect()
    }

    /// The weight, then the bias if any, mutably.
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        std::iter::once(&mut self.weight)
            .chain(self.bias.as_mut())
            .collect()
    }

    /// `y = x Wᵀ + b`; saves `x` for the chunk's backward.
    pub fn forward(&mut self, key: Chunk, x: &Tensor) -> Result<Tensor, NnError> {
        let y = self.apply(x)?;
        self.saved_input.insert(key, x.clone());
        Ok(y)
    }

    /// `y = x Wᵀ + b` without saving anything (inference, the teacher).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor, NnError> {
        let y = x
            .matmul(&self.weight.value.t().ctx("Linear forward")?)
            .ctx("Linear forward x Wᵀ")?;
        match &self.bias {
            Some(b) => y.broadcast_add(&b.value).ctx("Linear forward + b"),
            None => Ok(y),
        }
    }

    /// `dx = dy W`; keeps `x` and `dy` for [`Linear::backward_weight`].
    pub fn backward_input(&mut self, key: Chunk, dy: &Tensor) -> Result<Tensor, NnError> {
        let x = self.saved_input.remove(&key).ok_or_else(|| {
            NnError::Stage(format!(
                "Linear: backward_input of {key} before its forward"
            ))
        })?;
        let dx = dy.matmul(&self.weight.value).ctx("Linear backward dy W")?;
        self.saved_grad.insert(key, (x, dy.clone()));
        Ok(dx)
    }

    /// Accumulates `dW += dyᵀ x` and `db += Σ_rows dy` for the chunk.
    pub fn backward_weight(&mut self, key: Chunk) -> Result<(), NnError> {
        let (x, dy) = self.saved_grad.remove(&key).ok_or_else(|| {
            NnError::Stage(format!(
                "Linear: backward_weight of {key} before its backward_input"
            ))
        })?;
        let dw = dy
            .t()
            .and_then(|t| t.matmul(&x))
            .ctx("Linear weight gradient dyᵀ x")?;
        self.weight.accumulate(&dw)?;
        if let Some(b) = &mut self.bias {
            let db = dy.sum(0).ctx("Linear bias gradient")?;
            b.accumulate(&db)?;
        }
        Ok(())
    }

    /// Chunks whose forward or input backward ran but whose weight gradient has not.
    pub fn pending(&self) -> usize {
        self.saved_input.len() + self.saved_grad.len()
    }
}
