//! `y = x Wᵀ + b`.

use std::collections::HashMap;
use std::sync::Mutex;

use candle_core::{DType, Device, Tensor, TensorId};
use dualpipe_schedule::Chunk;
use rand_chacha::ChaCha8Rng;

use super::{kernels, store, tensor_bytes, Param};
use crate::error::{NnError, TensorContext};
use crate::precision::Half;
use crate::rng;

/// A fully connected layer `y = x Wᵀ + b` on rows `x: [n, in]`, with `W: [out, in]` and an
/// optional bias `b: [out]`.
///
/// - forward saves `x` for the chunk;
/// - `backward_input(dy)` returns `dx = dy W` and saves `dy` (no weight GEMM here);
/// - `backward_weight` accumulates `dW += dyᵀ x` and `db += Σ_rows dy`, then drops both.
///
/// Under mixed precision ([`Linear::set_half`]) the three GEMMs read their operands in the
/// half format and accumulate in f32 (the weight, its gradient and the outputs stay f32), and
/// the saved `x` and `dy` are held in the half format.
#[derive(Debug)]
pub struct Linear {
    weight: Param,
    bias: Option<Param>,
    saved_input: HashMap<Chunk, Tensor>,
    saved_grad: HashMap<Chunk, (Tensor, Tensor)>,
    /// `Wᵀ` stored contiguously (`[in, out]`) with the id of the weight it was made from: the
    /// forward GEMM reads a row-major right operand ~1.7x faster than the transposed view at
    /// width 512. Rebuilt when the weight tensor changes (after an optimizer step).
    weight_t: Mutex<Option<(TensorId, Tensor)>>,
    /// Under mixed precision, `W` rounded to the half format with the id of the weight it was
    /// made from: the GEMMs of every micro-batch read it instead of rounding the f32 master
    /// weight again as they pack it (the same values, so the same products). Rebuilt when the
    /// weight tensor changes.
    weight_half: Mutex<Option<(TensorId, Tensor)>>,
    /// The half-precision format of the GEMMs and saved tensors (`None`: the weight's dtype).
    half: Option<Half>,
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
            weight_t: Mutex::new(None),
            weight_half: Mutex::new(None),
            half: None,
        })
    }

    /// Computes in mixed precision with `half` (f32 weights only), or in the weight's dtype
    /// with `None`.
    pub fn set_half(&mut self, half: Option<Half>) -> Result<(), NnError> {
        if half.is_some() && self.weight.value.dtype() != DType::F32 {
            return Err(NnError::Config(format!(
                "mixed precision needs f32 master weights, this layer's are {:?}",
                self.weight.value.dtype()
            )));
        }
        self.half = half;
        *self
            .weight_half
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        Ok(())
    }

    /// The half-precision format of the GEMMs, if mixed precision is on.
    pub fn half(&self) -> Option<Half> {
        self.half
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
        self.forward_plus(key, x, None)
    }

    /// `y = x Wᵀ + b` without saving anything (inference, the teacher).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor, NnError> {
        self.apply_plus(x, None)
    }

    /// `Wᵀ` as a contiguous `[in, out]` tensor, cached until the weight changes.
    fn weight_transposed(&self) -> Result<Tensor, NnError> {
        derived(&self.weight_t, &self.weight.value, kernels::transpose)
    }

    /// `W` rounded to `half`, cached until the weight changes.
    fn weight_rounded(&self, half: Half) -> Result<Tensor, NnError> {
        derived(&self.weight_half, &self.weight.value, |w| {
            kernels::to_half(w, half)
        })
    }

    /// `y = x Wᵀ + b (+ residual)`, the residual added inside the GEMM (no extra pass).
    pub(crate) fn apply_plus(
        &self,
        x: &Tensor,
        residual: Option<&Tensor>,
    ) -> Result<Tensor, NnError> {
        if let Some(half) = self.half {
            return kernels::linear_forward_half(
                half,
                x,
                &self.weight_rounded(half)?,
                self.bias.as_ref().map(|b| &b.value),
                residual,
            );
        }
        kernels::linear_forward(
            x,
            &self.weight_transposed()?,
            self.bias.as_ref().map(|b| &b.value),
            residual,
        )
    }

    /// Forward with a residual folded in; saves `x` for the chunk's backward.
    pub(crate) fn forward_plus(
        &mut self,
        key: Chunk,
        x: &Tensor,
        residual: Option<&Tensor>,
    ) -> Result<Tensor, NnError> {
        // Under mixed precision the GEMM reads the rounded copy it keeps: the same operand
        // values as rounding `x` while packing it, read at half the bytes.
        let x = store(x, self.half)?;
        let y = self.apply_plus(&x, residual)?;
        self.saved_input.insert(key, x);
        Ok(y)
    }

    /// `dx = dy W`; keeps `x` and `dy` for [`Linear::backward_weight`].
    pub fn backward_input(&mut self, key: Chunk, dy: &Tensor) -> Result<Tensor, NnError> {
        self.backward_input_plus(key, dy, None)
    }

    /// `dx = dy W (+ residual)`, the residual added inside the GEMM.
    pub(crate) fn backward_input_plus(
        &mut self,
        key: Chunk,
        dy: &Tensor,
        residual: Option<&Tensor>,
    ) -> Result<Tensor, NnError> {
        let x = self.saved_input.remove(&key).ok_or_else(|| {
            NnError::Stage(format!(
                "Linear: backward_input of {key} before its forward"
            ))
        })?;
        let dy = store(dy, self.half)?;
        let dx = match self.half {
            Some(half) => kernels::linear_backward_input_half(
                half,
                &dy,
                &self.weight_rounded(half)?,
                residual,
            )?,
            None => kernels::linear_backward_input(&dy, &self.weight.value, residual)?,
        };
        self.saved_grad.insert(key, (x, dy));
        Ok(dx)
    }

    /// Accumulates `dW += dyᵀ x` and `db += Σ_rows dy` for the chunk (the GEMM adds into the
    /// gradient directly).
    pub fn backward_weight(&mut self, key: Chunk) -> Result<(), NnError> {
        let (x, dy) = self.saved_grad.remove(&key).ok_or_else(|| {
            NnError::Stage(format!(
                "Linear: backward_weight of {key} before its backward_input"
            ))
        })?;
        let grad_b = self.bias.as_ref().map(|b| &b.grad);
        let (dw, db) = match self.half {
            Some(half) => {
                kernels::linear_backward_weight_half(half, &dy, &x, &self.weight.grad, grad_b)?
            }
            None => kernels::linear_backward_weight(&dy, &x, &self.weight.grad, grad_b)?,
        };
        self.weight.grad = dw;
        if let (Some(b), Some(db)) = (&mut self.bias, db) {
            b.grad = db;
        }
        Ok(())
    }

    /// Chunks whose forward or input backward ran but whose weight gradient has not.
    pub fn pending(&self) -> usize {
        self.saved_input.len() + self.saved_grad.len()
    }

    /// Bytes of the tensors saved for chunks whose weight gradient has not run yet.
    pub fn saved_bytes(&self) -> usize {
        self.saved_input.values().map(tensor_bytes).sum::<usize>()
            + self
                .saved_grad
                .values()
                .map(|(x, dy)| tensor_bytes(x) + tensor_bytes(dy))
                .sum::<usize>()
    }
}

/// `make(w)`, kept in `cache` with `w`'s id and made again only when `w` is another tensor
/// (an optimizer step replaces the weight).
fn derived(
    cache: &Mutex<Option<(TensorId, Tensor)>>,
    w: &Tensor,
    make: impl FnOnce(&Tensor) -> Result<Tensor, NnError>,
) -> Result<Tensor, NnError> {
    let mut cache = cache
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((id, t)) = cache.as_ref() {
        if *id == w.id() {
            return Ok(t.clone());
        }
    }
    let t = make(w)?;
    *cache = Some((w.id(), t.clone()));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(t: &Tensor) -> Vec<f64> {
        t.flatten_all().unwrap().to_vec1::<f64>().unwrap()
    }

    #[test]
    fn forward_follows_a_replaced_weight() {
        let w = Tensor::new(&[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0f64]], &Device::Cpu).unwrap();
        let mut lin = Linear::from_tensors(w, None).unwrap();
        let x = Tensor::new(&[[1.0, -1.0f64]], &Device::Cpu).unwrap();
        assert_eq!(values(&lin.apply(&x).unwrap()), vec![-1.0, -1.0, -1.0]);
        lin.params_mut()[0].value =
            Tensor::new(&[[1.0, 0.0], [0.0, 1.0], [2.0, 0.0f64]], &Device::Cpu).unwrap();
        assert_eq!(values(&lin.apply(&x).unwrap()), vec![1.0, -1.0, 2.0]);
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        let t = t.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
        t.to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    /// Under mixed precision the layer hands its GEMMs the rounded copies of `x`, `dy` and
    /// `W` it keeps: every product must be bit-identical to the GEMMs rounding the f32
    /// tensors themselves, and neither a replaced weight nor a switched format may be read
    /// through a stale copy (bf16's last round and f16's first share one weight tensor).
    #[test]
    fn mixed_precision_reads_rounded_copies_with_the_same_products() {
        use rand::SeedableRng;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (n, input, output) = (37, 48, 40);
        let mut lin = Linear::random(&mut rng, input, output, true, 1.0, DType::F32).unwrap();
        let draw = |rng: &mut ChaCha8Rng, len: usize, shape: (usize, usize)| {
            Tensor::from_vec(rng::uniform(rng, len, 3.0), shape, &Device::Cpu)
                .and_then(|t| t.to_dtype(DType::F32))
                .unwrap()
        };
        let x = draw(&mut rng, n * input, (n, input));
        let dy = draw(&mut rng, n * output, (n, output));
        for half in [Half::Bf16, Half::F16] {
            lin.set_half(Some(half)).unwrap();
            for round in 0..2 {
                let w = lin.weight.value.clone();
                let b = lin.bias.as_ref().map(|b| b.value.clone());
                let key = Chunk {
                    dir: 0,
                    stage: 0,
                    mb: round,
                };
                let y = lin.forward(key, &x).unwrap();
                let want_y = kernels::linear_forward_half(half, &x, &w, b.as_ref(), None).unwrap();
                assert_eq!(bits(&y), bits(&want_y), "{half:?} forward, round {round}");
                let dx = lin.backward_input(key, &dy).unwrap();
                let want_dx = kernels::linear_backward_input_half(half, &dy, &w, None).unwrap();
                assert_eq!(
                    bits(&dx),
                    bits(&want_dx),
                    "{half:?} input gradient, round {round}"
                );
                let g0 = lin.weight.grad.clone();
                lin.backward_weight(key).unwrap();
                let (want_dw, _) =
                    kernels::linear_backward_weight_half(half, &dy, &x, &g0, None).unwrap();
                assert_eq!(
                    bits(&lin.weight.grad),
                    bits(&want_dw),
                    "{half:?} weight gradient"
                );
                if round == 0 {
                    // An optimizer step: a new weight tensor, which the next round must read.
                    lin.params_mut()[0].value = (&w * 0.5).unwrap();
                }
            }
        }
    }
}
