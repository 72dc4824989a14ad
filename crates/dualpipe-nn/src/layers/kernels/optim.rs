//! The optimizers' fused update passes.

use std::mem::MaybeUninit;

use candle_core::Tensor;

use super::{read, same_shape, tensor, unsupported, Elem, Uninit};
use crate::error::NnError;

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
    /// 1-bit Adam's compression phase: the gradient slot holds the new first moment (the
    /// replicas' averaged momentum), and the second moment is left as it is.
    pub(crate) frozen_variance: bool,
    /// With `frozen_variance`: the gradient slot holds the averaged momentum already divided
    /// by Adam's denominator `√(v / (1 - β₂ᵗ)) + ε` (the preconditioned momentum
    /// [`crate::Optimizer::fold_momentum`] gives), so the step is `step_size ⋅ g` and the
    /// first moment kept is `g` times the denominator.
    pub(crate) preconditioned: bool,
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
    if let Some((m, v)) = mv {
        same_shape(p, m, WHAT)?;
        same_shape(p, v, WHAT)?;
    }
    let c = |x: f64| T::from_f64(x);
    let k = AdamWConsts {
        b1: c(s.beta1),
        nb1: c(1.0 - s.beta1),
        b2: c(s.beta2),
        nb2: c(1.0 - s.beta2),
        eps: c(s.eps),
        decay: c(s.decay),
        inv_bc2: c(s.inv_bc2),
        step_size: c(s.step_size),
        frozen: s.frozen_variance,
        preconditioned: s.frozen_variance && s.preconditioned,
    };
    // One streaming pass over p, g, m and v, each result written once into memory not zeroed
    // first: the optimizer is memory-bound at width 512 and above.
    let n = p.elem_count();
    let (mut new_p, mut new_m, mut new_v) = (Uninit::new(n), Uninit::new(n), Uninit::new(n));
    read::<T, _>(p, WHAT, |p| {
        read::<T, _>(g, WHAT, |g| {
            let out = [new_p.slots(), new_m.slots(), new_v.slots()];
            match mv {
                Some((m, v)) => read::<T, _>(m, WHAT, |m| {
                    read::<T, _>(v, WHAT, |v| adamw_wide(p, g, Some((m, v)), k, out))
                })?,
                None => {
                    adamw_wide(p, g, None, k, out);
                    Ok(())
                }
            }
        })
    })???;
    // SAFETY: adamw_wide wrote every element of the three outputs (all have p's length, and
    // so have g, m and v: the shapes were checked).
    let (new_p, new_m, new_v) = unsafe {
        (
            new_p.assume_init(),
            new_m.assume_init(),
            new_v.assume_init(),
        )
    };
    let shape = p.shape().clone();
    Ok((
        tensor(new_p, shape.clone(), WHAT)?,
        tensor(new_m, shape.clone(), WHAT)?,
        tensor(new_v, shape, WHAT)?,
    ))
}

/// [`AdamWStep`] in the parameters' element type.
#[derive(Clone, Copy)]
struct AdamWConsts<T> {
    b1: T,
    nb1: T,
    b2: T,
    nb2: T,
    eps: T,
    decay: T,
    inv_bc2: T,
    step_size: T,
    frozen: bool,
    preconditioned: bool,
}

wide_kernel! {
    /// [`adamw_elements`] as wide as the CPU allows.
    fn adamw_wide<T: Elem>(
        p: &[T],
        g: &[T],
        mv: Option<(&[T], &[T])>,
        k: AdamWConsts<T>,
        out: [&mut [MaybeUninit<T>]; 3],
    ) => adamw_elements
}

/// Writes the new `(p, m, v)` of every element into `out` (`m` and `v` zero when `mv` is
/// `None`).
#[inline(always)]
fn adamw_elements<T: Elem>(
    p: &[T],
    g: &[T],
    mv: Option<(&[T], &[T])>,
    k: AdamWConsts<T>,
    out: [&mut [MaybeUninit<T>]; 3],
) {
    match mv {
        Some((m, v)) => adamw_moments(p, g, m.iter().copied().zip(v.iter().copied()), k, out),
        None => adamw_moments(p, g, std::iter::repeat((T::zero(), T::zero())), k, out),
    }
}

/// [`adamw_elements`] with the moments as pairs. Per element: `m' = β₁m + (1-β₁)g` (`g` when
/// the variance is frozen), `v' = β₂v + (1-β₂)g²` (`v` when frozen), `p' = (1-lrλ)p -
/// s·m' / (√(v'/(1-β₂ᵗ)) + ε)`; preconditioned, `p' = (1-lrλ)p - s·m'` and the kept first
/// moment is `m'` times that denominator.
#[inline(always)]
fn adamw_moments<T: Elem>(
    p: &[T],
    g: &[T],
    moments: impl Iterator<Item = (T, T)>,
    k: AdamWConsts<T>,
    [out_p, out_m, out_v]: [&mut [MaybeUninit<T>]; 3],
) {
    let outs = out_p.iter_mut().zip(out_m.iter_mut()).zip(out_v.iter_mut());
    for (((op, om), ov), ((&p, &g), (m, v))) in outs.zip(p.iter().zip(g).zip(moments)) {
        let (m, v) = if k.frozen {
            (g, v)
        } else {
            (m * k.b1 + g * k.nb1, v * k.b2 + (g * g) * k.nb2)
        };
        let denominator = (v * k.inv_bc2).sqrt() + k.eps;
        let (p, m) = if k.preconditioned {
            (p * k.decay - m * k.step_size, m * denominator)
        } else {
            (p * k.decay - (m * k.step_size) / denominator, m)
        };
        op.write(p);
        om.write(m);
        ov.write(v);
    }
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
