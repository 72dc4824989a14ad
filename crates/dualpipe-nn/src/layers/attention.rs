//! Causal multi-head self-attention with one fused qkv projection.

use std::collections::HashMap;

use candle_core::Tensor;
use dualpipe_schedule::Chunk;

use super::{kernels, store, tensor_bytes, Linear, Param};
use crate::error::NnError;
use crate::precision::Half;

/// `y = proj(softmax(q kᵀ / √hd + causal mask) v)` with `[q | k | v] = qkv(x)`, no biases;
/// `qkv: [3d, d]` (rows q, then k, then v, each head-major), `proj: [d, d]`.
///
/// `backward_input` computes the gradients of the attention output, of q, k and v (through
/// the saved probabilities) and of the input; the two projections' weight-gradient GEMMs wait
/// for `backward_weight`.
///
/// Under mixed precision ([`CausalSelfAttention::set_half`]) the saved q, k, v and
/// probabilities are held in the half format and the per-head score and value products (and
/// their gradients) read their operands in it, accumulating in f32; the softmax runs in f32,
/// and so do the projections unless [`CausalSelfAttention::set_half_projections`] says
/// otherwise (see [`CausalSelfAttention::set_half`]).
#[derive(Debug)]
pub struct CausalSelfAttention {
    qkv: Linear,
    proj: Linear,
    heads: usize,
    half: Option<Half>,
    /// Whether the projections' GEMMs follow `half` too (PyTorch autocast's recipe).
    half_projections: bool,
    /// Per chunk: the qkv activations, the probabilities and the sequence length.
    saved: HashMap<Chunk, (Tensor, Tensor, usize)>,
}

impl CausalSelfAttention {
    /// The layer from its projections; `heads` must divide the width.
    pub fn from_layers(qkv: Linear, proj: Linear, heads: usize) -> Result<Self, NnError> {
        let d = proj.output_dim();
        if qkv.input_dim() != d
            || qkv.output_dim() != 3 * d
            || proj.input_dim() != d
            || heads == 0
            || !d.is_multiple_of(heads)
        {
            return Err(NnError::Config(format!(
                "attention layers do not fit: qkv {}→{}, proj {}→{d}, {heads} heads",
                qkv.input_dim(),
                qkv.output_dim(),
                proj.input_dim()
            )));
        }
        Ok(CausalSelfAttention {
            qkv,
            proj,
            heads,
            half: None,
            half_projections: false,
            saved: HashMap::new(),
        })
    }

    /// Keeps the saved q, k, v and probabilities in `half` (mixed precision), and runs the
    /// per-head score and value products on `half` operands (as PyTorch's autocast runs its
    /// batched products), or everything in the weights' dtype with `None`. The projections'
    /// GEMMs stay in the weights' dtype: with them in bf16 the default GPT task learned its
    /// attention later (validation loss 1.2% above f32's after 300 steps, 0.08% with them in
    /// f32: docs/precision.md), and DeepSeek-V3 likewise keeps its attention projections in
    /// higher precision than its other GEMMs.
    pub fn set_half(&mut self, half: Option<Half>) -> Result<(), NnError> {
        if half.is_some() && self.qkv.params()[0].value.dtype() != candle_core::DType::F32 {
            return Err(NnError::Config(format!(
                "mixed precision needs f32 master weights, this layer's are {:?}",
                self.qkv.params()[0].value.dtype()
            )));
        }
        self.half = half;
        self.apply_projection_precision()
    }

    /// Runs the two projections' GEMMs in the mixed-precision format as well (`true`: the
    /// recipe of PyTorch's autocast, which runs every Linear in half precision), or in f32
    /// (`false`, the default). Their weights stay f32 either way. On the default GPT task
    /// the half projections cost validation loss (+1.2% to +1.7% against f32 in bf16,
    /// docs/precision.md), and on a processor with AMX they run about 4x faster.
    pub fn set_half_projections(&mut self, on: bool) -> Result<(), NnError> {
        self.half_projections = on;
        self.apply_projection_precision()
    }

    /// Sets the projections' precision from `half` and `half_projections`.
    fn apply_projection_precision(&mut self) -> Result<(), NnError> {
        let half = self.half.filter(|_| self.half_projections);
        self.qkv.set_half(half)?;
        self.proj.set_half(half)
    }

    /// Whether the kernel gives its output in the half format: the output projection reads it
    /// so.
    fn out_half(&self) -> bool {
        self.proj.half().is_some()
    }

    /// The format the qkv projection reads its input in (`None`: the weights' dtype).
    pub fn input_half(&self) -> Option<Half> {
        self.qkv.half()
    }

    /// The qkv weight, then the output projection's.
    pub fn params(&self) -> Vec<&Param> {
        let mut p = self.qkv.params();
        p.extend(self.proj.params());
        p
    }

    /// The parameters mutably, in the order of [`CausalSelfAttention::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.qkv.params_mut();
        p.extend(self.proj.params_mut());
        p
    }

    /// `attn(x) (+ residual)` over sequences of `seq` rows, without saving anything.
    pub fn apply(
        &self,
        x: &Tensor,
        seq: usize,
        residual: Option<&Tensor>,
    ) -> Result<Tensor, NnError> {
        let qkv = self.qkv.apply(x)?;
        let (o, _) = kernels::attention_forward(&qkv, seq, self.heads, self.half, self.out_half())?;
        self.proj.apply_plus(&o, residual)
    }

    /// `attn(x) (+ residual)`, saving what the chunk's backward needs.
    pub fn forward(
        &mut self,
        key: Chunk,
        x: &Tensor,
        seq: usize,
        residual: Option<&Tensor>,
    ) -> Result<Tensor, NnError> {
        // Under mixed precision q, k and v are rounded once, kept, and read by the kernel as
        // they are; the probabilities come back in the half format.
        let qkv = store(&self.qkv.forward(key, x)?, self.half)?;
        let (o, probs) =
            kernels::attention_forward(&qkv, seq, self.heads, self.half, self.out_half())?;
        self.saved.insert(key, (qkv, probs, seq));
        self.proj.forward_plus(key, &o, residual)
    }

    /// The input gradient: `do = dy Wproj`, then dq, dk, dv, then `dx = dqkv Wqkv`.
    pub fn backward_input(&mut self, key: Chunk, dy: &Tensor) -> Result<Tensor, NnError> {
        let (qkv, probs, seq) = self.saved.remove(&key).ok_or_else(|| {
            NnError::Stage(format!(
                "attention: backward_input of {key} before its forward"
            ))
        })?;
        let d_out = self.proj.backward_input(key, dy)?;
        // The qkv projection reads its output gradient in its own format.
        let round = self.input_half().is_some();
        let d_qkv =
            kernels::attention_backward(&d_out, &qkv, &probs, seq, self.heads, self.half, round)?;
        self.qkv.backward_input(key, &d_qkv)
    }

    /// The two projections' weight gradients of the chunk.
    pub fn backward_weight(&mut self, key: Chunk) -> Result<(), NnError> {
        self.proj.backward_weight(key)?;
        self.qkv.backward_weight(key)
    }

    /// Saved per-chunk tensors not yet consumed.
    pub fn pending(&self) -> usize {
        self.saved.len() + self.qkv.pending() + self.proj.pending()
    }

    /// Bytes of the saved tensors (fused q, k, v and the probabilities, and the projections').
    pub fn saved_bytes(&self) -> usize {
        self.saved
            .values()
            .map(|(qkv, probs, _)| tensor_bytes(qkv) + tensor_bytes(probs))
            .sum::<usize>()
            + self.qkv.saved_bytes()
            + self.proj.saved_bytes()
    }
}
