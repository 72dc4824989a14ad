//! Causal multi-head scaled dot-product attention on a fused `qkv` buffer.
//!
//! `qkv` is `[rows·seq, 3d]`: each row holds q, then k, then v, each head-major (head `h`
//! owns columns `h·hd .. (h+1)·hd` of its third, `hd = d / heads`). Every (sequence, head)
//! pair is two single-threaded GEMMs read through strides (no copies of q, k or v) and
//! written through strides into the head's columns of the output (no copies back either);
//! the probabilities are kept for the backward.

use candle_core::Tensor;

use super::{
    assume_init_mut, dims2, gemm, gemm_to, max_of, read, tensor, unsupported, Elem, Mat, Uninit,
};
use crate::error::NnError;

/// The shape of one attention call.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    seqs: usize,
    seq: usize,
    d: usize,
    heads: usize,
}

impl Geometry {
    fn new(qkv: &Tensor, seq: usize, heads: usize, what: &str) -> Result<Self, NnError> {
        let (n, three_d) = dims2(qkv, what)?;
        if seq == 0
            || !n.is_multiple_of(seq)
            || !three_d.is_multiple_of(3)
            || heads == 0
            || !(three_d / 3).is_multiple_of(heads)
        {
            return Err(NnError::Stage(format!(
                "{what}: qkv {:?} does not split into sequences of {seq} and {heads} heads",
                qkv.dims()
            )));
        }
        Ok(Geometry {
            seqs: n / seq,
            seq,
            d: three_d / 3,
            heads,
        })
    }

    fn head_dim(&self) -> usize {
        self.d / self.heads
    }

    fn scale(&self) -> f64 {
        1.0 / (self.head_dim() as f64).sqrt()
    }
}

/// `(out, probs)`: `out [rows·seq, d]` holds every head's `softmax(q kᵀ / √hd + causal) v`,
/// `probs [seqs·heads·seq·seq]` the attention probabilities (zero above the diagonal).
pub(crate) fn attention_forward(
    qkv: &Tensor,
    seq: usize,
    heads: usize,
) -> Result<(Tensor, Tensor), NnError> {
    by_dtype!(qkv, "attention", attention_forward_t(qkv, seq, heads))
}

fn attention_forward_t<T: Elem>(
    qkv: &Tensor,
    seq: usize,
    heads: usize,
) -> Result<(Tensor, Tensor), NnError> {
    const WHAT: &str = "attention forward";
    let g = Geometry::new(qkv, seq, heads, WHAT)?;
    let (t, d, hd) = (g.seq, g.d, g.head_dim());
    let scale = T::from_f64(g.scale());
    let mut out = Uninit::<T>::new(g.seqs * t * d);
    let mut probs = Uninit::<T>::new(g.seqs * heads * t * t);
    read::<T, _>(qkv, WHAT, |qkv| {
        let (out, probs) = (out.slots(), probs.slots());
        for s in 0..g.seqs {
            let base = s * t * 3 * d;
            for h in 0..heads {
                let q = Mat::strided(&qkv[base + h * hd..], t, hd, 3 * d, 1);
                let k = Mat::strided(&qkv[base + d + h * hd..], t, hd, 3 * d, 1);
                let v = Mat::strided(&qkv[base + 2 * d + h * hd..], t, hd, 3 * d, 1);
                let p = &mut probs[(s * heads + h) * t * t..][..t * t];
                gemm_to(p, t, q, k.t(), WHAT)?;
                // SAFETY: gemm_to wrote all t x t scores.
                let p = unsafe { assume_init_mut(p) };
                softmax_rows(p, t, scale);
                // This head's columns of the output rows, written in place.
                gemm_to(
                    &mut out[s * t * d + h * hd..],
                    d,
                    Mat::new(p, t, t),
                    v,
                    WHAT,
                )?;
            }
        }
        Ok::<_, NnError>(())
    })??;
    // SAFETY: every (sequence, head) wrote its t x t probabilities and its hd columns of the
    // sequence's t output rows, which together cover both buffers.
    let (out, probs) = unsafe { (out.assume_init(), probs.assume_init()) };
    Ok((
        tensor(out, (g.seqs * t, d), WHAT)?,
        tensor(probs, g.seqs * heads * t * t, WHAT)?,
    ))
}

wide_kernel! {
    /// Row `i` of the `[t, t]` scores `p` becomes `softmax(p[i, ..=i] · scale)`, zeros after.
    fn softmax_rows<T: Elem>(p: &mut [T], t: usize, scale: T) => softmax_rows_inline
}

#[inline(always)]
fn softmax_rows_inline<T: Elem>(p: &mut [T], t: usize, scale: T) {
    for (i, row) in p.chunks_exact_mut(t).enumerate() {
        softmax_causal(row, i, scale);
    }
}

/// `row[..=i] = softmax(row[..=i] · scale)`, `row[i+1..] = 0`.
///
/// One pass per step so that the element-wise ones (scaling, `exp`, normalising) vectorize;
/// the sum of the exponentials keeps its sequential order.
#[inline(always)]
fn softmax_causal<T: Elem>(row: &mut [T], i: usize, scale: T) {
    let (live, masked) = row.split_at_mut(i + 1);
    masked.fill(T::zero());
    for x in live.iter_mut() {
        *x *= scale;
    }
    let max = max_of(live);
    for x in live.iter_mut() {
        *x = (*x - max).exp();
    }
    let mut sum = T::zero();
    for &x in live.iter() {
        sum += x;
    }
    let inv = T::one() / sum;
    for x in live.iter_mut() {
        *x *= inv;
    }
}

/// `dqkv [rows·seq, 3d]` from the output gradient `dout [rows·seq, d]`, the forward's `qkv`
/// and `probs`: `dv = Pᵀ do`, `dS = P ⊙ (dP − rowsum(dP ⊙ P))` with `dP = do vᵀ`,
/// `dq = dS k / √hd`, `dk = dSᵀ q / √hd`.
pub(crate) fn attention_backward(
    dout: &Tensor,
    qkv: &Tensor,
    probs: &Tensor,
    seq: usize,
    heads: usize,
) -> Result<Tensor, NnError> {
    by_dtype!(
        qkv,
        "attention backward",
        attention_backward_t(dout, qkv, probs, seq, heads)
    )
}

fn attention_backward_t<T: Elem>(
    dout: &Tensor,
    qkv: &Tensor,
    probs: &Tensor,
    seq: usize,
    heads: usize,
) -> Result<Tensor, NnError> {
    const WHAT: &str = "attention backward";
    let g = Geometry::new(qkv, seq, heads, WHAT)?;
    let (t, d, hd) = (g.seq, g.d, g.head_dim());
    if dout.dims() != [g.seqs * t, d] || probs.elem_count() != g.seqs * heads * t * t {
        return Err(NnError::Stage(format!(
            "{WHAT}: gradient {:?} or probabilities {:?} do not fit qkv {:?}",
            dout.dims(),
            probs.dims(),
            qkv.dims()
        )));
    }
    let scale = T::from_f64(g.scale());
    let mut dqkv = Uninit::<T>::new(g.seqs * t * 3 * d);
    let mut ds = vec![T::zero(); t * t];
    read::<T, _>(dout, WHAT, |dout| {
        read::<T, _>(qkv, WHAT, |qkv| {
            read::<T, _>(probs, WHAT, |probs| {
                let dqkv = dqkv.slots();
                for s in 0..g.seqs {
                    let base = s * t * 3 * d;
                    for h in 0..heads {
                        let q = Mat::strided(&qkv[base + h * hd..], t, hd, 3 * d, 1);
                        let k = Mat::strided(&qkv[base + d + h * hd..], t, hd, 3 * d, 1);
                        let v = Mat::strided(&qkv[base + 2 * d + h * hd..], t, hd, 3 * d, 1);
                        let dout_h = Mat::strided(&dout[s * t * d + h * hd..], t, hd, d, 1);
                        let p = &probs[(s * heads + h) * t * t..][..t * t];
                        let pm = Mat::new(p, t, t);
                        // This head's columns of q's, k's or v's third, written in place.
                        let third = |third: usize| base + third * d + h * hd;
                        // dv = Pᵀ do
                        gemm_to(&mut dqkv[third(2)..], 3 * d, pm.t(), dout_h, WHAT)?;
                        // dP = do vᵀ, then dS in place.
                        gemm(&mut ds, dout_h, v.t(), false, WHAT)?;
                        softmax_backward(&mut ds, p, t, scale);
                        let dsm = Mat::new(&ds, t, t);
                        gemm_to(&mut dqkv[third(0)..], 3 * d, dsm, k, WHAT)?;
                        gemm_to(&mut dqkv[third(1)..], 3 * d, dsm.t(), q, WHAT)?;
                    }
                }
                Ok::<_, NnError>(())
            })
        })
    })????;
    // SAFETY: every (sequence, head) wrote its hd columns of each third of the sequence's t
    // rows, which together cover the buffer.
    let dqkv = unsafe { dqkv.assume_init() };
    tensor(dqkv, (g.seqs * t, 3 * d), WHAT)
}

wide_kernel! {
    /// `dS = P ⊙ (dP − rowsum(dP ⊙ P)) · scale` in place of `dP` (`[t, t]`, causal rows).
    fn softmax_backward<T: Elem>(ds: &mut [T], p: &[T], t: usize, scale: T) => softmax_backward_inline
}

#[inline(always)]
fn softmax_backward_inline<T: Elem>(ds: &mut [T], p: &[T], t: usize, scale: T) {
    for (i, (dsr, pr)) in ds.chunks_exact_mut(t).zip(p.chunks_exact(t)).enumerate() {
        let live = i + 1;
        let mut dot = T::zero();
        for (&a, &b) in dsr[..live].iter().zip(&pr[..live]) {
            dot += a * b;
        }
        for (x, &pv) in dsr[..live].iter_mut().zip(&pr[..live]) {
            *x = pv * (*x - dot) * scale;
        }
        dsr[live..].fill(T::zero());
    }
}
