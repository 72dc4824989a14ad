//! Token and learned position embeddings.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::Tensor;
use dualpipe_schedule::Chunk;

use super::{kernels, tensor_bytes, Param};
use crate::error::{NnError, TensorContext};

/// `h[r, t] = tok_emb[ids[r, t]] + pos_emb[t]` on `rows` sequences of `seq` token ids, with
/// `tok_emb: [vocab, d]` and `pos_emb: [max_seq, d]`.
///
/// There is no input gradient (the input is token ids): `backward_input` only saves the output
/// gradient, and `backward_weight` scatter-adds it into the two tables' gradients.
#[derive(Debug)]
pub struct Embedding {
    tok: Param,
    pos: Param,
    saved_ids: HashMap<Chunk, (Arc<[u32]>, usize)>,
    saved_grad: HashMap<Chunk, (Arc<[u32]>, usize, Tensor)>,
}

impl Embedding {
    /// The layer from its token table `[vocab, d]` and position table `[max_seq, d]`.
    pub fn from_tensors(tok: Tensor, pos: Tensor) -> Result<Self, NnError> {
        let (_, d) = tok.dims2().ctx("token embedding must be [vocab, d]")?;
        let (_, pd) = pos.dims2().ctx("position embedding must be [seq_len, d]")?;
        if d != pd {
            return Err(NnError::Config(format!(
                "token embedding width {d} and position embedding width {pd} differ"
            )));
        }
        Ok(Embedding {
            tok: Param::new(tok)?,
            pos: Param::new(pos)?,
            saved_ids: HashMap::new(),
            saved_grad: HashMap::new(),
        })
    }

    /// The token table, then the position table.
    pub fn params(&self) -> Vec<&Param> {
        vec![&self.tok, &self.pos]
    }

    /// The parameters mutably, in the order of [`Embedding::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        vec![&mut self.tok, &mut self.pos]
    }

    /// The embeddings of `ids` (`rows·seq` ids, row-major) without saving anything.
    pub fn apply(&self, ids: &[u32], seq: usize) -> Result<Tensor, NnError> {
        kernels::embedding_forward(ids, seq, &self.tok.value, &self.pos.value)
    }

    /// The embeddings of the chunk's ids; keeps the ids for the weight gradient.
    pub fn forward(&mut self, key: Chunk, ids: Arc<[u32]>, seq: usize) -> Result<Tensor, NnError> {
        let h = self.apply(&ids, seq)?;
        self.saved_ids.insert(key, (ids, seq));
        Ok(h)
    }

    /// Saves the output gradient `dh [rows·seq, d]` for [`Embedding::backward_weight`].
    pub fn backward_input(&mut self, key: Chunk, dh: &Tensor) -> Result<(), NnError> {
        let (ids, seq) = self.saved_ids.remove(&key).ok_or_else(|| {
            NnError::Stage(format!(
                "Embedding: backward_input of {key} before its forward"
            ))
        })?;
        self.saved_grad.insert(key, (ids, seq, dh.clone()));
        Ok(())
    }

    /// Scatter-adds the chunk's gradient into both tables' gradients.
    pub fn backward_weight(&mut self, key: Chunk) -> Result<(), NnError> {
        let (ids, seq, dh) = self.saved_grad.remove(&key).ok_or_else(|| {
            NnError::Stage(format!(
                "Embedding: backward_weight of {key} before its backward_input"
            ))
        })?;
        let (gt, gp) =
            kernels::embedding_backward_weight(&ids, seq, &dh, &self.tok.grad, &self.pos.grad)?;
        self.tok.grad = gt;
        self.pos.grad = gp;
        Ok(())
    }

    /// Chunks whose weight gradient has not run yet.
    pub fn pending(&self) -> usize {
        self.saved_ids.len() + self.saved_grad.len()
    }

    /// Bytes of the saved output gradients (the saved ids are shared with the step's batch and
    /// not counted).
    pub fn saved_bytes(&self) -> usize {
        self.saved_grad
            .values()
            .map(|(_, _, dh)| tensor_bytes(dh))
            .sum()
    }
}
