//! Element-wise kernels: GELU and its derivative, sums, products and the MSE, each one fused
//! loop with one output allocation.

use candle_core::Tensor;

use super::{read, same_shape, tensor, unsupported, Elem, Uninit};
use crate::error::NnError;

/// `(gelu(x), gelu'(x))`.
pub(crate) fn gelu_forward(x: &Tensor) -> Result<(Tensor, Tensor), NnError> {
    by_dtype!(x, "GELU forward", gelu_forward_t(x))
}

fn gelu_forward_t<T: Elem>(x: &Tensor) -> Result<(Tensor, Tensor), NnError> {
    const WHAT: &str = "GELU forward";
    let (y, d) = read::<T, _>(x, WHAT, |x| {
        let mut y = Uninit::new(x.len());
        let mut d = Uninit::new(x.len());
        T::gelu_forward(x, y.slots(), d.slots());
        // SAFETY: gelu_forward writes every slot of both.
        unsafe { (y.assume_init(), d.assume_init()) }
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
        let mut y = Uninit::new(x.len());
        T::gelu(x, y.slots());
        // SAFETY: gelu writes every slot.
        unsafe { y.assume_init() }
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
        let mut d = Uninit::new(x.len());
        T::gelu_derivative(x, d.slots());
        // SAFETY: gelu_derivative writes every slot.
        unsafe { d.assume_init() }
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
    let out = read::<T, _>(a, what, |a| read::<T, _>(b, what, |b| product(a, b)))??;
    tensor(out, a.shape().clone(), what)
}

wide_kernel! {
    /// `a ⊙ b` elementwise.
    fn product<T: Elem>(a: &[T], b: &[T]) -> Vec<T> => product_inline
}

#[inline(always)]
fn product_inline<T: Elem>(a: &[T], b: &[T]) -> Vec<T> {
    a.iter().zip(b).map(|(&x, &y)| x * y).collect()
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

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;

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
}
