//! CPU kernels behind the layers and the optimizers, on the contiguous f32 / f64 buffers of
//! candle tensors.
//!
//! - GEMMs call the `gemm` crate directly with no parallelism: each pipeline rank is one
//!   thread (as each of the reference's processes is), so a GEMM must not hand its work to a
//!   shared thread pool that the other ranks' GEMMs compete for. Transposed operands are read
//!   through strides (no copies), and bias, residual and gradient accumulation are folded into
//!   the GEMM's output (`dst = dst + a·b`), so none of them costs a separate pass.
//! - Elementwise work (GELU and its derivative, the MSE gradient, the optimizer updates) is one
//!   fused loop per operation, with one output allocation, instead of a chain of candle ops.
//! - f64 uses libm's `erf`/`exp` (the same functions as candle's `gelu_erf`), so f64 results
//!   stay exact to rounding; f32 GELU uses a branch-free erfc approximation (relative error
//!   below 2e-7, the size of f32 rounding) that the compiler vectorizes.

use candle_core::{DType, Device, Storage, Tensor, WithDType};
use gemm::Parallelism;

use crate::error::{NnError, TensorContext};

/// An element type the kernels run on (f32 or f64).
pub(crate) trait Elem: WithDType {
    /// `y = gelu(x)` and `d = gelu'(x)`, elementwise.
    fn gelu_forward(x: &[Self], y: &mut [Self], d: &mut [Self]);
    /// `y = gelu(x)`, elementwise.
    fn gelu(x: &[Self], y: &mut [Self]);
    /// `gelu'(x)`, elementwise.
    fn gelu_derivative(x: &[Self], d: &mut [Self]);
    /// The square root.
    fn sqrt(self) -> Self;
}

/// The error for a dtype the kernels do not cover.
fn unsupported(dtype: DType, what: &str) -> NnError {
    NnError::Stage(format!(
        "{what}: tensors of type {dtype:?} are not supported; use f32 or f64"
    ))
}

/// Calls the f32 or the f64 instance of a generic kernel by the tensor's dtype.
macro_rules! by_dtype {
    ($t:expr, $what:expr, $f:ident ( $($arg:expr),* )) => {
        match $t.dtype() {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            other => Err(unsupported(other, $what)),
        }
    };
}

/// Calls `f` with the tensor's elements as one contiguous slice (row-major), copying only if
/// the tensor is a non-contiguous view.
pub(crate) fn read<T: Elem, R>(
    t: &Tensor,
    what: &str,
    f: impl FnOnce(&[T]) -> R,
) -> Result<R, NnError> {
    let owned;
    let t = if t.is_contiguous() {
        t
    } else {
        owned = t.contiguous().ctx(what)?;
        &owned
    };
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(NnError::Stage(format!(
            "{what}: tensors must be on the CPU"
        )));
    };
    let all = cpu.as_slice::<T>().ctx(what)?;
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| NnError::Stage(format!("{what}: tensor is not contiguous")))?;
    Ok(f(&all[start..end]))
}

/// A tensor of `shape` owning `data` (no copy).
pub(crate) fn tensor<T: Elem, S: Into<candle_core::Shape>>(
    data: Vec<T>,
    shape: S,
    what: &str,
) -> Result<Tensor, NnError> {
    Tensor::from_vec(data, shape, &Device::Cpu).ctx(what)
}

/// The `[rows, cols]` of a matrix, or an error naming `what`.
pub(crate) fn dims2(t: &Tensor, what: &str) -> Result<(usize, usize), NnError> {
    t.dims2().ctx(what)
}

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

/// `(gelu(x), gelu'(x))`.
pub(crate) fn gelu_forward(x: &Tensor) -> Result<(Tensor, Tensor), NnError> {
    by_dtype!(x, "GELU forward", gelu_forward_t(x))
}

fn gelu_forward_t<T: Elem>(x: &Tensor) -> Result<(Tensor, Tensor), NnError> {
    const WHAT: &str = "GELU forward";
    let (y, d) = read::<T, _>(x, WHAT, |x| {
        let mut y = vec![T::zero(); x.len()];
        let mut d = vec![T::zero(); x.len()];
        T::gelu_forward(x, &mut y, &mut d);
        (y, d)
    })?;
    Ok((
        tensor(y, x.shape().clone(), WHAT)?,
        tensor(d, x.shape().clone(), WHAT)?,
    ))
}

/// `gelu(x)` alone (inference).
pub(crate) fn gelu(x: &Tensor) -> Result<Tensor, NnError> {
    by_dtype!(x, "GELU", gelu_t(x))
}

fn gelu_t<T: Elem>(x: &Tensor) -> Result<Tensor, NnError> {
    const WHAT: &str = "GELU";
    let y = read::<T, _>(x, WHAT, |x| {
        let mut y = vec![T::zero(); x.len()];
        T::gelu(x, &mut y);
        y
    })?;
    tensor(y, x.shape().clone(), WHAT)
}

/// `gelu'(x)`.
pub(crate) fn gelu_derivative(x: &Tensor) -> Result<Tensor, NnError> {
    by_dtype!(x, "GELU derivative", gelu_derivative_t(x))
}

fn gelu_derivative_t<T: Elem>(x: &Tensor) -> Result<Tensor, NnError> {
    const WHAT: &str = "GELU derivative";
    let d = read::<T, _>(x, WHAT, |x| {
        let mut d = vec![T::zero(); x.len()];
        T::gelu_derivative(x, &mut d);
        d
    })?;
    tensor(d, x.shape().clone(), WHAT)
}

/// `a + b` (same shapes and dtypes); large tensors are split over the machine's cores (the
/// gradient sum of the stage copies runs outside the rank threads, on an otherwise idle
/// machine).
pub(crate) fn add(a: &Tensor, b: &Tensor, what: &str) -> Result<Tensor, NnError> {
    by_dtype!(a, what, add_t(a, b, what))
}

fn add_t<T: Elem>(a: &Tensor, b: &Tensor, what: &str) -> Result<Tensor, NnError> {
    /// Below this many elements one thread is faster than starting more.
    const PARALLEL_FROM: usize = 1 << 16;
    same_shape(a, b, what)?;
    let n = a.elem_count();
    let mut out = vec![T::zero(); n];
    read::<T, _>(a, what, |a| {
        read::<T, _>(b, what, |b| {
            let add = |o: &mut [T], a: &[T], b: &[T]| {
                for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
                    *o = x + y;
                }
            };
            let threads = std::thread::available_parallelism().map_or(1, usize::from);
            if n < PARALLEL_FROM || threads < 2 {
                add(&mut out, a, b);
                return;
            }
            let chunk = n.div_ceil(threads);
            std::thread::scope(|scope| {
                for ((o, a), b) in out
                    .chunks_mut(chunk)
                    .zip(a.chunks(chunk))
                    .zip(b.chunks(chunk))
                {
                    scope.spawn(move || add(o, a, b));
                }
            });
        })
    })??;
    tensor(out, a.shape().clone(), what)
}

/// `a ⊙ b` (same shapes).
pub(crate) fn mul(a: &Tensor, b: &Tensor, what: &str) -> Result<Tensor, NnError> {
    by_dtype!(a, what, mul_t(a, b, what))
}

fn mul_t<T: Elem>(a: &Tensor, b: &Tensor, what: &str) -> Result<Tensor, NnError> {
    if a.dims() != b.dims() {
        return Err(NnError::Stage(format!(
            "{what}: shapes {:?} and {:?} differ",
            a.dims(),
            b.dims()
        )));
    }
    let out = read::<T, _>(a, what, |a| {
        read::<T, _>(b, what, |b| {
            a.iter().zip(b).map(|(&x, &y)| x * y).collect::<Vec<T>>()
        })
    })??;
    tensor(out, a.shape().clone(), what)
}

/// `(y - t) · scale` (same shapes), `scale` cast to the element type.
pub(crate) fn scaled_diff(
    y: &Tensor,
    t: &Tensor,
    scale: f64,
    what: &str,
) -> Result<Tensor, NnError> {
    by_dtype!(y, what, scaled_diff_t(y, t, scale, what))
}

fn scaled_diff_t<T: Elem>(
    y: &Tensor,
    t: &Tensor,
    scale: f64,
    what: &str,
) -> Result<Tensor, NnError> {
    if y.dims() != t.dims() {
        return Err(NnError::Stage(format!(
            "{what}: output {:?} and target {:?} differ in shape",
            y.dims(),
            t.dims()
        )));
    }
    let s = T::from_f64(scale);
    let out = read::<T, _>(y, what, |y| {
        read::<T, _>(t, what, |t| {
            y.iter()
                .zip(t)
                .map(|(&a, &b)| (a - b) * s)
                .collect::<Vec<T>>()
        })
    })??;
    tensor(out, y.shape().clone(), what)
}

/// `mean((y - t)²)`, each square rounded to the element type and summed in f64.
pub(crate) fn mse(y: &Tensor, t: &Tensor, what: &str) -> Result<f64, NnError> {
    by_dtype!(y, what, mse_t(y, t, what))
}

fn mse_t<T: Elem>(y: &Tensor, t: &Tensor, what: &str) -> Result<f64, NnError> {
    if y.dims() != t.dims() {
        return Err(NnError::Stage(format!(
            "{what}: output {:?} and target {:?} differ in shape",
            y.dims(),
            t.dims()
        )));
    }
    let sum = read::<T, _>(y, what, |y| {
        read::<T, _>(t, what, |t| {
            y.iter()
                .zip(t)
                .map(|(&a, &b)| {
                    let d = a - b;
                    (d * d).to_f64()
                })
                .sum::<f64>()
        })
    })??;
    Ok(sum / y.elem_count() as f64)
}

/// AdamW hyper-parameters of one step, bias corrections included.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdamWStep {
    pub(crate) beta1: f64,
    pub(crate) beta2: f64,
    pub(crate) eps: f64,
    /// `1 - lr λ`.
    pub(crate) decay: f64,
    /// `1 / (1 - β₂ᵗ)`.
    pub(crate) inv_bc2: f64,
    /// `lr / (1 - β₁ᵗ)`.
    pub(crate) step_size: f64,
}

/// One fused AdamW pass: returns the new `(p, m, v)`; `m` and `v` are `None` on the first step
/// (zero).
pub(crate) fn adamw(
    p: &Tensor,
    g: &Tensor,
    mv: Option<(&Tensor, &Tensor)>,
    s: AdamWStep,
) -> Result<(Tensor, Tensor, Tensor), NnError> {
    by_dtype!(p, "AdamW", adamw_t(p, g, mv, s))
}

fn adamw_t<T: Elem>(
    p: &Tensor,
    g: &Tensor,
    mv: Option<(&Tensor, &Tensor)>,
    s: AdamWStep,
) -> Result<(Tensor, Tensor, Tensor), NnError> {
    const WHAT: &str = "AdamW update";
    same_shape(p, g, WHAT)?;
    let c = |x: f64| T::from_f64(x);
    let (b1, nb1, b2, nb2) = (c(s.beta1), c(1.0 - s.beta1), c(s.beta2), c(1.0 - s.beta2));
    let (eps, decay, inv_bc2, step_size) = (c(s.eps), c(s.decay), c(s.inv_bc2), c(s.step_size));
    // Three streaming passes, each writing its result once (no zero-filled or copied buffers):
    // the optimizer is memory-bound at width 512.
    let (m, v) = read::<T, _>(g, WHAT, |g| {
        let m_of = |m: T, g: T| m * b1 + g * nb1;
        let v_of = |v: T, g: T| v * b2 + (g * g) * nb2;
        Ok::<_, NnError>(match mv {
            Some((m, v)) => {
                same_shape(p, m, WHAT)?;
                same_shape(p, v, WHAT)?;
                (
                    read::<T, _>(m, WHAT, |m| zip_map(m, g, m_of))?,
                    read::<T, _>(v, WHAT, |v| zip_map(v, g, v_of))?,
                )
            }
            None => (
                g.iter().map(|&g| m_of(T::zero(), g)).collect(),
                g.iter().map(|&g| v_of(T::zero(), g)).collect(),
            ),
        })
    })??;
    let new_p = read::<T, _>(p, WHAT, |p| {
        p.iter()
            .zip(&m)
            .zip(&v)
            .map(|((&p, &m), &v)| p * decay - (m * step_size) / ((v * inv_bc2).sqrt() + eps))
            .collect::<Vec<T>>()
    })?;
    let shape = p.shape().clone();
    Ok((
        tensor(new_p, shape.clone(), WHAT)?,
        tensor(m, shape.clone(), WHAT)?,
        tensor(v, shape, WHAT)?,
    ))
}

/// One fused SGD-with-momentum pass: `buf = μ buf + g` (`buf = g` when `buf` is `None`),
/// `p = p − lr buf`; returns the new `(p, buf)`.
pub(crate) fn sgd(
    p: &Tensor,
    g: &Tensor,
    buf: Option<&Tensor>,
    momentum: f64,
    lr: f64,
) -> Result<(Tensor, Tensor), NnError> {
    by_dtype!(p, "SGD", sgd_t(p, g, buf, momentum, lr))
}

fn sgd_t<T: Elem>(
    p: &Tensor,
    g: &Tensor,
    buf: Option<&Tensor>,
    momentum: f64,
    lr: f64,
) -> Result<(Tensor, Tensor), NnError> {
    const WHAT: &str = "SGD update";
    same_shape(p, g, WHAT)?;
    let (mu, lr) = (T::from_f64(momentum), T::from_f64(lr));
    let mut b = match buf {
        Some(b) => {
            same_shape(p, b, WHAT)?;
            let mut b = read::<T, _>(b, WHAT, <[T]>::to_vec)?;
            read::<T, _>(g, WHAT, |g| {
                for (b, &g) in b.iter_mut().zip(g) {
                    *b = *b * mu + g;
                }
            })?;
            b
        }
        None => read::<T, _>(g, WHAT, <[T]>::to_vec)?,
    };
    let new_p = read::<T, _>(p, WHAT, |p| {
        p.iter()
            .zip(&mut b)
            .map(|(&p, b)| p - *b * lr)
            .collect::<Vec<T>>()
    })?;
    let shape = p.shape().clone();
    Ok((tensor(new_p, shape.clone(), WHAT)?, tensor(b, shape, WHAT)?))
}

/// `f(a[i], b[i])` for every `i`, collected once.
fn zip_map<T: Elem>(a: &[T], b: &[T], f: impl Fn(T, T) -> T) -> Vec<T> {
    a.iter().zip(b).map(|(&a, &b)| f(a, b)).collect()
}

fn same_shape(a: &Tensor, b: &Tensor, what: &str) -> Result<(), NnError> {
    if a.dims() != b.dims() || a.dtype() != b.dtype() {
        return Err(NnError::Stage(format!(
            "{what}: {:?} {:?} and {:?} {:?} differ",
            a.dtype(),
            a.dims(),
            b.dtype(),
            b.dims()
        )));
    }
    Ok(())
}

// ---- GELU ----------------------------------------------------------------------------------

const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

impl Elem for f64 {
    fn gelu(x: &[f64], y: &mut [f64]) {
        for (&x, y) in x.iter().zip(y) {
            // The same expression as candle's `gelu_erf`.
            *y = (libm::erf(x * std::f64::consts::FRAC_1_SQRT_2) + 1.0) * 0.5 * x;
        }
    }

    fn gelu_forward(x: &[f64], y: &mut [f64], d: &mut [f64]) {
        for ((&x, y), d) in x.iter().zip(y).zip(d) {
            let erf = libm::erf(x * std::f64::consts::FRAC_1_SQRT_2);
            // The same expression as candle's `gelu_erf`.
            *y = (erf + 1.0) * 0.5 * x;
            *d = x * (libm::exp(-0.5 * (x * x)) * INV_SQRT_2PI) + (erf * 0.5 + 0.5);
        }
    }

    fn gelu_derivative(x: &[f64], d: &mut [f64]) {
        for (&x, d) in x.iter().zip(d) {
            let erf = libm::erf(x * std::f64::consts::FRAC_1_SQRT_2);
            *d = x * (libm::exp(-0.5 * (x * x)) * INV_SQRT_2PI) + (erf * 0.5 + 0.5);
        }
    }

    fn sqrt(self) -> f64 {
        f64::sqrt(self)
    }
}

impl Elem for f32 {
    fn gelu(x: &[f32], y: &mut [f32]) {
        let mut d = vec![0.0; x.len()];
        Self::gelu_forward(x, y, &mut d);
    }

    fn gelu_forward(x: &[f32], y: &mut [f32], d: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { gelu_forward_f32_avx2(x, y, d) };
        }
        gelu_forward_f32(x, y, d)
    }

    fn gelu_derivative(x: &[f32], d: &mut [f32]) {
        let mut y = vec![0.0; x.len()];
        Self::gelu_forward(x, &mut y, d);
    }

    fn sqrt(self) -> f32 {
        f32::sqrt(self)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gelu_forward_f32_avx2(x: &[f32], y: &mut [f32], d: &mut [f32]) {
    gelu_forward_f32(x, y, d)
}

/// Branch-free f32 GELU and derivative (vectorizable): `Φ(x)` from an erfc approximation with
/// relative error below 1.2e-7 everywhere (a Chebyshev fit, Numerical Recipes' `erfcc`), so
/// the tails keep their relative precision.
#[inline(always)]
fn gelu_forward_f32(x: &[f32], y: &mut [f32], d: &mut [f32]) {
    for ((&x, y), d) in x.iter().zip(y).zip(d) {
        let (phi, pdf) = normal_cdf_pdf_f32(x);
        *y = x * phi;
        *d = phi + x * pdf;
    }
}

/// `(Φ(x), φ(x))` of the standard normal, in f32.
// The fit's published coefficients, kept as printed (f32 rounds them).
#[allow(clippy::excessive_precision)]
#[inline(always)]
fn normal_cdf_pdf_f32(x: f32) -> (f32, f32) {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let e = exp_f32(-z * z);
    let erfc = t * e * exp_f32(poly);
    let half = 0.5 * erfc;
    let phi = if x >= 0.0 { 1.0 - half } else { half };
    (phi, e * INV_SQRT_2PI as f32)
}

/// `eˣ` in f32 (relative error about 1e-7), branch-free and without float-to-int casts so it
/// vectorizes; underflows to 0 at -87 and below.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 · 2²³: adding it rounds to an integer, held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const ROUND_BITS: u32 = 0x4B40_0000;
    let x = if x < -87.0 { -87.0 } else { x };
    let x = if x > 88.0 { 88.0 } else { x };
    let kr = x * LOG2_E + ROUND;
    let k = kr - ROUND;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2ᵏ: the biased exponent k + 127 shifted into place.
    let scale = f32::from_bits(kr.to_bits().wrapping_sub(ROUND_BITS - 127) << 23);
    let v = p * scale;
    if x <= -87.0 {
        0.0
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phi(x: f64) -> f64 {
        0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
    }

    #[test]
    fn f32_gelu_matches_the_f64_formula() {
        // In the tails the error grows like x² ε: the argument of exp(-x²/2) is rounded to f32.
        let xs: Vec<f32> = (0..20_001).map(|i| -10.0 + i as f32 * 1e-3).collect();
        let mut y = vec![0.0; xs.len()];
        let mut d = vec![0.0; xs.len()];
        f32::gelu_forward(&xs, &mut y, &mut d);
        for ((&x, &y), &d) in xs.iter().zip(&y).zip(&d) {
            let xf = x as f64;
            let want_y = xf * phi(xf);
            let want_d = phi(xf) + xf * (-0.5 * xf * xf).exp() * INV_SQRT_2PI;
            assert!(
                (y as f64 - want_y).abs() <= 2e-7 * (4.0 + xf * xf) * want_y.abs() + 1e-37,
                "gelu({x}) = {y}, want {want_y}"
            );
            // gelu' crosses 0 near x = -0.75: bound the error by the size of its two terms.
            let size = phi(xf) + xf.abs() * (-0.5 * xf * xf).exp() * INV_SQRT_2PI;
            assert!(
                (d as f64 - want_d).abs() <= 2e-7 * (4.0 + xf * xf) * size + 1e-37,
                "gelu'({x}) = {d}, want {want_d}"
            );
        }
    }

    #[test]
    fn exp_f32_is_accurate_and_underflows() {
        for i in -860..=880 {
            let x = i as f32 * 0.1;
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            assert!(
                (got - want).abs() <= 3e-7 * want,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(exp_f32(-100.0), 0.0);
    }

    #[test]
    fn add_is_elementwise_on_both_paths() {
        for n in [5usize, 70_001] {
            let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let b: Vec<f32> = (0..n).map(|i| 0.5 - i as f32 * 2.0).collect();
            let ta = Tensor::from_vec(a.clone(), n, &Device::Cpu).unwrap();
            let tb = Tensor::from_vec(b.clone(), n, &Device::Cpu).unwrap();
            let sum = add(&ta, &tb, "test").unwrap().to_vec1::<f32>().unwrap();
            let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            assert_eq!(sum, want);
        }
        let other = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
        let ta = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        assert!(add(&ta, &other, "test").is_err());
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
