//! The Linear layer's three products in mixed precision: f32 activations and master weights
//! read as half-precision GEMM operands, f32 outputs and f32 gradient accumulation.

use candle_core::{DType, Tensor};
use half::{bf16, f16};

use super::gemm::{linear_start, residual_checked, weight_gradient_dims, Mat};
use super::half::{gemm_half, gemm_half_from, gemm_half_to, HalfOperand, Skip};
use super::{dims2, read, tensor, Uninit};
use crate::error::NnError;
use crate::precision::Half;

/// Calls `f` with the matrix `t` (`[rows, cols]`, f32, bf16 or f16) as a GEMM operand.
fn with_operand<R>(
    t: &Tensor,
    what: &str,
    f: impl FnOnce(HalfOperand<'_>) -> R,
) -> Result<R, NnError> {
    let (rows, cols) = dims2(t, what)?;
    match t.dtype() {
        DType::F32 => read::<f32, _>(t, what, |s| f(HalfOperand::F32(Mat::new(s, rows, cols)))),
        DType::BF16 => read::<bf16, _>(t, what, |s| f(HalfOperand::Bf16(Mat::new(s, rows, cols)))),
        DType::F16 => read::<f16, _>(t, what, |s| f(HalfOperand::F16(Mat::new(s, rows, cols)))),
        other => Err(NnError::Stage(format!(
            "{what}: mixed precision reads f32, bf16 or f16 tensors, not {other:?}"
        ))),
    }
}

/// What a product is added to.
enum Start<'t> {
    /// Nothing.
    Zero,
    /// Values made for it (the bias on every row, plus any residual), added to in place.
    Owned(Vec<f32>),
    /// An f32 tensor of the product's shape (a residual, a gradient so far), read, not copied.
    Of(&'t Tensor),
}

/// The residual `[rows, cols]` as a product's start, read in place (shape checked).
fn residual_in_place<'t>(
    residual: Option<&'t Tensor>,
    rows: usize,
    cols: usize,
    what: &str,
) -> Result<Start<'t>, NnError> {
    Ok(residual_checked(residual, rows, cols, what)?.map_or(Start::Zero, Start::Of))
}

/// `start + a·b` in f32, the operands read in `half`, each given with whether it is used
/// transposed.
fn half_product(
    half: Half,
    start: Start<'_>,
    (a, a_t): (&Tensor, bool),
    (b, b_t): (&Tensor, bool),
    len: usize,
    what: &str,
) -> Result<Vec<f32>, NnError> {
    let dst = with_operand(a, what, |a| {
        with_operand(b, what, |b| {
            let a = if a_t { a.t() } else { a };
            let b = if b_t { b.t() } else { b };
            if let Start::Owned(mut dst) = start {
                gemm_half(half, &mut dst, a, b, true, what)?;
                return Ok::<_, NnError>(dst);
            }
            // Written in full by the product: no zeroing or copying pass first.
            let (m, n) = (a.dims().0, b.dims().1);
            if len != m * n {
                return Err(NnError::Stage(format!(
                    "{what}: a [{m}, {n}] product into {len} elements"
                )));
            }
            let mut dst = Uninit::<f32>::new(len);
            match start {
                Start::Of(t) => read::<f32, _>(t, what, |s| {
                    gemm_half_from(half, dst.slots(), s, a, b, what)
                })??,
                _ => gemm_half_to(half, dst.slots(), n, a, b, Skip::None, what)?,
            }
            // SAFETY: the product wrote all len = m · n elements.
            Ok(unsafe { dst.assume_init() })
        })
    })???;
    Ok(dst)
}

/// `x Wᵀ (+ b) (+ residual)` in f32 for `x: [n, in]` and the f32 master weight `W: [out, in]`,
/// both read as `half` GEMM operands; the bias and the residual are added in f32.
pub(crate) fn linear_forward_half(
    half: Half,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Tensor, NnError> {
    const WHAT: &str = "Linear forward x Wᵀ + b (mixed precision)";
    let (out, w_in) = dims2(w, WHAT)?;
    // With a bias the start is made for the product (the bias on every row, plus any
    // residual); without one a residual is read in place.
    let (n, _, owned) =
        linear_start::<f32>(x, (w_in, out), b, residual.filter(|_| b.is_some()), WHAT)?;
    let start = match owned {
        Some(values) => Start::Owned(values),
        None => residual_in_place(residual, n, out, WHAT)?,
    };
    let dst = half_product(half, start, (x, false), (w, true), n * out, WHAT)?;
    tensor(dst, (n, out), WHAT)
}

/// `dy W (+ residual)` in f32 for `dy: [n, out]` (f32 or half) and `W: [out, in]`, read as
/// `half` operands.
pub(crate) fn linear_backward_input_half(
    half: Half,
    dy: &Tensor,
    w: &Tensor,
    residual: Option<&Tensor>,
) -> Result<Tensor, NnError> {
    const WHAT: &str = "Linear backward dy W (mixed precision)";
    let (n, out) = dims2(dy, WHAT)?;
    let (w_out, input) = dims2(w, WHAT)?;
    if w_out != out {
        return Err(NnError::Stage(format!(
            "{WHAT}: gradient has {out} features, the weight produces {w_out}"
        )));
    }
    let start = residual_in_place(residual, n, input, WHAT)?;
    let dst = half_product(half, start, (dy, false), (w, false), n * input, WHAT)?;
    tensor(dst, (n, input), WHAT)
}

/// `(grad_w + dyᵀ x, grad_b + Σ_rows dy)` with f32 gradients and `dy: [n, out]`,
/// `x: [n, in]` (f32 or half) read as `half` operands.
pub(crate) fn linear_backward_weight_half(
    half: Half,
    dy: &Tensor,
    x: &Tensor,
    grad_w: &Tensor,
    grad_b: Option<&Tensor>,
) -> Result<(Tensor, Option<Tensor>), NnError> {
    const WHAT: &str = "Linear weight gradient dyᵀ x (mixed precision)";
    let (_, out, input) = weight_gradient_dims(dy, x, grad_w, WHAT)?;
    let dw = half_product(
        half,
        Start::Of(grad_w),
        (dy, true),
        (x, false),
        out * input,
        WHAT,
    )?;
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
            let sum = super::half::to_f32(dy)?
                .sum(0)
                .map_err(|e| NnError::Stage(format!("{WHAT}: {e}")))?;
            Some((gb + sum).map_err(|e| NnError::Stage(format!("Linear bias gradient: {e}")))?)
        }
    };
    Ok((dw, db))
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn draw(seed: usize, shape: (usize, usize)) -> Tensor {
        let v: Vec<f32> = (0..shape.0 * shape.1)
            .map(|i| ((i * 7919 + seed * 104729) % 1999) as f32 / 999.0 - 1.0)
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// A residual, read in place as the product's start (no bias) or made into it with the
    /// bias, is added once: bit for bit `product + residual` when it is the only start.
    #[test]
    fn a_residual_is_added_once_with_and_without_a_bias() {
        let (n, input, out) = (29, 40, 35);
        let (x, w, b, r) = (
            draw(1, (n, input)),
            draw(2, (out, input)),
            draw(3, (1, out)).flatten_all().unwrap(),
            draw(4, (n, out)),
        );
        let dy = draw(5, (n, out));
        let r_in = draw(6, (n, input));
        for half in [Half::Bf16, Half::F16] {
            let plain = linear_forward_half(half, &x, &w, None, None).unwrap();
            let with_r = linear_forward_half(half, &x, &w, None, Some(&r)).unwrap();
            let want = (&plain + &r).unwrap();
            assert_eq!(values(&with_r), values(&want), "{half:?} residual");
            let biased = linear_forward_half(half, &x, &w, Some(&b), None).unwrap();
            let both = linear_forward_half(half, &x, &w, Some(&b), Some(&r)).unwrap();
            let want = (&biased + &r).unwrap();
            for (got, want) in values(&both).iter().zip(values(&want)) {
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{got} {want}"
                );
            }
            let dx = linear_backward_input_half(half, &dy, &w, None).unwrap();
            let dx_r = linear_backward_input_half(half, &dy, &w, Some(&r_in)).unwrap();
            assert_eq!(
                values(&dx_r),
                values(&(&dx + &r_in).unwrap()),
                "{half:?} dx"
            );
            // A residual of another shape is refused, naming both.
            let err = linear_forward_half(half, &x, &w, None, Some(&r_in)).unwrap_err();
            assert!(err.to_string().contains("residual is [29, 40]"), "{err}");
        }
    }
}
