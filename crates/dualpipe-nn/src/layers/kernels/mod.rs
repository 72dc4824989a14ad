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
//!
//! Outputs that a kernel writes in full (GEMM products, GELU, the norm's rows, attention's
//! heads) start as [`Uninit`] buffers, with no zeroing pass; the element-wise loops are
//! compiled for AVX-512 where the CPU has it (`wide_kernel!`), with the same operations per
//! element and reductions in their sequential order, so results are bit-identical on every
//! path; and glibc is asked once to keep freed buffers for reuse (`keep_freed_memory`).

use std::mem::MaybeUninit;

use candle_core::{DType, Device, Storage, Tensor, WithDType};

use crate::error::{NnError, TensorContext};

/// An element type the kernels run on (f32 or f64).
pub(crate) trait Elem: WithDType {
    /// `y = gelu(x)` and `d = gelu'(x)`, elementwise (every slot of `y` and `d` written).
    fn gelu_forward(x: &[Self], y: &mut [MaybeUninit<Self>], d: &mut [MaybeUninit<Self>]);
    /// `y = gelu(x)`, elementwise (by default [`Elem::gelu_forward`] with the derivative
    /// dropped).
    fn gelu(x: &[Self], y: &mut [MaybeUninit<Self>]) {
        Self::gelu_forward(x, y, Uninit::new(x.len()).slots());
    }
    /// `gelu'(x)`, elementwise ([`Elem::gelu_forward`] with the value dropped).
    fn gelu_derivative(x: &[Self], d: &mut [MaybeUninit<Self>]) {
        Self::gelu_forward(x, Uninit::new(x.len()).slots(), d);
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

/// Defines `fn $name[<T: Elem>](args) -> R` that runs the `#[inline(always)]` function `$inner`
/// compiled for AVX-512 (16 f32 lanes) where the CPU has it, else for AVX2 with FMA where it
/// has those, else as built (SSE2 on x86-64): the element-wise loops of `$inner` vectorize as
/// wide as the CPU allows. Results do not depend on the path: each element goes through the
/// same operations (Rust never fuses `a * b + c` into an FMA on its own), and the kernels keep
/// their reductions in sequential order.
macro_rules! wide_kernel {
    ($(#[$doc:meta])* $vis:vis fn $name:ident $(<$T:ident: Elem>)? ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $inner:ident) => {
        $(#[$doc])*
        $vis fn $name $(<$T: Elem>)? ($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")]
                unsafe fn avx512 $(<$T: Elem>)? ($($arg: $ty),*) $(-> $ret)? {
                    $inner($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2 $(<$T: Elem>)? ($($arg: $ty),*) $(-> $ret)? {
                    $inner($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU supports the features `avx512` is compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $inner($($arg),*)
        }
    };
}

mod attention;
mod elementwise;
mod gemm;
mod half;
mod linear_half;
mod math;
mod norm;
mod optim;
mod token;

pub(crate) use attention::{attention_backward, attention_forward};
pub(crate) use elementwise::{add, gelu, gelu_derivative, gelu_forward, mse, mul, scaled_diff};
pub(crate) use gemm::{
    gemm_to, linear_backward_input, linear_backward_weight, linear_forward, transpose, Mat,
};
#[doc(hidden)]
pub use half::{bench_amx_peak, bench_gemm, bench_gemm_bf16};
pub(crate) use half::{gelu_forward_half, mul_rounded, to_f32, to_half};
pub(crate) use linear_half::{
    linear_backward_input_half, linear_backward_weight_half, linear_forward_half,
};
pub(crate) use norm::{
    rms_norm_backward_input, rms_norm_backward_weight, rms_norm_forward, rms_norm_forward_half,
};
pub(crate) use optim::{adamw, sgd, AdamWStep};
pub(crate) use token::{cross_entropy, embedding_backward_weight, embedding_forward};

/// Calls `f` with the tensor's elements as one contiguous slice (row-major), copying only if
/// the tensor is a non-contiguous view.
pub(crate) fn read<T: WithDType, R>(
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
    keep_freed_memory();
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

/// A buffer of `len` elements that is written in full before it is read (the output of a
/// GEMM or of an element-wise kernel): no zeroing pass over memory that is overwritten anyway.
pub(crate) struct Uninit<T> {
    buf: Vec<T>,
    len: usize,
}

impl<T> Uninit<T> {
    /// Room for `len` elements, none written yet.
    pub(crate) fn new(len: usize) -> Self {
        Uninit {
            buf: Vec::with_capacity(len),
            len,
        }
    }

    /// The `len` slots to write.
    pub(crate) fn slots(&mut self) -> &mut [MaybeUninit<T>] {
        &mut self.buf.spare_capacity_mut()[..self.len]
    }

    /// The elements.
    ///
    /// # Safety
    ///
    /// Every slot of [`Uninit::slots`] was written.
    pub(crate) unsafe fn assume_init(mut self) -> Vec<T> {
        // SAFETY: capacity is at least `len`, and the caller guarantees all `len` are written.
        unsafe { self.buf.set_len(self.len) };
        self.buf
    }
}

/// The slots as elements.
///
/// # Safety
///
/// Every slot was written.
pub(crate) unsafe fn assume_init_mut<T>(slots: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: MaybeUninit<T> has T's layout, and the caller guarantees every slot is written.
    unsafe { &mut *(slots as *mut [MaybeUninit<T>] as *mut [T]) }
}

/// The largest element of a non-empty slice, as the sequential scan `if x > max { max = x }`
/// from the first element finds it (a NaN first gives NaN, later NaNs are passed over), taken
/// over 16 lanes that are then halved pairwise (the maximum does not depend on the order of
/// the comparisons; a scan over the lanes would be a chain of dependent compares, the most
/// of a short row's time).
#[inline(always)]
pub(crate) fn max_of<T: Elem>(xs: &[T]) -> T {
    const LANES: usize = 16;
    let mut lanes = [xs[0]; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            if x > *m {
                *m = x;
            }
        }
    }
    for (m, &x) in lanes.iter_mut().zip(rest) {
        if x > *m {
            *m = x;
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            let x = lanes[i + width];
            if x > lanes[i] {
                lanes[i] = x;
            }
        }
    }
    lanes[0]
}

/// Lets glibc's allocator keep freed memory for reuse instead of returning it to the kernel.
///
/// A training step frees and allocates the same few buffer sizes (up to a few MiB each) for
/// every micro-batch and layer. With glibc's defaults much of that memory goes back to the
/// kernel between uses (buffers above the mmap threshold are unmapped when freed, and a heap
/// whose free top passes the trim threshold is shrunk), so the next buffer of that size
/// page-faults and is zeroed again: about 30,000 page faults per step of issue 13's GPT
/// comparison, about 12% of its CPU time. Every thread allocates from the one main arena:
/// glibc gives other threads arenas of at most 64 MiB heaps each, which the MiB-sized
/// buffers of wide layers (16 MiB per weight at MLP width 1024) overflow and which are
/// unmapped when they empty, so rank threads page-faulted their buffers in again at every
/// step (one arena: half the page faults, 7-9% shorter steps and a third less resident
/// memory at width 1024; docs/performance.md). Called once, when the first parameter or
/// kernel tensor is made, before a model's rank threads start; the process keeps its peak
/// heap instead of shrinking after it (a training process returns to that peak at every step
/// anyway). Buffers above 32 MiB are still mapped and unmapped on their own.
pub(crate) fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: mallopt only changes the allocator's parameters; all three values are within
            // the ranges glibc accepts (the mmap threshold's maximum is 32 MiB on 64-bit).
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, 1);
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::max_of;

    /// The scan `max_of` stands for: the first element, then every later one that is larger.
    fn scan(xs: &[f32]) -> f32 {
        let mut max = xs[0];
        for &x in &xs[1..] {
            if x > max {
                max = x;
            }
        }
        max
    }

    /// The lanes and their pairwise halving find the scan's maximum at every length around
    /// the lane count, with the largest element anywhere; a NaN first gives NaN and a NaN
    /// later is passed over, as in the scan.
    #[test]
    fn max_of_is_the_scans_maximum() {
        for len in 1..=70 {
            for at in 0..len {
                let mut xs: Vec<f32> = (0..len)
                    .map(|i| ((i * 7919 + len * 31) % 211) as f32 - 300.0)
                    .collect();
                xs[at] = 1.5;
                assert_eq!(max_of(&xs), scan(&xs), "len {len}, largest at {at}");
                let mut later_nan = xs.clone();
                later_nan[len - 1] = f32::NAN;
                if len > 1 && at != len - 1 {
                    assert_eq!(max_of(&later_nan), 1.5, "len {len}, NaN last");
                }
                xs[0] = f32::NAN;
                assert!(
                    max_of(&xs).is_nan() && scan(&xs).is_nan(),
                    "len {len}, NaN first"
                );
            }
        }
    }
}
