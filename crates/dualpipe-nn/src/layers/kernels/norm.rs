//! RMSNorm with a weight: `y = x / rms(x) ⊙ w`, `rms(x) = √(mean(x²) + eps)` per row.

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};

use std::mem::MaybeUninit;

use super::half::HalfElem;
use super::{assume_init_mut, dims2, read, tensor, unsupported, Elem, Uninit};
use crate::error::{NnError, TensorContext};
use crate::precision::Half;

fn check_weight(x: &Tensor, w: &Tensor, what: &str) -> Result<(usize, usize), NnError> {
    let (n, d) = dims2(x, what)?;
    if w.dims() != [d] {
        return Err(NnError::Stage(format!(
            "{what}: weight is {:?}, rows have {d} features",
            w.dims()
        )));
    }
    Ok((n, d))
}

/// `(y, inv_rms)`: the normalized rows and `1 / rms(x)` of each row (`[n]`).
pub(crate) fn rms_norm_forward(
    x: &Tensor,
    w: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor), NnError> {
    by_dtype!(x, "RMSNorm", rms_norm_forward_t(x, w, eps))
}

fn rms_norm_forward_t<T: Elem>(
    x: &Tensor,
    w: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor), NnError> {
    const WHAT: &str = "RMSNorm forward";
    let (n, d) = check_weight(x, w, WHAT)?;
    let (eps, inv_d) = (T::from_f64(eps), T::from_f64(1.0 / d as f64));
    let (y, inv) = read::<T, _>(x, WHAT, |x| {
        read::<T, _>(w, WHAT, |w| {
            let mut y = Uninit::new(n * d);
            let inv = forward_rows(x, w, y.slots(), inv_d, eps);
            // SAFETY: forward_rows wrote every row's d elements.
            (unsafe { y.assume_init() }, inv)
        })
    })??;
    Ok((tensor(y, (n, d), WHAT)?, tensor(inv, n, WHAT)?))
}

/// `(y, inv_rms)` as [`rms_norm_forward`] for f32 `x` and `w`, `y` rounded to `half` row
/// block by row block as it is made (for a GEMM that reads it in that format): the values of
/// `to_half(y)` without the f32 `y`.
pub(crate) fn rms_norm_forward_half(
    x: &Tensor,
    w: &Tensor,
    eps: f64,
    half: Half,
) -> Result<(Tensor, Tensor), NnError> {
    match half {
        Half::Bf16 => forward_half::<bf16>(x, w, eps),
        Half::F16 => forward_half::<f16>(x, w, eps),
    }
}

/// Rows per block of [`rms_norm_forward_half`]'s f32 scratch.
const ROWS: usize = 8;

fn forward_half<H: HalfElem>(
    x: &Tensor,
    w: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor), NnError> {
    const WHAT: &str = "RMSNorm forward (mixed precision)";
    if x.dtype() != DType::F32 {
        return Err(NnError::Stage(format!(
            "{WHAT}: mixed precision runs on f32 activations, not {:?}",
            x.dtype()
        )));
    }
    let (n, d) = check_weight(x, w, WHAT)?;
    // As the f32 path makes them (rounded from f64), so that the rows are its rows.
    let (eps, inv_d) = (eps as f32, (1.0 / d as f64) as f32);
    let (y, inv) = read::<f32, _>(x, WHAT, |x| {
        read::<f32, _>(w, WHAT, |w| {
            let mut y = Uninit::<H>::new(n * d);
            let mut scratch = Uninit::<f32>::new(ROWS.min(n) * d);
            let mut inv = Vec::with_capacity(n);
            for (xs, ys) in x.chunks(ROWS * d).zip(y.slots().chunks_mut(ROWS * d)) {
                let tmp = &mut scratch.slots()[..xs.len()];
                inv.extend(forward_rows(xs, w, tmp, inv_d, eps));
                // SAFETY: forward_rows wrote every row of tmp.
                H::round(unsafe { assume_init_mut(tmp) }, ys);
            }
            // SAFETY: every block of rows was rounded into y.
            (unsafe { y.assume_init() }, inv)
        })
    })??;
    Ok((
        Tensor::from_vec(y, (n, d), &Device::Cpu).ctx(WHAT)?,
        tensor(inv, n, WHAT)?,
    ))
}

/// `dx (+ residual)` for the output gradient `g`: with `x̂ = x / rms` and `u = g ⊙ w`,
/// `dx = (u − x̂ mean(u ⊙ x̂)) / rms`.
pub(crate) fn rms_norm_backward_input(
    g: &Tensor,
    x: &Tensor,
    w: &Tensor,
    inv_rms: &Tensor,
    residual: Option<&Tensor>,
) -> Result<Tensor, NnError> {
    by_dtype!(
        x,
        "RMSNorm backward",
        rms_norm_backward_input_t(g, x, w, inv_rms, residual)
    )
}

fn rms_norm_backward_input_t<T: Elem>(
    g: &Tensor,
    x: &Tensor,
    w: &Tensor,
    inv_rms: &Tensor,
    residual: Option<&Tensor>,
) -> Result<Tensor, NnError> {
    const WHAT: &str = "RMSNorm backward";
    let (n, d) = check_weight(x, w, WHAT)?;
    if g.dims() != [n, d] || inv_rms.dims() != [n] || residual.is_some_and(|r| r.dims() != [n, d]) {
        return Err(NnError::Stage(format!(
            "{WHAT}: gradient {:?} does not fit the input {:?}",
            g.dims(),
            x.dims()
        )));
    }
    let inv_d = T::from_f64(1.0 / d as f64);
    let mut dx = match residual {
        Some(r) => read::<T, _>(r, WHAT, <[T]>::to_vec)?,
        None => vec![T::zero(); n * d],
    };
    read::<T, _>(g, WHAT, |g| {
        read::<T, _>(x, WHAT, |x| {
            read::<T, _>(w, WHAT, |w| {
                read::<T, _>(inv_rms, WHAT, |inv| {
                    backward_rows(g, x, w, inv, &mut dx, inv_d)
                })
            })
        })
    })????;
    tensor(dx, (n, d), WHAT)
}

/// `grad_w + Σ_rows g ⊙ x / rms`.
pub(crate) fn rms_norm_backward_weight(
    g: &Tensor,
    x: &Tensor,
    inv_rms: &Tensor,
    grad_w: &Tensor,
) -> Result<Tensor, NnError> {
    by_dtype!(
        x,
        "RMSNorm weight gradient",
        rms_norm_backward_weight_t(g, x, inv_rms, grad_w)
    )
}

fn rms_norm_backward_weight_t<T: Elem>(
    g: &Tensor,
    x: &Tensor,
    inv_rms: &Tensor,
    grad_w: &Tensor,
) -> Result<Tensor, NnError> {
    const WHAT: &str = "RMSNorm weight gradient";
    let (n, d) = check_weight(x, grad_w, WHAT)?;
    if g.dims() != [n, d] || inv_rms.dims() != [n] {
        return Err(NnError::Stage(format!(
            "{WHAT}: gradient {:?} does not fit the input {:?}",
            g.dims(),
            x.dims()
        )));
    }
    let mut dw = read::<T, _>(grad_w, WHAT, <[T]>::to_vec)?;
    read::<T, _>(g, WHAT, |g| {
        read::<T, _>(x, WHAT, |x| {
            read::<T, _>(inv_rms, WHAT, |inv| weight_rows(g, x, inv, &mut dw))
        })
    })???;
    tensor(dw, d, WHAT)
}

wide_kernel! {
    /// `y = x / rms(x) ⊙ w` row by row (`w.len()` columns), every slot of `y` written; returns
    /// `1 / rms` of each row.
    fn forward_rows<T: Elem>(x: &[T], w: &[T], y: &mut [MaybeUninit<T>], inv_d: T, eps: T) -> Vec<T> => forward_rows_inline
}

#[inline(always)]
fn forward_rows_inline<T: Elem>(
    x: &[T],
    w: &[T],
    y: &mut [MaybeUninit<T>],
    inv_d: T,
    eps: T,
) -> Vec<T> {
    let d = w.len();
    let mut inv = Vec::with_capacity(x.len() / d);
    for (xr, yr) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
        let mut ss = T::zero();
        for &v in xr {
            ss += v * v;
        }
        let iv = T::one() / (ss * inv_d + eps).sqrt();
        for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
            o.write(v * iv * g);
        }
        inv.push(iv);
    }
    inv
}

wide_kernel! {
    /// `dx += (u − x̂ mean(u ⊙ x̂)) / rms` row by row, `u = g ⊙ w`, `x̂ = x / rms`.
    fn backward_rows<T: Elem>(g: &[T], x: &[T], w: &[T], inv: &[T], dx: &mut [T], inv_d: T) => backward_rows_inline
}

#[inline(always)]
fn backward_rows_inline<T: Elem>(g: &[T], x: &[T], w: &[T], inv: &[T], dx: &mut [T], inv_d: T) {
    let d = w.len();
    for (((gr, xr), dr), &iv) in g
        .chunks_exact(d)
        .zip(x.chunks_exact(d))
        .zip(dx.chunks_exact_mut(d))
        .zip(inv)
    {
        let mut dot = T::zero();
        for ((&gv, &xv), &wv) in gr.iter().zip(xr).zip(w) {
            dot += gv * wv * xv * iv;
        }
        let m = dot * inv_d;
        for (((o, &gv), &xv), &wv) in dr.iter_mut().zip(gr).zip(xr).zip(w) {
            *o += (gv * wv - xv * iv * m) * iv;
        }
    }
}

wide_kernel! {
    /// `dw += Σ_rows g ⊙ x / rms`.
    fn weight_rows<T: Elem>(g: &[T], x: &[T], inv: &[T], dw: &mut [T]) => weight_rows_inline
}

#[inline(always)]
fn weight_rows_inline<T: Elem>(g: &[T], x: &[T], inv: &[T], dw: &mut [T]) {
    let d = dw.len();
    for ((gr, xr), &iv) in g.chunks_exact(d).zip(x.chunks_exact(d)).zip(inv) {
        for ((o, &gv), &xv) in dw.iter_mut().zip(gr).zip(xr) {
            *o += gv * xv * iv;
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::*;

    /// The rounded output is bit for bit the f32 output rounded, over several blocks of rows
    /// and a partial one, and `1/rms` is the f32 one.
    #[test]
    fn the_half_output_is_the_f32_output_rounded() {
        let (n, d) = (2 * ROWS + 3, 40);
        let x: Vec<f32> = (0..n * d)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0)
            .collect();
        let w: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 / 31.0).collect();
        let x = Tensor::from_vec(x, (n, d), &Device::Cpu).unwrap();
        let w = Tensor::from_vec(w, d, &Device::Cpu).unwrap();
        // The values as f32 (exact for the half formats); no NaN among them, so equal
        // values are equal bits up to the sign of zero.
        let f32s = |t: &Tensor| -> Vec<f32> {
            let t = t.to_dtype(DType::F32).unwrap();
            t.flatten_all().unwrap().to_vec1().unwrap()
        };
        let (y, inv) = rms_norm_forward(&x, &w, 1e-5).unwrap();
        for half in [Half::Bf16, Half::F16] {
            let (yh, invh) = rms_norm_forward_half(&x, &w, 1e-5, half).unwrap();
            assert_eq!(yh.dtype(), half.dtype());
            let want = y.to_dtype(half.dtype()).unwrap();
            assert_eq!(f32s(&yh), f32s(&want), "{half:?}");
            assert_eq!(f32s(&invh), f32s(&inv), "{half:?}");
        }
        let x64 = x.to_dtype(DType::F64).unwrap();
        let err = rms_norm_forward_half(&x64, &w, 1e-5, Half::Bf16).unwrap_err();
        assert!(err.to_string().contains("F64"), "{err}");
    }
}
