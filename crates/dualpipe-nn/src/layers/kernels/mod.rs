//! CPU kernels behind the layers and the optimizers, on the contiguous f32 / f64 buffers of
//! candle tensors, one concern per file (as candle's CPU backend):
//!
//! - [`gemm`]: GEMMs call the `gemm` crate directly with no parallelism: each pipeline rank is
//!   one thread (as each of the reference's processes is), so a GEMM must not hand its work to
//!   a shared thread pool that the other ranks' GEMMs compete for. Transposed operands are read
//!   through strides (no copies), and bias, residual and gradient accumulation are folded into
//!   the GEMM's output (`dst = dst + a·b`), so none of them costs a separate pass.
//! - [`elementwise`]: GELU and its derivative, sums and products, the MSE and its gradient, one
//!   fused loop per operation, with one output allocation, instead of a chain of candle ops.
//! - [`optim`]: the fused SGD and AdamW updates.
//! - [`math`]: the element types' special functions. f64 uses libm's `erf`/`exp` (the same
//!   functions as candle's `gelu_erf`), so f64 results stay exact to rounding; f32 GELU uses a
//!   branch-free erfc approximation (relative error below 2e-7, the size of f32 rounding) that
//!   the compiler vectorizes.

use candle_core::{DType, Device, Storage, Tensor, WithDType};

use crate::error::{NnError, TensorContext};

/// An element type the kernels run on (f32 or f64).
pub(crate) trait Elem: WithDType {
    /// `y = gelu(x)` and `d = gelu'(x)`, elementwise.
    fn gelu_forward(x: &[Self], y: &mut [Self], d: &mut [Self]);
    /// `y = gelu(x)`, elementwise (by default [`Elem::gelu_forward`] with the derivative
    /// dropped).
    fn gelu(x: &[Self], y: &mut [Self]) {
        let mut d = vec![Self::zero(); x.len()];
        Self::gelu_forward(x, y, &mut d);
    }
    /// `gelu'(x)`, elementwise ([`Elem::gelu_forward`] with the value dropped).
    fn gelu_derivative(x: &[Self], d: &mut [Self]) {
        let mut y = vec![Self::zero(); x.len()];
        Self::gelu_forward(x, &mut y, d);
    }
    /// The square root.
    fn sqrt(self) -> Self;
    /// `eˣ`.
    fn exp(self) -> Self;
    /// The natural logarithm.
    fn ln(self) -> Self;
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
            candle_core::DType::F32 => $f::<f32>($($arg),*),
            candle_core::DType::F64 => $f::<f64>($($arg),*),
            other => Err(unsupported(other, $what)),
        }
    };
}

mod attention;
mod elementwise;
mod gemm;
mod math;
mod norm;
mod optim;
mod token;

pub(crate) use attention::{attention_backward, attention_forward};
pub(crate) use elementwise::{add, gelu, gelu_derivative, gelu_forward, mse, mul, scaled_diff};
pub(crate) use gemm::{
    gemm, linear_backward_input, linear_backward_weight, linear_forward, transpose, Mat,
};
pub(crate) use norm::{rms_norm_backward_input, rms_norm_backward_weight, rms_norm_forward};
pub(crate) use optim::{adamw, sgd, AdamWStep};
pub(crate) use token::{cross_entropy, embedding_backward_weight, embedding_forward};

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
