//! The optimizers' fused update passes.

use candle_core::Tensor;

use super::{read, same_shape, tensor, unsupported, Elem};
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
    let c = |x: f64| T::from_f64(x);
    let (b1, nb1, b2, nb2) = (c(s.beta1), c(1.0 - s.beta1), c(s.beta2), c(1.0 - s.beta2));
    let (eps, decay, inv_bc2, step_size) = (c(s.eps), c(s.decay), c(s.inv_bc2), c(s.step_size));
    // Three streaming passes, each writing its result once (no zero-filled or copied buffers):
    // the optimizer is memory-bound at width 512.
    let frozen = s.frozen_variance;
    let (m, v) = read::<T, _>(g, WHAT, |g| {
        let m_of = |m: T, g: T| if frozen { g } else { m * b1 + g * nb1 };
        let v_of = |v: T, g: T| if frozen { v } else { v * b2 + (g * g) * nb2 };
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
    let preconditioned = frozen && s.preconditioned;
    let new_p = read::<T, _>(p, WHAT, |p| {
        p.iter()
            .zip(&m)
            .zip(&v)
            .map(|((&p, &m), &v)| {
                if preconditioned {
                    p * decay - m * step_size
                } else {
                    p * decay - (m * step_size) / ((v * inv_bc2).sqrt() + eps)
                }
            })
            .collect::<Vec<T>>()
    })?;
    let m = if preconditioned {
        zip_map(&m, &v, |u, v| u * ((v * inv_bc2).sqrt() + eps))
    } else {
        m
    };
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
