//! Causal multi-head scaled dot-product attention on a fused `qkv` buffer.
//!
//! `qkv` is `[rows·seq, 3d]`: each row holds q, then k, then v, each head-major (head `h`
//! owns columns `h·hd .. (h+1)·hd` of its third, `hd = d / heads`). Every (sequence, head)
//! pair is two single-threaded GEMMs read through strides (no copies of q, k or v) and
//! written through strides into the head's columns of the output (no copies back either);
//! the probabilities are kept for the backward. Under mixed precision `qkv` and the
//! probabilities are held in bf16 or f16 and the products read them as they are (the half
//! GEMM's fastest path: AMX tiles where there are some), with f32 outputs, leaving out what
//! the causal mask makes zero; the softmax and its gradient stay f32.

use std::mem::MaybeUninit;

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};

use super::half::{gemm_half_to, to_half, HalfElem, Skip};
use super::{
    assume_init_mut, dims2, gemm_to, max_of, read, tensor, unsupported, Elem, Mat, Uninit,
};
use crate::error::{NnError, TensorContext};
use crate::precision::Half;

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
/// `probs [seqs·heads·seq·seq]` the attention probabilities (zero above the diagonal). With
/// `half` set (mixed precision) `qkv` is f32 or already in the half format, the two products
/// read it (and the probabilities) rounded to that format, `probs` are in the half format and
/// `out` is f32, or in the half format too with `round_out` (for a projection that reads it
/// so); `round_out` means nothing without `half`.
pub(crate) fn attention_forward(
    qkv: &Tensor,
    seq: usize,
    heads: usize,
    half: Option<Half>,
    round_out: bool,
) -> Result<(Tensor, Tensor), NnError> {
    const WHAT: &str = "attention";
    match half {
        None => by_dtype!(qkv, WHAT, attention_forward_t(qkv, seq, heads)),
        Some(h) => {
            let qkv = in_half(qkv, h, WHAT)?;
            match h {
                Half::Bf16 => forward_half::<bf16>(&qkv, seq, heads, round_out),
                Half::F16 => forward_half::<f16>(&qkv, seq, heads, round_out),
            }
        }
    }
}

/// `t` (f32, or already in `half`'s format) in `half`'s format.
fn in_half(t: &Tensor, half: Half, what: &str) -> Result<Tensor, NnError> {
    match t.dtype() {
        DType::F32 => to_half(t, half),
        d if d == half.dtype() => Ok(t.clone()),
        other => Err(NnError::Stage(format!(
            "{what}: mixed precision reads f32 or {} tensors, not {other:?}",
            half.name()
        ))),
    }
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
                // SAFETY: the product wrote all t x t scores.
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

/// The forward in mixed precision, `qkv` in `H`: per (sequence, head) the scores `q kᵀ` into
/// an f32 scratch (the tiles above the diagonal left out), the f32 softmax, the
/// probabilities rounded into `probs`, then `P v` over the steps below the diagonal only.
fn forward_half<H: HalfElem>(
    qkv: &Tensor,
    seq: usize,
    heads: usize,
    round_out: bool,
) -> Result<(Tensor, Tensor), NnError> {
    const WHAT: &str = "attention forward (mixed precision)";
    let g = Geometry::new(qkv, seq, heads, WHAT)?;
    let (t, d, hd) = (g.seq, g.d, g.head_dim());
    let scale = g.scale() as f32;
    let mut out = Output::<H>::new(round_out, g.seqs, t * d);
    let mut probs = Uninit::<H>::new(g.seqs * heads * t * t);
    let mut scores = Uninit::<f32>::new(t * t);
    read::<H, _>(qkv, WHAT, |qkv| {
        let probs = probs.slots();
        for s in 0..g.seqs {
            let base = s * t * 3 * d;
            let out_s = out.sequence(s);
            for h in 0..heads {
                let q = Mat::strided(&qkv[base + h * hd..], t, hd, 3 * d, 1);
                let k = Mat::strided(&qkv[base + d + h * hd..], t, hd, 3 * d, 1);
                let v = Mat::strided(&qkv[base + 2 * d + h * hd..], t, hd, 3 * d, 1);
                let sc = scores.slots();
                let (q, kt) = (H::operand(q), H::operand(k.t()));
                gemm_half_to(H::HALF, sc, t, q, kt, Skip::AboveDiagonal, WHAT)?;
                // SAFETY: the product wrote all t x t scores (those above the diagonal with
                // values the softmax does not read).
                let sc = unsafe { assume_init_mut(sc) };
                softmax_rows_half(sc, t, scale);
                let p = &mut probs[(s * heads + h) * t * t..][..t * t];
                H::round(sc, p);
                // SAFETY: round wrote all t x t probabilities.
                let p = unsafe { assume_init_mut(p) };
                // This head's columns of the output rows, written in place.
                let (pm, v) = (H::operand(Mat::new(p, t, t)), H::operand(v));
                gemm_half_to(H::HALF, &mut out_s[h * hd..], d, pm, v, Skip::ALower, WHAT)?;
            }
            // SAFETY: the heads wrote their hd columns of the sequence's t rows, all of them.
            unsafe { out.written(s) };
        }
        Ok::<_, NnError>(())
    })??;
    // SAFETY: every (sequence, head) wrote its t x t probabilities and every sequence its
    // output rows.
    let (out, probs) = unsafe { (out.tensor((g.seqs * t, d), WHAT)?, probs.assume_init()) };
    Ok((
        out,
        Tensor::from_vec(probs, g.seqs * heads * t * t, &Device::Cpu).ctx(WHAT)?,
    ))
}

/// Where a mixed-precision attention writes its output (`out` or `dqkv`), sequence by
/// sequence: straight into an f32 tensor, or into one sequence's f32 scratch that is then
/// rounded into a half-precision tensor (for a GEMM that reads it in that format: the
/// values of rounding the f32 tensor, without it).
enum Output<H> {
    /// The f32 output, `len` elements per sequence.
    F32(Uninit<f32>, usize),
    /// One sequence's f32 scratch, and the rounded output.
    Rounded(Uninit<f32>, Uninit<H>),
}

impl<H: HalfElem> Output<H> {
    /// Room for `seqs` sequences of `len` elements, rounded to `H` when `round`.
    fn new(round: bool, seqs: usize, len: usize) -> Self {
        if round {
            Output::Rounded(Uninit::new(len), Uninit::new(seqs * len))
        } else {
            Output::F32(Uninit::new(seqs * len), len)
        }
    }

    /// The f32 slots of sequence `s`.
    fn sequence(&mut self, s: usize) -> &mut [MaybeUninit<f32>] {
        match self {
            Output::F32(out, len) => &mut out.slots()[s * *len..][..*len],
            Output::Rounded(scratch, _) => scratch.slots(),
        }
    }

    /// Sequence `s` is written: rounds it into place.
    ///
    /// # Safety
    ///
    /// Every slot of [`Output::sequence`]`(s)` was written.
    unsafe fn written(&mut self, s: usize) {
        if let Output::Rounded(scratch, out) = self {
            let len = scratch.slots().len();
            // SAFETY: the caller vouches for the scratch.
            let wide = unsafe { assume_init_mut(scratch.slots()) };
            H::round(wide, &mut out.slots()[s * len..][..len]);
        }
    }

    /// The output tensor of `shape`.
    ///
    /// # Safety
    ///
    /// Every sequence was [`Output::written`].
    unsafe fn tensor(self, shape: (usize, usize), what: &str) -> Result<Tensor, NnError> {
        // SAFETY: as the caller vouches.
        unsafe {
            match self {
                Output::F32(out, _) => tensor(out.assume_init(), shape, what),
                Output::Rounded(_, out) => {
                    Tensor::from_vec(out.assume_init(), shape, &Device::Cpu).ctx(what)
                }
            }
        }
    }
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

wide_kernel! {
    /// [`softmax_rows`] for the mixed-precision forward, whose probabilities are then rounded
    /// to a half format: the exponentials summed in 16 interleaved partial sums (which
    /// vectorize; the sequential sum's chain of adds held about a fifth of the softmax's
    /// samples, and the d-512 bf16 step's softmax went from 1.55% to 1.26%) and the scale (positive)
    /// applied after subtracting the row's largest score. Within a few f32 roundings of
    /// [`softmax_rows`], far below the half format's.
    fn softmax_rows_half(p: &mut [f32], t: usize, scale: f32) => softmax_rows_half_inline
}

#[inline(always)]
fn softmax_rows_half_inline(p: &mut [f32], t: usize, scale: f32) {
    const LANES: usize = 16;
    for (i, row) in p.chunks_exact_mut(t).enumerate() {
        let (live, masked) = row.split_at_mut(i + 1);
        masked.fill(0.0);
        let max = max_of(live);
        let mut sums = [0f32; LANES];
        let mut chunks = live.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            for (sum, x) in sums.iter_mut().zip(chunk) {
                *x = Elem::exp((*x - max) * scale);
                *sum += *x;
            }
        }
        for (sum, x) in sums.iter_mut().zip(chunks.into_remainder()) {
            *x = Elem::exp((*x - max) * scale);
            *sum += *x;
        }
        let inv = 1.0 / sums.iter().sum::<f32>();
        for x in live.iter_mut() {
            *x *= inv;
        }
    }
}

/// `dqkv [rows·seq, 3d]` from the output gradient `dout [rows·seq, d]`, the forward's `qkv`
/// and `probs`: `dv = Pᵀ do`, `dS = P ⊙ (dP − rowsum(dP ⊙ P))` with `dP = do vᵀ`,
/// `dq = dS k / √hd`, `dk = dSᵀ q / √hd`. With `half` set (mixed precision) `dout` is f32,
/// `qkv` and `probs` f32 or already in the half format, and the four products read their
/// operands rounded to that format; `dqkv` is f32, or in the half format with `round_out` (for
/// a projection that reads it so); `round_out` means nothing without `half`.
pub(crate) fn attention_backward(
    dout: &Tensor,
    qkv: &Tensor,
    probs: &Tensor,
    seq: usize,
    heads: usize,
    half: Option<Half>,
    round_out: bool,
) -> Result<Tensor, NnError> {
    const WHAT: &str = "attention backward";
    match half {
        None => by_dtype!(
            qkv,
            WHAT,
            attention_backward_t(dout, qkv, probs, seq, heads)
        ),
        Some(h) => {
            let (qkv, probs) = (in_half(qkv, h, WHAT)?, in_half(probs, h, WHAT)?);
            match h {
                Half::Bf16 => backward_half::<bf16>(dout, &qkv, &probs, seq, heads, round_out),
                Half::F16 => backward_half::<f16>(dout, &qkv, &probs, seq, heads, round_out),
            }
        }
    }
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
    check_backward(&g, dout, probs, qkv, WHAT)?;
    let scale = T::from_f64(g.scale());
    let mut dqkv = Uninit::<T>::new(g.seqs * t * 3 * d);
    let mut ds = Uninit::<T>::new(t * t);
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
                        let ds = ds.slots();
                        gemm_to(ds, t, dout_h, v.t(), WHAT)?;
                        // SAFETY: the product wrote all t x t elements.
                        let ds = unsafe { assume_init_mut(ds) };
                        softmax_backward(ds, p, t, scale);
                        let dsm = Mat::new(ds, t, t);
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

/// The backward in mixed precision, `qkv` and `probs` in `H`, `dout` f32: each product
/// leaves out the steps and tiles the causal mask makes zero; the softmax's gradient runs on
/// the head's probabilities widened into an f32 scratch.
fn backward_half<H: HalfElem>(
    dout: &Tensor,
    qkv: &Tensor,
    probs: &Tensor,
    seq: usize,
    heads: usize,
    round_out: bool,
) -> Result<Tensor, NnError> {
    const WHAT: &str = "attention backward (mixed precision)";
    let g = Geometry::new(qkv, seq, heads, WHAT)?;
    let (t, d, hd) = (g.seq, g.d, g.head_dim());
    check_backward(&g, dout, probs, qkv, WHAT)?;
    let scale = g.scale() as f32;
    let mut dqkv = Output::<H>::new(round_out, g.seqs, t * 3 * d);
    let (mut ds, mut pw) = (Uninit::<f32>::new(t * t), Uninit::<f32>::new(t * t));
    // The products read do and dS rounded, each twice: rounded once into these.
    let (mut dout_half, mut ds_half) = (Uninit::<H>::new(t * d), Uninit::<H>::new(t * t));
    read::<f32, _>(dout, WHAT, |dout| {
        read::<H, _>(qkv, WHAT, |qkv| {
            read::<H, _>(probs, WHAT, |probs| {
                for s in 0..g.seqs {
                    let base = s * t * 3 * d;
                    let dqkv_s = dqkv.sequence(s);
                    let dout_s = dout_half.slots();
                    H::round(&dout[s * t * d..][..t * d], dout_s);
                    // SAFETY: round wrote the sequence's t x d elements.
                    let dout_s = unsafe { assume_init_mut(dout_s) };
                    for h in 0..heads {
                        let q = H::operand(Mat::strided(&qkv[base + h * hd..], t, hd, 3 * d, 1));
                        let k = Mat::strided(&qkv[base + d + h * hd..], t, hd, 3 * d, 1);
                        let v = Mat::strided(&qkv[base + 2 * d + h * hd..], t, hd, 3 * d, 1);
                        let dout_h = H::operand(Mat::strided(&dout_s[h * hd..], t, hd, d, 1));
                        let p = &probs[(s * heads + h) * t * t..][..t * t];
                        let pt = H::operand(Mat::new(p, t, t).t());
                        // This head's columns of q's, k's or v's third, written in place.
                        let third = |third: usize| third * d + h * hd;
                        // dv = Pᵀ do
                        let dv = &mut dqkv_s[third(2)..];
                        gemm_half_to(H::HALF, dv, 3 * d, pt, dout_h, Skip::AUpper, WHAT)?;
                        // dP = do vᵀ, then dS in place.
                        let (ds, pw) = (ds.slots(), pw.slots());
                        let vt = H::operand(v.t());
                        gemm_half_to(H::HALF, ds, t, dout_h, vt, Skip::AboveDiagonal, WHAT)?;
                        H::widen(p, pw);
                        // SAFETY: the product wrote all t x t elements (those above the
                        // diagonal with values softmax_backward does not read), widen all of
                        // pw.
                        let (ds, pw) = unsafe { (assume_init_mut(ds), assume_init_mut(pw)) };
                        softmax_backward(ds, pw, t, scale);
                        let dsh = ds_half.slots();
                        H::round(ds, dsh);
                        // SAFETY: round wrote all t x t elements.
                        let dsm = Mat::new(unsafe { assume_init_mut(dsh) }, t, t);
                        let (dsm, dsmt) = (H::operand(dsm), H::operand(dsm.t()));
                        let dq = &mut dqkv_s[third(0)..];
                        gemm_half_to(H::HALF, dq, 3 * d, dsm, H::operand(k), Skip::ALower, WHAT)?;
                        let dk = &mut dqkv_s[third(1)..];
                        gemm_half_to(H::HALF, dk, 3 * d, dsmt, q, Skip::AUpper, WHAT)?;
                    }
                    // SAFETY: the heads wrote their hd columns of each third of the
                    // sequence's t rows, all of them.
                    unsafe { dqkv.written(s) };
                }
                Ok::<_, NnError>(())
            })
        })
    })????;
    // SAFETY: every sequence was written.
    unsafe { dqkv.tensor((g.seqs * t, 3 * d), WHAT) }
}

/// An error unless the output gradient and the probabilities fit `qkv`'s geometry.
fn check_backward(
    g: &Geometry,
    dout: &Tensor,
    probs: &Tensor,
    qkv: &Tensor,
    what: &str,
) -> Result<(), NnError> {
    let t = g.seq;
    if dout.dims() != [g.seqs * t, g.d] || probs.elem_count() != g.seqs * g.heads * t * t {
        return Err(NnError::Stage(format!(
            "{what}: gradient {:?} or probabilities {:?} do not fit qkv {:?}",
            dout.dims(),
            probs.dims(),
            qkv.dims()
        )));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};
    use half::bf16;

    use super::*;

    /// The largest difference between two f32 tensors' elements.
    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        let (a, b) = (a.flatten_all().unwrap(), b.flatten_all().unwrap());
        let (a, b) = (a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap());
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// A half-precision tensor widened to f32.
    fn wide(t: &Tensor) -> Tensor {
        t.to_dtype(candle_core::DType::F32).unwrap()
    }

    /// The mixed-precision softmax sums in lanes: the f32 softmax's values within a few f32
    /// roundings, rows summing to 1, exact zeros above the diagonal, at lengths around the
    /// lanes' 16.
    #[test]
    fn the_lane_sum_softmax_is_the_softmax() {
        for t in [1, 5, 16, 17, 40] {
            let scores: Vec<f32> = (0..t * t)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 37.0)
                .collect();
            let (mut want, mut got) = (scores.clone(), scores);
            softmax_rows(&mut want, t, 0.125);
            softmax_rows_half(&mut got, t, 0.125);
            for (i, (w, g)) in want.chunks(t).zip(got.chunks(t)).enumerate() {
                for (&a, &b) in w.iter().zip(g) {
                    assert!(
                        (a - b).abs() <= 1e-6 * a.abs().max(1e-30),
                        "t {t} row {i}: {a} {b}"
                    );
                }
                assert!(g[i + 1..].iter().all(|&x| x == 0.0), "t {t} row {i}");
                assert!((g.iter().sum::<f32>() - 1.0).abs() < 1e-5, "t {t} row {i}");
            }
        }
    }

    #[test]
    fn mixed_precision_products_read_rounded_operands() {
        // 2 sequences of 24, 2 heads of 8.
        let (seq, heads, d) = (24, 2, 16);
        let n = 2 * seq;
        let vals: Vec<f32> = (0..n * 3 * d)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 1.7)
            .collect();
        let rounded: Vec<f32> = vals.iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
        let qkv = Tensor::from_vec(vals, (n, 3 * d), &Device::Cpu).unwrap();
        let qkv_r = Tensor::from_vec(rounded, (n, 3 * d), &Device::Cpu).unwrap();
        let qkv_h = qkv.to_dtype(candle_core::DType::BF16).unwrap();
        let (out_m, p_m) = attention_forward(&qkv, seq, heads, Some(Half::Bf16), false).unwrap();
        let (out_r, p_r) = attention_forward(&qkv_r, seq, heads, None, false).unwrap();
        let (out_x, p_x) = attention_forward(&qkv, seq, heads, None, false).unwrap();
        // The probabilities come back in bf16; qkv given already rounded gives the same bits.
        assert_eq!(p_m.dtype(), candle_core::DType::BF16);
        let (out_h, p_h) = attention_forward(&qkv_h, seq, heads, Some(Half::Bf16), false).unwrap();
        assert_eq!(max_diff(&out_h, &out_m), 0.0);
        assert_eq!(max_diff(&wide(&p_h), &wide(&p_m)), 0.0);
        // The scores are products of the rounded q and k (exact in f32): the probabilities
        // are the f32 ones of the rounded input up to the sums' order and their own rounding
        // to bf16 (2^-9 of at most 1), not the unrounded input's.
        let p_m = wide(&p_m);
        assert!(max_diff(&p_m, &p_r) < 2.5e-3, "{}", max_diff(&p_m, &p_r));
        assert!(max_diff(&p_r, &p_x) > 1e-4, "{}", max_diff(&p_r, &p_x));
        // Zero above the diagonal, exactly.
        let p: Vec<f32> = p_m.to_vec1().unwrap();
        for (h, head) in p.chunks(seq * seq).enumerate() {
            for i in 0..seq {
                assert!(
                    head[i * seq + i + 1..(i + 1) * seq]
                        .iter()
                        .all(|&x| x == 0.0),
                    "{h} {i}"
                );
            }
        }
        // The output multiplies the probabilities rounded to bf16 too.
        assert!(max_diff(&out_m, &out_r) > 1e-5 && max_diff(&out_m, &out_r) < 3e-2);
        assert!(max_diff(&out_m, &out_x) < 3e-2);
        // The backward: close to f32 on the rounded operands, the same bits from rounded or
        // f32 inputs, and f32 out.
        let dout = Tensor::from_vec(
            (0..n * d)
                .map(|i| (i * 104729 % 997) as f32 / 498.0 - 1.0)
                .collect(),
            (n, d),
            &Device::Cpu,
        )
        .unwrap();
        let g_m =
            attention_backward(&dout, &qkv, &p_m, seq, heads, Some(Half::Bf16), false).unwrap();
        let g_h =
            attention_backward(&dout, &qkv_h, &p_h, seq, heads, Some(Half::Bf16), false).unwrap();
        let g_r = attention_backward(&dout, &qkv_r, &p_r, seq, heads, None, false).unwrap();
        assert_eq!(g_m.dtype(), candle_core::DType::F32);
        assert_eq!(max_diff(&g_m, &g_h), 0.0);
        assert!(max_diff(&g_m, &g_r) < 5e-2, "{}", max_diff(&g_m, &g_r));
        // Rounded outputs: the f32 outputs rounded, bit for bit.
        let (out_o, _) = attention_forward(&qkv, seq, heads, Some(Half::Bf16), true).unwrap();
        let g_o = attention_backward(&dout, &qkv, &p_m, seq, heads, Some(Half::Bf16), true);
        let g_o = g_o.unwrap();
        assert_eq!(out_o.dtype(), candle_core::DType::BF16);
        assert_eq!(g_o.dtype(), candle_core::DType::BF16);
        let bf = |t: &Tensor| wide(&t.to_dtype(candle_core::DType::BF16).unwrap());
        assert_eq!(max_diff(&wide(&out_o), &bf(&out_m)), 0.0);
        assert_eq!(max_diff(&wide(&g_o), &bf(&g_m)), 0.0);
        // f64 tensors have no mixed-precision products.
        let q64 = qkv.to_dtype(candle_core::DType::F64).unwrap();
        let err = attention_forward(&q64, seq, heads, Some(Half::Bf16), false).unwrap_err();
        assert!(err.to_string().contains("F64"), "{err}");
    }
}
