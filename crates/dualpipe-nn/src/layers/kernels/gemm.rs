//! Single-threaded GEMMs and the Linear layer's three products on top of them.

use std::mem::MaybeUninit;

use candle_core::Tensor;
use gemm::Parallelism;

use super::{dims2, read, tensor, unsupported, Elem, Uninit};
use crate::error::NnError;

/// A matrix operand read through strides: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, T> {
    pub(super) data: &'a [T],
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) rs: usize,
    pub(super) cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// A row-major `[rows, cols]` matrix.
    pub(crate) fn new(data: &'a [T], rows: usize, cols: usize) -> Self {
        Mat {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// A `[rows, cols]` view whose element `(i, j)` is `data[i * rs + j * cs]` (a head's
    /// columns inside a wider row, for example).
    pub(crate) fn strided(data: &'a [T], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        Mat {
            data,
            rows,
            cols,
            rs,
            cs,
        }
    }

    /// The transpose (a view, no copy).
    pub(crate) fn t(self) -> Self {
        Mat {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }
}

/// `dst = a·b` (or `dst += a·b` when `accumulate`) with `dst` row-major `[a.rows, b.cols]`,
/// single-threaded.
pub(crate) fn gemm<T: Elem>(
    dst: &mut [T],
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    accumulate: bool,
    what: &str,
) -> Result<(), NnError> {
    let (m, n) = (a.rows, b.cols);
    if dst.len() != m * n {
        return Err(shape_error(&a, &b, dst.len(), what));
    }
    // SAFETY: `dst` is a live, initialized slice of `dst.len()` elements, borrowed mutably.
    unsafe { gemm_raw(dst.as_mut_ptr(), dst.len(), n, a, b, accumulate, what) }
}

/// `dst[i·rs + j] = (a·b)[i, j]` for every `i < a.rows`, `j < b.cols`: the product written
/// into rows of a wider (possibly not yet initialized) buffer, such as one head's columns of
/// the attention output, without a zeroing pass or a copy.
pub(crate) fn gemm_to<T: Elem>(
    dst: &mut [MaybeUninit<T>],
    rs: usize,
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    what: &str,
) -> Result<(), NnError> {
    // SAFETY: `dst` is a live slice borrowed mutably; with `accumulate` false gemm only writes
    // (initialized values) into it.
    unsafe {
        gemm_raw(
            dst.as_mut_ptr().cast::<T>(),
            dst.len(),
            rs,
            a,
            b,
            false,
            what,
        )
    }
}

fn shape_error<T>(a: &Mat<'_, T>, b: &Mat<'_, T>, len: usize, what: &str) -> NnError {
    NnError::Stage(format!(
        "{what}: shapes do not fit: [{}, {}] x [{}, {}] into {len} elements",
        a.rows, a.cols, b.rows, b.cols
    ))
}

/// `dst[i·rs + j] = (a·b)[i, j]` (or `+=` when `accumulate`).
///
/// # Safety
///
/// `dst` points to `len` elements that may be written (and, when `accumulate`, are
/// initialized and read) and that alias neither `a` nor `b`.
pub(super) unsafe fn gemm_raw<T: Elem>(
    dst: *mut T,
    len: usize,
    rs: usize,
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    accumulate: bool,
    what: &str,
) -> Result<(), NnError> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let fits = |x: &Mat<'_, T>| {
        x.rows == 0 || x.cols == 0 || (x.rows - 1) * x.rs + (x.cols - 1) * x.cs < x.data.len()
    };
    let dst_fits = m == 0 || n == 0 || (rs >= n && (m - 1) * rs + n <= len);
    if b.rows != k || !dst_fits || !fits(&a) || !fits(&b) {
        return Err(shape_error(&a, &b, len, what));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    // SAFETY: every index gemm touches, (i, l) of a, (l, j) of b, i·rs + j of dst with i < m,
    // l < k, j < n, was checked above to lie inside its buffer; the caller guarantees dst may
    // be written (and read when accumulating) and aliases neither operand.
    unsafe {
        if k == 0 {
            if !accumulate {
                for i in 0..m {
                    for j in 0..n {
                        dst.add(i * rs + j).write(T::zero());
                    }
                }
            }
            return Ok(());
        }
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            rs as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            Parallelism::None,
        );
    }
    Ok(())
}

/// `a·b` as a new row-major `[a.rows, b.cols]` buffer (no zeroing pass).
pub(crate) fn product<T: Elem>(
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    what: &str,
) -> Result<Vec<T>, NnError> {
    let mut out = Uninit::new(a.rows * b.cols);
    gemm_to(out.slots(), b.cols, a, b, what)?;
    // SAFETY: gemm_to wrote all a.rows x b.cols elements of the contiguous output.
    Ok(unsafe { out.assume_init() })
}

/// `x Wᵀ (+ b) (+ residual)` for `x: [n, in]`, `wt = Wᵀ: [in, out]`, `b: [out]`,
/// `residual: [n, out]`.
pub(crate) fn linear_forward(
    x: &Tensor,
    wt: &Tensor,
    b: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Tensor, NnError> {
    by_dtype!(x, "Linear forward", linear_forward_t(x, wt, b, residual))
}

/// The start of a `rows x cols` GEMM output that the product is added to: a copy of
/// `residual` (its shape checked), or `None` when there is none (the product is written into a
/// fresh buffer).
pub(super) fn residual_start<T: Elem>(
    residual: Option<&Tensor>,
    rows: usize,
    cols: usize,
    what: &str,
) -> Result<Option<Vec<T>>, NnError> {
    residual_checked(residual, rows, cols, what)?
        .map(|r| read::<T, _>(r, what, <[T]>::to_vec))
        .transpose()
}

/// The residual, if any, after checking that it is `[rows, cols]`.
pub(super) fn residual_checked<'t>(
    residual: Option<&'t Tensor>,
    rows: usize,
    cols: usize,
    what: &str,
) -> Result<Option<&'t Tensor>, NnError> {
    match residual {
        Some(r) if r.dims() != [rows, cols] => Err(NnError::Stage(format!(
            "{what}: residual is {:?}, expected [{rows}, {cols}]",
            r.dims()
        ))),
        r => Ok(r),
    }
}

/// The shapes of `x Wᵀ + b (+ residual)` for `x: [n, in]` and a weight of `w_in` inputs and
/// `out` outputs, checked, with the output's start: the residual plus the bias on every row
/// (`None` when there is neither). Returns `(n, in, start)`.
pub(super) fn linear_start<T: Elem>(
    x: &Tensor,
    (w_in, out): (usize, usize),
    b: Option<&Tensor>,
    residual: Option<&Tensor>,
    what: &str,
) -> Result<(usize, usize, Option<Vec<T>>), NnError> {
    let (n, input) = dims2(x, what)?;
    if w_in != input {
        return Err(NnError::Stage(format!(
            "{what}: input has {input} features, the weight expects {w_in}"
        )));
    }
    let mut start = residual_start::<T>(residual, n, out, what)?;
    if let Some(b) = b {
        let dst = start.get_or_insert_with(|| vec![T::zero(); n * out]);
        read::<T, _>(b, what, |b| {
            if b.len() != out {
                return Err(NnError::Stage(format!(
                    "{what}: bias has {} elements, expected {out}",
                    b.len()
                )));
            }
            for row in dst.chunks_exact_mut(out) {
                for (d, &bias) in row.iter_mut().zip(b) {
                    *d += bias;
                }
            }
            Ok(())
        })??;
    }
    Ok((n, input, start))
}

/// `(n, out, in)` of a Linear weight gradient `grad_w + dyᵀ x` for `dy: [n, out]`,
/// `x: [n, in]` and `grad_w: [out, in]`, or an error naming the three shapes.
pub(super) fn weight_gradient_dims(
    dy: &Tensor,
    x: &Tensor,
    grad_w: &Tensor,
    what: &str,
) -> Result<(usize, usize, usize), NnError> {
    let (n, out) = dims2(dy, what)?;
    let (xn, input) = dims2(x, what)?;
    if xn != n || grad_w.dims() != [out, input] {
        return Err(NnError::Stage(format!(
            "{what}: dy {:?}, x {:?} and the gradient {:?} do not fit",
            dy.dims(),
            x.dims(),
            grad_w.dims()
        )));
    }
    Ok((n, out, input))
}

/// `start + a·b`, or `a·b` in a fresh buffer when there is no start.
fn product_plus<T: Elem>(
    start: Option<Vec<T>>,
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    what: &str,
) -> Result<Vec<T>, NnError> {
    match start {
        Some(mut dst) => {
            gemm(&mut dst, a, b, true, what)?;
            Ok(dst)
        }
        None => product(a, b, what),
    }
}

fn linear_forward_t<T: Elem>(
    x: &Tensor,
    wt: &Tensor,
    b: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Tensor, NnError> {
    const WHAT: &str = "Linear forward x Wᵀ + b";
    let (w_in, out) = dims2(wt, WHAT)?;
    let (n, input, start) = linear_start::<T>(x, (w_in, out), b, residual, WHAT)?;
    let dst = read::<T, _>(x, WHAT, |x| {
        read::<T, _>(wt, WHAT, |wt| {
            product_plus(start, Mat::new(x, n, input), Mat::new(wt, input, out), WHAT)
        })
    })???;
    tensor(dst, (n, out), WHAT)
}

/// The transpose of a matrix, stored contiguously (blocked copy).
pub(crate) fn transpose(w: &Tensor) -> Result<Tensor, NnError> {
    by_dtype!(w, "transpose", transpose_t(w))
}

fn transpose_t<T: Elem>(w: &Tensor) -> Result<Tensor, NnError> {
    const WHAT: &str = "transposing a weight";
    // Square tiles of this side: a tile's source rows and destination rows stay in cache.
    const BLOCK: usize = 32;
    let (rows, cols) = dims2(w, WHAT)?;
    let out = read::<T, _>(w, WHAT, |w| {
        // Written tile by tile, each destination row's run of a tile contiguously (so the
        // stores stream; the strided side is the loads), into memory not zeroed first.
        let mut out = Uninit::new(rows * cols);
        let slots = out.slots();
        for c0 in (0..cols).step_by(BLOCK) {
            let c_end = (c0 + BLOCK).min(cols);
            for r0 in (0..rows).step_by(BLOCK) {
                let r_end = (r0 + BLOCK).min(rows);
                for c in c0..c_end {
                    let dst = &mut slots[c * rows + r0..c * rows + r_end];
                    for (d, r) in dst.iter_mut().zip(r0..r_end) {
                        d.write(w[r * cols + c]);
                    }
                }
            }
        }
        // SAFETY: the tiles cover every (r, c), so every slot c·rows + r was written.
        unsafe { out.assume_init() }
    })?;
    tensor(out, (cols, rows), WHAT)
}

/// `dy W (+ residual)` for `dy: [n, out]`, `W: [out, in]`, `residual: [n, in]`.
pub(crate) fn linear_backward_input(
    dy: &Tensor,
    w: &Tensor,
    residual: Option<&Tensor>,
) -> Result<Tensor, NnError> {
    by_dtype!(
        dy,
        "Linear backward",
        linear_backward_input_t(dy, w, residual)
    )
}

fn linear_backward_input_t<T: Elem>(
    dy: &Tensor,
    w: &Tensor,
    residual: Option<&Tensor>,
) -> Result<Tensor, NnError> {
    const WHAT: &str = "Linear backward dy W";
    let (n, out) = dims2(dy, WHAT)?;
    let (w_out, input) = dims2(w, WHAT)?;
    if w_out != out {
        return Err(NnError::Stage(format!(
            "{WHAT}: gradient has {out} features, the weight produces {w_out}"
        )));
    }
    let start = residual_start::<T>(residual, n, input, WHAT)?;
    let dst = read::<T, _>(dy, WHAT, |dy| {
        read::<T, _>(w, WHAT, |w| {
            product_plus(start, Mat::new(dy, n, out), Mat::new(w, out, input), WHAT)
        })
    })???;
    tensor(dst, (n, input), WHAT)
}

/// `(grad_w + dyᵀ x, grad_b + Σ_rows dy)` for `dy: [n, out]`, `x: [n, in]`.
pub(crate) fn linear_backward_weight(
    dy: &Tensor,
    x: &Tensor,
    grad_w: &Tensor,
    grad_b: Option<&Tensor>,
) -> Result<(Tensor, Option<Tensor>), NnError> {
    by_dtype!(
        dy,
        "Linear weight gradient",
        linear_backward_weight_t(dy, x, grad_w, grad_b)
    )
}

fn linear_backward_weight_t<T: Elem>(
    dy: &Tensor,
    x: &Tensor,
    grad_w: &Tensor,
    grad_b: Option<&Tensor>,
) -> Result<(Tensor, Option<Tensor>), NnError> {
    const WHAT: &str = "Linear weight gradient dyᵀ x";
    let (n, out, input) = weight_gradient_dims(dy, x, grad_w, WHAT)?;
    let mut dw = read::<T, _>(grad_w, WHAT, <[T]>::to_vec)?;
    read::<T, _>(dy, WHAT, |dy| {
        read::<T, _>(x, WHAT, |x| {
            gemm(
                &mut dw,
                Mat::new(dy, n, out).t(),
                Mat::new(x, n, input),
                true,
                WHAT,
            )
        })
    })???;
    let dw = tensor(dw, (out, input), WHAT)?;
    let db = match grad_b {
        None => None,
        Some(gb) => {
            if gb.dims() != [out] {
                return Err(NnError::Stage(format!(
                    "Linear bias gradient is {:?}, expected [{out}]",
                    gb.dims()
                )));
            }
            let mut sum = vec![T::zero(); out];
            read::<T, _>(dy, WHAT, |dy| {
                for row in dy.chunks_exact(out) {
                    for (s, &g) in sum.iter_mut().zip(row) {
                        *s += g;
                    }
                }
            })?;
            let db = read::<T, _>(gb, WHAT, |gb| {
                gb.iter()
                    .zip(&sum)
                    .map(|(&a, &s)| a + s)
                    .collect::<Vec<T>>()
            })?;
            Some(tensor(db, out, "Linear bias gradient")?)
        }
    };
    Ok((dw, db))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_covers_partial_tiles() {
        // Neither side a multiple of the tile, one side shorter than a tile.
        for (rows, cols) in [(37, 70), (5, 33), (64, 32), (1, 1)] {
            let data: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let w =
                Tensor::from_vec(data.clone(), (rows, cols), &candle_core::Device::Cpu).unwrap();
            let t = transpose(&w).unwrap();
            assert_eq!(t.dims(), [cols, rows]);
            let got = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        got[c * rows + r],
                        data[r * cols + c],
                        "({r}, {c}) of {rows}x{cols}"
                    );
                }
            }
        }
    }

    #[test]
    fn gemm_handles_transposes_and_accumulation() {
        // a: [2, 3], b: [3, 2] stored as its transpose [2, 3].
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0f64];
        let bt = [1.0, 0.0, -1.0, 2.0, 1.0, 0.5f64];
        let mut dst = vec![10.0; 4];
        gemm(
            &mut dst,
            Mat::new(&a, 2, 3),
            Mat::new(&bt, 2, 3).t(),
            true,
            "test",
        )
        .unwrap();
        // a·bᵀ = [[1-3, 2+2+1.5], [4-6, 8+5+3]]
        assert_eq!(dst, vec![8.0, 15.5, 8.0, 26.0]);
        gemm(
            &mut dst,
            Mat::new(&a, 2, 3).t(),
            Mat::new(&a, 2, 3),
            false,
            "test",
        )
        .unwrap_err();
        let mut dst = vec![0.0; 9];
        gemm(
            &mut dst,
            Mat::new(&a, 2, 3).t(),
            Mat::new(&a, 2, 3),
            false,
            "test",
        )
        .unwrap();
        assert_eq!(dst[0], 1.0 + 16.0);
        assert_eq!(dst[5], 2.0 * 3.0 + 5.0 * 6.0);
    }
}
