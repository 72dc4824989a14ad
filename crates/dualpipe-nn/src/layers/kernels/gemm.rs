//! Single-threaded GEMMs and the Linear layer's three products on top of them.

use candle_core::Tensor;
use gemm::Parallelism;

use super::{dims2, read, tensor, unsupported, Elem};
use crate::error::NnError;

/// A matrix operand read through strides: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
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
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let fits = |x: &Mat<'_, T>| {
        x.rows == 0 || x.cols == 0 || (x.rows - 1) * x.rs + (x.cols - 1) * x.cs < x.data.len()
    };
    if b.rows != k || dst.len() != m * n || !fits(&a) || !fits(&b) {
        return Err(NnError::Stage(format!(
            "{what}: shapes do not fit: [{m}, {k}] x [{}, {n}] into {} elements",
            b.rows,
            dst.len()
        )));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if !accumulate {
            dst.fill(T::zero());
        }
        return Ok(());
    }
    // SAFETY: every index gemm reads, (i, l) of a, (l, j) of b, (i, j) of dst with i < m,
    // l < k, j < n, was checked above to lie inside its slice; dst is borrowed mutably and
    // cannot alias a or b.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
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

/// A `rows x cols` output buffer for a GEMM: a copy of `residual` when one is added to the
/// product (its shape checked), zeros otherwise.
fn output_buffer<T: Elem>(
    residual: Option<&Tensor>,
    rows: usize,
    cols: usize,
    what: &str,
) -> Result<Vec<T>, NnError> {
    match residual {
        Some(r) if r.dims() != [rows, cols] => Err(NnError::Stage(format!(
            "{what}: residual is {:?}, expected [{rows}, {cols}]",
            r.dims()
        ))),
        Some(r) => read::<T, _>(r, what, <[T]>::to_vec),
        None => Ok(vec![T::zero(); rows * cols]),
    }
}

fn linear_forward_t<T: Elem>(
    x: &Tensor,
    wt: &Tensor,
    b: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Tensor, NnError> {
    const WHAT: &str = "Linear forward x Wᵀ + b";
    let (n, input) = dims2(x, WHAT)?;
    let (w_in, out) = dims2(wt, WHAT)?;
    if w_in != input {
        return Err(NnError::Stage(format!(
            "{WHAT}: input has {input} features, the weight expects {w_in}"
        )));
    }
    let mut dst = output_buffer::<T>(residual, n, out, WHAT)?;
    let mut accumulate = residual.is_some();
    if let Some(b) = b {
        read::<T, _>(b, WHAT, |b| {
            if b.len() != out {
                return Err(NnError::Stage(format!(
                    "{WHAT}: bias has {} elements, expected {out}",
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
        accumulate = true;
    }
    read::<T, _>(x, WHAT, |x| {
        read::<T, _>(wt, WHAT, |wt| {
            gemm(
                &mut dst,
                Mat::new(x, n, input),
                Mat::new(wt, input, out),
                accumulate,
                WHAT,
            )
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
    const BLOCK: usize = 32;
    let (rows, cols) = dims2(w, WHAT)?;
    let out = read::<T, _>(w, WHAT, |w| {
        let mut out = vec![T::zero(); rows * cols];
        for r0 in (0..rows).step_by(BLOCK) {
            for c0 in (0..cols).step_by(BLOCK) {
                for r in r0..(r0 + BLOCK).min(rows) {
                    for c in c0..(c0 + BLOCK).min(cols) {
                        out[c * rows + r] = w[r * cols + c];
                    }
                }
            }
        }
        out
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
    let mut dst = output_buffer::<T>(residual, n, input, WHAT)?;
    read::<T, _>(dy, WHAT, |dy| {
        read::<T, _>(w, WHAT, |w| {
            gemm(
                &mut dst,
                Mat::new(dy, n, out),
                Mat::new(w, out, input),
                residual.is_some(),
                WHAT,
            )
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
    let (n, out) = dims2(dy, WHAT)?;
    let (xn, input) = dims2(x, WHAT)?;
    if xn != n || grad_w.dims() != [out, input] {
        return Err(NnError::Stage(format!(
            "{WHAT}: dy {:?}, x {:?} and the gradient {:?} do not fit",
            dy.dims(),
            x.dims(),
            grad_w.dims()
        )));
    }
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
