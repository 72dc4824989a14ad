//! Token-level kernels: the embedding lookup and its scatter-add gradient, and the mean
//! next-token cross-entropy with its gradient.

use candle_core::Tensor;

use super::{dims2, max_of, read, tensor, unsupported, Elem};
use crate::error::NnError;

/// `h[r·seq + t] = tok[ids[r·seq + t]] + pos[t]` for `ids` of `rows·seq` tokens; `seq` is at
/// most the rows of `pos`.
pub(crate) fn embedding_forward(
    ids: &[u32],
    seq: usize,
    tok: &Tensor,
    pos: &Tensor,
) -> Result<Tensor, NnError> {
    by_dtype!(tok, "embedding", embedding_forward_t(ids, seq, tok, pos))
}

fn check_ids(ids: &[u32], seq: usize, vocab: usize, positions: usize) -> Result<(), NnError> {
    if seq == 0 || !ids.len().is_multiple_of(seq) || seq > positions {
        return Err(NnError::Stage(format!(
            "embedding: {} tokens do not split into sequences of {seq} (at most {positions})",
            ids.len()
        )));
    }
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(NnError::Stage(format!(
            "embedding: token {bad} is outside the vocabulary of {vocab}"
        )));
    }
    Ok(())
}

fn embedding_forward_t<T: Elem>(
    ids: &[u32],
    seq: usize,
    tok: &Tensor,
    pos: &Tensor,
) -> Result<Tensor, NnError> {
    const WHAT: &str = "embedding forward";
    let (vocab, d) = dims2(tok, WHAT)?;
    let (positions, pd) = dims2(pos, WHAT)?;
    if pd != d {
        return Err(NnError::Stage(format!(
            "{WHAT}: token width {d} and position width {pd} differ"
        )));
    }
    check_ids(ids, seq, vocab, positions)?;
    let h = read::<T, _>(tok, WHAT, |tok| {
        read::<T, _>(pos, WHAT, |pos| {
            let mut h = vec![T::zero(); ids.len() * d];
            for (i, (row, &id)) in h.chunks_exact_mut(d).zip(ids).enumerate() {
                let tr = &tok[id as usize * d..][..d];
                let pr = &pos[(i % seq) * d..][..d];
                for ((o, &a), &b) in row.iter_mut().zip(tr).zip(pr) {
                    *o = a + b;
                }
            }
            h
        })
    })??;
    tensor(h, (ids.len(), d), WHAT)
}

/// `(grad_tok, grad_pos)` plus the scatter-add of `dh [rows·seq, d]`: row `i` adds into
/// token row `ids[i]` and position row `i mod seq`.
pub(crate) fn embedding_backward_weight(
    ids: &[u32],
    seq: usize,
    dh: &Tensor,
    grad_tok: &Tensor,
    grad_pos: &Tensor,
) -> Result<(Tensor, Tensor), NnError> {
    by_dtype!(
        dh,
        "embedding gradient",
        embedding_backward_weight_t(ids, seq, dh, grad_tok, grad_pos)
    )
}

fn embedding_backward_weight_t<T: Elem>(
    ids: &[u32],
    seq: usize,
    dh: &Tensor,
    grad_tok: &Tensor,
    grad_pos: &Tensor,
) -> Result<(Tensor, Tensor), NnError> {
    const WHAT: &str = "embedding gradient";
    let (vocab, d) = dims2(grad_tok, WHAT)?;
    let (positions, _) = dims2(grad_pos, WHAT)?;
    check_ids(ids, seq, vocab, positions)?;
    if dh.dims() != [ids.len(), d] || grad_pos.dims() != [positions, d] {
        return Err(NnError::Stage(format!(
            "{WHAT}: gradient {:?} does not fit {} tokens of width {d}",
            dh.dims(),
            ids.len()
        )));
    }
    let mut gt = read::<T, _>(grad_tok, WHAT, <[T]>::to_vec)?;
    let mut gp = read::<T, _>(grad_pos, WHAT, <[T]>::to_vec)?;
    read::<T, _>(dh, WHAT, |dh| {
        for (i, (row, &id)) in dh.chunks_exact(d).zip(ids).enumerate() {
            for (o, &g) in gt[id as usize * d..][..d].iter_mut().zip(row) {
                *o += g;
            }
            for (o, &g) in gp[(i % seq) * d..][..d].iter_mut().zip(row) {
                *o += g;
            }
        }
    })?;
    Ok((
        tensor(gt, (vocab, d), WHAT)?,
        tensor(gp, (positions, d), WHAT)?,
    ))
}

/// `(mean_i −log softmax(logits_i)[targets_i], grad)` with `grad = scale (softmax − onehot) / n`
/// for `logits [n, vocab]`; the loss is summed in f64.
pub(crate) fn cross_entropy(
    logits: &Tensor,
    targets: &[u32],
    scale: f64,
) -> Result<(f64, Tensor), NnError> {
    by_dtype!(
        logits,
        "cross-entropy",
        cross_entropy_t(logits, targets, scale)
    )
}

fn cross_entropy_t<T: Elem>(
    logits: &Tensor,
    targets: &[u32],
    scale: f64,
) -> Result<(f64, Tensor), NnError> {
    const WHAT: &str = "cross-entropy";
    let (n, vocab) = dims2(logits, WHAT)?;
    if targets.len() != n || n == 0 {
        return Err(NnError::Stage(format!(
            "{WHAT}: {} targets for {n} rows of logits",
            targets.len()
        )));
    }
    if let Some(bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        return Err(NnError::Stage(format!(
            "{WHAT}: target {bad} is outside the vocabulary of {vocab}"
        )));
    }
    let s = T::from_f64(scale / n as f64);
    let (sum, grad) = read::<T, _>(logits, WHAT, |z| {
        let mut grad = vec![T::zero(); n * vocab];
        let sum = cross_entropy_rows(z, targets, &mut grad, s);
        (sum, grad)
    })?;
    Ok((sum / n as f64, tensor(grad, (n, vocab), WHAT)?))
}

wide_kernel! {
    /// Row by row of `z` (`targets.len()` rows): `grad = s (softmax(z) − onehot)`; returns the
    /// sum of `−log softmax(z)[target]` in f64.
    fn cross_entropy_rows<T: Elem>(z: &[T], targets: &[u32], grad: &mut [T], s: T) -> f64 => cross_entropy_rows_inline
}

#[inline(always)]
fn cross_entropy_rows_inline<T: Elem>(z: &[T], targets: &[u32], grad: &mut [T], s: T) -> f64 {
    let vocab = z.len() / targets.len();
    let mut sum = 0.0f64;
    for ((zr, gr), &t) in z
        .chunks_exact(vocab)
        .zip(grad.chunks_exact_mut(vocab))
        .zip(targets)
    {
        let max = max_of(zr);
        for (g, &v) in gr.iter_mut().zip(zr) {
            *g = (v - max).exp();
        }
        let mut total = T::zero();
        for &g in gr.iter() {
            total += g;
        }
        sum += (total.ln() + max - zr[t as usize]).to_f64();
        let inv = T::one() / total;
        for g in gr.iter_mut() {
            *g = *g * inv * s;
        }
        gr[t as usize] -= s;
    }
    sum
}
