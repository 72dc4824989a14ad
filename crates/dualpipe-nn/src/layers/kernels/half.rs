//! Mixed-precision GEMMs: operands rounded to bf16 or f16, products accumulated in f32, and the
//! conversions between f32 tensors and half-precision ones.
//!
//! Three paths compute a GEMM ([`HalfPath`]):
//!
//! - **AMX** (bf16 on Linux on x86-64 processors with AMX-BF16, Sapphire Rapids and later
//!   Xeons; `amx`): the same blocking around `tdpbf16ps` tiles, 16 384 FLOPs per
//!   instruction. On one such core (an Intel Xeon with AMX, measured through the GPU machine's
//!   host) it runs the GPT's d-512 GEMMs at 3.7-4.7x the f32 GEMM (568-767 GFLOP/s), 19-26%
//!   of the tiles' measured peak. What bounds it is not established: packing the operands
//!   takes an eighth to under a third of that time, and neither other blockings nor
//!   prefetching the next block's lines moved it by more than a tenth. Preferred over the
//!   next path where both exist (`vdpbf16ps` ran at half the f32 FMA rate there).
//! - **Native** (bf16 on x86-64 processors with AVX512_BF16, such as Zen 4 or Sapphire Rapids;
//!   `native`): a blocked GEMM around `vdpbf16ps`, which multiplies pairs of bf16 values and
//!   accumulates in f32 at twice the rate of f32 FMAs. Packing the operands into the
//!   microkernel's panels rounds f32 values to bf16 on the way, so there is no separate
//!   conversion pass. On one Zen 4 core it runs the GPT's d-512 GEMMs at about 1.8-2x the f32
//!   GEMM's FLOP/s, 70-90% of the measured `vdpbf16ps` peak (`examples/gemm_peak.rs`).
//!   `vdpbf16ps` treats subnormal bf16 inputs as zero and flushes subnormal results, so this
//!   path differs from the converting one below f32's smallest normal value as well as by
//!   the accumulation order.
//! - **Converting** (f16 everywhere, bf16 without AVX512_BF16): each operand is rounded to the
//!   half format and widened back to f32 in one vectorized pass into a reused buffer, then
//!   multiplied by the f32 GEMM. Products of two half values are exact in f32, so this path
//!   differs from a native one only by the accumulation's rounding; it is no faster than f32.
//!
//! There is no native f16 path: AVX512_FP16 accumulates in f16, not f32, and AMX has f16
//! tiles only from Granite Rapids on (AMX-FP16), which no machine here has.
//!
//! Rounding is to nearest even everywhere, bit for bit as `half::bf16::from_f32` and
//! `half::f16::from_f32` (NaN quieted; f32 subnormals rounded, not flushed), and widening
//! matches `to_f32` of the `half` crate (exact; a signalling NaN quieted). Both paths keep
//! their packing buffers in thread-locals (each pipeline rank is one thread), so a GEMM
//! allocates only when it is larger than the thread's largest so far.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};

use super::gemm::{gemm, gemm_raw, Mat};
use super::{keep_freed_memory, read, Uninit};
use crate::error::{NnError, TensorContext};
use crate::precision::Half;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
#[cfg(target_arch = "x86_64")]
mod native;

/// A GEMM operand: f32 (rounded to the half format as it is read) or already half precision.
#[derive(Clone, Copy)]
pub(crate) enum HalfOperand<'a> {
    /// f32 values, rounded to the GEMM's format.
    F32(Mat<'a, f32>),
    /// bf16 values.
    Bf16(Mat<'a, bf16>),
    /// f16 values.
    F16(Mat<'a, f16>),
}

impl HalfOperand<'_> {
    /// `(rows, cols)`.
    pub(crate) fn dims(&self) -> (usize, usize) {
        match self {
            HalfOperand::F32(m) => (m.rows, m.cols),
            HalfOperand::Bf16(m) => (m.rows, m.cols),
            HalfOperand::F16(m) => (m.rows, m.cols),
        }
    }

    /// The transpose (a view, no copy).
    pub(crate) fn t(self) -> Self {
        match self {
            HalfOperand::F32(m) => HalfOperand::F32(m.t()),
            HalfOperand::Bf16(m) => HalfOperand::Bf16(m.t()),
            HalfOperand::F16(m) => HalfOperand::F16(m.t()),
        }
    }

    /// Whether every element `(i, j)` lies inside the operand's slice.
    fn fits(&self) -> bool {
        fn fits<T>(x: &Mat<'_, T>) -> bool {
            x.rows == 0 || x.cols == 0 || (x.rows - 1) * x.rs + (x.cols - 1) * x.cs < x.data.len()
        }
        match self {
            HalfOperand::F32(m) => fits(m),
            HalfOperand::Bf16(m) => fits(m),
            HalfOperand::F16(m) => fits(m),
        }
    }

    /// An error if the operand is half precision of the other format than `half`.
    fn check_format(&self, half: Half, what: &str) -> Result<(), NnError> {
        match (self, half) {
            (HalfOperand::Bf16(_), Half::F16) | (HalfOperand::F16(_), Half::Bf16) => {
                Err(NnError::Stage(format!(
                    "{what}: a half-precision operand of the other format than {}",
                    half.name()
                )))
            }
            _ => Ok(()),
        }
    }

    /// The operand with each value rounded to `half` and widened back to f32, written into
    /// `buf` (row-major, or column-major when the operand's columns are contiguous); returns
    /// the strides `(rs, cs)` of the copy in `buf`.
    fn widen_into(&self, half: Half, buf: &mut Vec<f32>) -> (usize, usize) {
        match (self, half) {
            (HalfOperand::F32(m), Half::Bf16) => widen(m, buf, round_bf16, |x| {
                f32::from_bits((bf16_bits(x) as u32) << 16)
            }),
            (HalfOperand::F32(m), Half::F16) => {
                widen(m, buf, round_f16, |x| f16::from_f32(x).to_f32())
            }
            (HalfOperand::Bf16(m), _) => widen(m, buf, bf16_to_f32, bf16::to_f32),
            (HalfOperand::F16(m), _) => widen(m, buf, f16_to_f32, f16::to_f32),
        }
    }
}

/// `m`'s values converted by `line` (runs of contiguous elements) or `one` (single strided
/// elements) into `buf`, in `m`'s own layout when its rows or its columns are contiguous (row
/// -major otherwise); returns the strides `(rs, cs)` of the copy.
fn widen<T: Copy>(
    m: &Mat<'_, T>,
    buf: &mut Vec<f32>,
    line: fn(&[T], &mut [MaybeUninit<f32>]),
    one: fn(T) -> f32,
) -> (usize, usize) {
    let (rows, cols) = (m.rows, m.cols);
    buf.clear();
    buf.reserve(rows * cols);
    let out = &mut buf.spare_capacity_mut()[..rows * cols];
    let strides = if rows == 0 || cols == 0 {
        (cols, 1)
    } else if m.cs == 1 {
        for (i, o) in out.chunks_exact_mut(cols).enumerate() {
            line(&m.data[i * m.rs..i * m.rs + cols], o);
        }
        (cols, 1)
    } else if m.rs == 1 {
        for (j, o) in out.chunks_exact_mut(rows).enumerate() {
            line(&m.data[j * m.cs..j * m.cs + rows], o);
        }
        (1, rows)
    } else {
        for (i, o) in out.chunks_exact_mut(cols).enumerate() {
            for (j, o) in o.iter_mut().enumerate() {
                o.write(one(m.data[i * m.rs + j * m.cs]));
            }
        }
        (cols, 1)
    };
    // SAFETY: every one of the rows·cols slots was written above.
    unsafe { buf.set_len(rows * cols) };
    strides
}

/// How a half-precision GEMM computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HalfPath {
    /// AMX tiles (bf16 on Linux with AMX-BF16 only).
    Amx,
    /// The processor's bf16 dot-product instructions (bf16 with AVX512_BF16 only).
    Native,
    /// Operands rounded and widened to f32, then the f32 GEMM (every format and processor).
    Converting,
}

impl HalfPath {
    /// Whether this processor has the native path for `half`.
    pub(crate) fn native_available(half: Half) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            half == Half::Bf16 && native::available()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = half;
            false
        }
    }

    /// Whether this processor (and the operating system) lets `half` run on AMX tiles.
    pub(crate) fn amx_available(half: Half) -> bool {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            // (Or the tests' model of the tiles, on this thread.)
            half == Half::Bf16 && (amx::available() || amx::modelled())
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            let _ = half;
            false
        }
    }

    /// The path's name in messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            HalfPath::Amx => "AMX",
            HalfPath::Native => "AVX512_BF16",
            HalfPath::Converting => "converting",
        }
    }

    /// Whether this processor has `path` for `half`.
    pub(crate) fn available(self, half: Half) -> bool {
        match self {
            HalfPath::Amx => HalfPath::amx_available(half),
            HalfPath::Native => HalfPath::native_available(half),
            HalfPath::Converting => true,
        }
    }

    /// The fastest path for `half` on this processor.
    pub(crate) fn best(half: Half) -> HalfPath {
        [HalfPath::Amx, HalfPath::Native]
            .into_iter()
            .find(|p| p.available(half))
            .unwrap_or(HalfPath::Converting)
    }
}

/// A half-precision element type: its slices rounded from f32, widened to f32, and read as a
/// GEMM operand.
pub(crate) trait HalfElem: candle_core::WithDType {
    /// The format.
    const HALF: Half;
    /// The matrix as a GEMM operand.
    fn operand(m: Mat<'_, Self>) -> HalfOperand<'_>;
    /// `dst[i] = src[i]` rounded to nearest even.
    fn round(src: &[f32], dst: &mut [MaybeUninit<Self>]);
    /// `dst[i] = src[i]` as f32 (exact).
    fn widen(src: &[Self], dst: &mut [MaybeUninit<f32>]);
}

/// `impl HalfElem for $t` with its format and slice conversions.
macro_rules! half_elem {
    ($t:ty, $variant:ident, $round:ident, $widen:ident) => {
        impl HalfElem for $t {
            const HALF: Half = Half::$variant;
            fn operand(m: Mat<'_, $t>) -> HalfOperand<'_> {
                HalfOperand::$variant(m)
            }
            fn round(src: &[f32], dst: &mut [MaybeUninit<$t>]) {
                $round(src, dst)
            }
            fn widen(src: &[$t], dst: &mut [MaybeUninit<f32>]) {
                $widen(src, dst)
            }
        }
    };
}

half_elem!(bf16, Bf16, f32_to_bf16, bf16_to_f32);
half_elem!(f16, F16, f32_to_f16, f16_to_f32);

/// Work a product may leave out because it cannot change what is wanted: causal attention's
/// triangular operands and outputs. The native kernels use it (`vdpbf16ps` per tile and pair
/// of `k` steps, AMX per 32 × 32 block and tile of 32 steps); the converting path computes
/// every product, which gives the same values (the steps left out add exact zeros).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Skip {
    /// Nothing left out.
    None,
    /// The output's entries above the diagonal (`j > i`) are not wanted: they are written,
    /// with unspecified values (a tile wholly above the diagonal gets the start alone).
    AboveDiagonal,
    /// `a[i, l] = 0` for every `l > i` (lower triangular): a tile stops after its last row.
    ALower,
    /// `a[i, l] = 0` for every `l < i` (upper triangular): a tile starts at its first row.
    AUpper,
}

impl Skip {
    /// The pairs `lo..hi` of a block's `kp` pairs of `k` steps that the tile of `rows` rows
    /// from row `r0`, first column `c0`, needs, the block's first step being `pc`.
    fn pairs(self, r0: usize, rows: usize, c0: usize, pc: usize, kp: usize) -> (usize, usize) {
        let last = r0 + rows - 1;
        match self {
            Skip::None => (0, kp),
            Skip::AboveDiagonal if c0 > last => (0, 0),
            Skip::AboveDiagonal => (0, kp),
            Skip::ALower if last < pc => (0, 0),
            Skip::ALower => (0, kp.min((last - pc) / 2 + 1)),
            Skip::AUpper => (kp.min(r0.saturating_sub(pc) / 2), kp),
        }
    }
}

/// `dst = a·b` (or `dst += a·b` when `accumulate`), `dst` row-major `[a.rows, b.cols]` f32,
/// the operands' values rounded to `half`, the products accumulated in f32, on the fastest
/// path of this processor ([`HalfPath::best`]).
pub(crate) fn gemm_half(
    half: Half,
    dst: &mut [f32],
    a: HalfOperand<'_>,
    b: HalfOperand<'_>,
    accumulate: bool,
    what: &str,
) -> Result<(), NnError> {
    gemm_half_with(HalfPath::best(half), half, dst, a, b, accumulate, what)
}

/// [`gemm_half`] on the given path (an error for [`HalfPath::Native`] where this processor or
/// the format has none).
pub(crate) fn gemm_half_with(
    path: HalfPath,
    half: Half,
    dst: &mut [f32],
    a: HalfOperand<'_>,
    b: HalfOperand<'_>,
    accumulate: bool,
    what: &str,
) -> Result<(), NnError> {
    let n = b.dims().1;
    // SAFETY: dst is a live, initialized slice of dst.len() elements, borrowed mutably.
    unsafe {
        let out = Dst {
            ptr: dst.as_mut_ptr(),
            len: dst.len(),
            ldc: n,
        };
        let start = if accumulate { Start::Dst } else { Start::Zero };
        gemm_half_raw(path, half, out, a, b, start, Skip::None, what)
    }
}

/// `dst[i·ldc + j] = (a·b)[i, j]` for every `i < a.rows`, `j < b.cols`, the operands' values
/// rounded to `half` and the products accumulated in f32 on this processor's fastest path:
/// the product written into rows of a wider, possibly not yet initialized, buffer (one
/// attention head's columns, say).
pub(crate) fn gemm_half_to(
    half: Half,
    dst: &mut [MaybeUninit<f32>],
    ldc: usize,
    a: HalfOperand<'_>,
    b: HalfOperand<'_>,
    skip: Skip,
    what: &str,
) -> Result<(), NnError> {
    // SAFETY: dst is a live slice borrowed mutably; without accumulation the GEMM only
    // writes (initialized values) into it.
    unsafe {
        let out = Dst {
            ptr: dst.as_mut_ptr().cast(),
            len: dst.len(),
            ldc,
        };
        gemm_half_raw(
            HalfPath::best(half),
            half,
            out,
            a,
            b,
            Start::Zero,
            skip,
            what,
        )
    }
}

/// `dst = start + a·b` (both `[a.rows, b.cols]`, rows `b.cols` apart), the operands' values
/// rounded to `half` and the products accumulated in f32 on this processor's fastest path:
/// a gradient accumulated into a new tensor without copying the old one first (the native
/// kernel reads `start` where it would read `dst`).
pub(crate) fn gemm_half_from(
    half: Half,
    dst: &mut [MaybeUninit<f32>],
    start: &[f32],
    a: HalfOperand<'_>,
    b: HalfOperand<'_>,
    what: &str,
) -> Result<(), NnError> {
    if start.len() != dst.len() {
        return Err(NnError::Stage(format!(
            "{what}: a start of {} elements for a product of {}",
            start.len(),
            dst.len()
        )));
    }
    // SAFETY: dst is a live slice borrowed mutably, start one of the same length borrowed
    // shared (so they do not overlap); the GEMM only writes initialized values into dst.
    unsafe {
        let out = Dst {
            ptr: dst.as_mut_ptr().cast(),
            len: dst.len(),
            ldc: b.dims().1,
        };
        gemm_half_raw(
            HalfPath::best(half),
            half,
            out,
            a,
            b,
            Start::Other(start),
            Skip::None,
            what,
        )
    }
}

/// What a GEMM adds its product to.
#[derive(Clone, Copy)]
enum Start<'s> {
    /// Nothing: the product is written.
    Zero,
    /// The output's own values (accumulation).
    Dst,
    /// Another matrix laid out as the output (as long, rows as far apart), not overlapping it.
    Other(&'s [f32]),
}

/// Where a GEMM writes: `len` f32 elements from `ptr`, the output's rows `ldc` apart.
#[derive(Clone, Copy)]
struct Dst {
    ptr: *mut f32,
    len: usize,
    ldc: usize,
}

/// `dst[i·ldc + j] = start + (a·b)[i, j]` on `path`, after checking the shapes, the formats
/// and that the processor has the path.
///
/// # Safety
///
/// `dst`'s `len` elements may be written (and, for [`Start::Dst`], are initialized and read)
/// and alias neither operand; a [`Start::Other`] is `len` elements long.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_half_raw(
    path: HalfPath,
    half: Half,
    dst: Dst,
    a: HalfOperand<'_>,
    b: HalfOperand<'_>,
    start: Start<'_>,
    skip: Skip,
    what: &str,
) -> Result<(), NnError> {
    let Dst { ptr, len, ldc } = dst;
    a.check_format(half, what)?;
    b.check_format(half, what)?;
    let (m, k) = a.dims();
    let (k2, n) = b.dims();
    let dst_fits = m == 0 || n == 0 || (ldc >= n && (m - 1) * ldc + n <= len);
    if k2 != k || !dst_fits || !a.fits() || !b.fits() {
        return Err(NnError::Stage(format!(
            "{what}: shapes do not fit: [{m}, {k}] x [{k2}, {n}] into {len} elements, rows {ldc} apart"
        )));
    }
    if !path.available(half) {
        return Err(NnError::Stage(format!(
            "{what}: this processor has no {} {} GEMM",
            path.name(),
            half.name()
        )));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    // SAFETY: the m rows of n elements, ldc apart, lie inside dst's len elements (checked
    // above), which the caller lets us write (and read when accumulating).
    unsafe {
        // The converting path (and a product with no steps of k) takes the start copied
        // into the output first; the native kernels read it where it is.
        let start = match start {
            Start::Other(s) if k == 0 || path == HalfPath::Converting => {
                copy_rows(s.as_ptr(), ptr, ldc, m, n);
                Start::Dst
            }
            start => start,
        };
        if k == 0 {
            if let Start::Zero = start {
                for i in 0..m {
                    std::ptr::write_bytes(ptr.add(i * ldc), 0, n);
                }
            }
            return Ok(());
        }
        let from = match start {
            Start::Zero => None,
            Start::Dst => Some(ptr.cast_const()),
            Start::Other(s) => Some(s.as_ptr()),
        };
        match path {
            HalfPath::Amx | HalfPath::Native => native_gemm(path, ptr, ldc, a, b, from, skip, what),
            HalfPath::Converting => converting_gemm(half, dst, a, b, from.is_some(), what),
        }
    }
}

/// `dst`'s `m` rows of `n` elements, `ldc` apart, set to those of `src`.
///
/// # Safety
///
/// Both hold those rows, `dst`'s writable, and they do not overlap.
unsafe fn copy_rows(src: *const f32, dst: *mut f32, ldc: usize, m: usize, n: usize) {
    for i in 0..m {
        // SAFETY: as the caller vouches.
        unsafe { std::ptr::copy_nonoverlapping(src.add(i * ldc), dst.add(i * ldc), n) };
    }
}

/// The bf16 GEMM on the processor's own instructions, `path` AMX or `vdpbf16ps` (shapes and
/// formats checked, `m, n, k` not zero, the path available), adding the product to `from`
/// (rows `ldc` apart) where there is one: `c` itself, or another matrix not overlapping it.
///
/// # Safety
///
/// The `a.rows` rows of `b.cols` elements of `dst`, `ldc` apart, may be written, those of
/// `from` read, and neither aliases an operand.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn native_gemm(
    path: HalfPath,
    c: *mut f32,
    ldc: usize,
    a: HalfOperand<'_>,
    b: HalfOperand<'_>,
    from: Option<*const f32>,
    skip: Skip,
    what: &str,
) -> Result<(), NnError> {
    /// One GEMM on `path`'s kernel.
    ///
    /// # Safety
    ///
    /// As `native::gemm` (and `amx::gemm` for [`HalfPath::Amx`]).
    unsafe fn run<A: native::Src, B: native::Src>(
        path: HalfPath,
        c: *mut f32,
        ldc: usize,
        a: Mat<'_, A>,
        b: Mat<'_, B>,
        from: Option<*const f32>,
        skip: Skip,
    ) {
        // SAFETY: as the caller vouches.
        unsafe {
            match path {
                #[cfg(target_os = "linux")]
                HalfPath::Amx => amx::gemm(c, ldc, a, b, from, skip),
                _ => native::gemm(c, ldc, a, b, from, skip),
            }
        }
    }
    // SAFETY: the caller checked the shapes (a.cols == b.rows, every operand element inside
    // its slice) and that the processor has the path, and vouches for dst.
    unsafe {
        match (a, b) {
            (HalfOperand::F32(a), HalfOperand::F32(b)) => run(path, c, ldc, a, b, from, skip),
            (HalfOperand::F32(a), HalfOperand::Bf16(b)) => run(path, c, ldc, a, b, from, skip),
            (HalfOperand::Bf16(a), HalfOperand::F32(b)) => run(path, c, ldc, a, b, from, skip),
            (HalfOperand::Bf16(a), HalfOperand::Bf16(b)) => run(path, c, ldc, a, b, from, skip),
            _ => {
                return Err(NnError::Stage(format!(
                    "{what}: no native path for f16 operands"
                )))
            }
        }
    }
    Ok(())
}

/// The native bf16 GEMM: none off x86-64 ([`HalfPath::available`] is false there).
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn native_gemm(
    _path: HalfPath,
    _c: *mut f32,
    _ldc: usize,
    _a: HalfOperand<'_>,
    _b: HalfOperand<'_>,
    _from: Option<*const f32>,
    _skip: Skip,
    what: &str,
) -> Result<(), NnError> {
    Err(NnError::Stage(format!("{what}: no native bf16 GEMM")))
}

thread_local! {
    /// The widened copies of the converting path's operands, reused from call to call.
    static WIDE: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The converting path: both operands rounded and widened into reused f32 buffers, then the
/// f32 GEMM.
///
/// # Safety
///
/// As [`gemm_half_raw`].
unsafe fn converting_gemm(
    half: Half,
    dst: Dst,
    a: HalfOperand<'_>,
    b: HalfOperand<'_>,
    accumulate: bool,
    what: &str,
) -> Result<(), NnError> {
    let (m, k) = a.dims();
    let n = b.dims().1;
    WIDE.with(|wide| {
        let mut wide = wide.borrow_mut();
        let (abuf, bbuf) = &mut *wide;
        let (ars, acs) = a.widen_into(half, abuf);
        let (brs, bcs) = b.widen_into(half, bbuf);
        // SAFETY: as the caller vouches.
        unsafe {
            gemm_raw(
                dst.ptr,
                dst.len,
                dst.ldc,
                Mat::strided(abuf, m, k, ars, acs),
                Mat::strided(bbuf, k, n, brs, bcs),
                accumulate,
                what,
            )
        }
    })
}

/// The f32 tensor `x` rounded to `half` (round to nearest even), contiguous.
pub(crate) fn to_half(x: &Tensor, half: Half) -> Result<Tensor, NnError> {
    const WHAT: &str = "rounding to half precision";
    if x.dtype() != DType::F32 {
        return x.to_dtype(half.dtype()).ctx(WHAT);
    }
    let shape = x.shape().clone();
    keep_freed_memory();
    match half {
        Half::Bf16 => {
            let v = read::<f32, _>(x, WHAT, |s| {
                let mut out = Uninit::new(s.len());
                f32_to_bf16(s, out.slots());
                // SAFETY: f32_to_bf16 wrote every slot.
                unsafe { out.assume_init() }
            })?;
            Tensor::from_vec(v, shape, &Device::Cpu).ctx(WHAT)
        }
        Half::F16 => {
            let v = read::<f32, _>(x, WHAT, |s| {
                let mut out = Uninit::new(s.len());
                f32_to_f16(s, out.slots());
                // SAFETY: f32_to_f16 wrote every slot.
                unsafe { out.assume_init() }
            })?;
            Tensor::from_vec(v, shape, &Device::Cpu).ctx(WHAT)
        }
    }
}

/// Elements per piece of the fused conversions below: a piece's f32 scratch (16 KiB each, two
/// at most) stays in L1 between the passes over it.
const PIECE: usize = 4096;

/// `(gelu(x), gelu'(x))` for f32 `x`, both rounded to `half` as they are made (the next
/// `Linear` reads `gelu(x)` in `half`, the backward the derivative): the f32 GELU with fused
/// multiply-adds piece by piece, then [`to_half`]'s rounding, without f32 tensors between.
pub(crate) fn gelu_forward_half(x: &Tensor, half: Half) -> Result<(Tensor, Tensor), NnError> {
    const WHAT: &str = "GELU forward (mixed precision)";
    /// Each piece's values and derivatives through f32 scratch, then rounded.
    fn pieces<H: HalfElem>(
        x: &[f32],
        shape: &candle_core::Shape,
    ) -> Result<(Tensor, Tensor), NnError> {
        let mut y = Uninit::<H>::new(x.len());
        let mut d = Uninit::<H>::new(x.len());
        let mut ys = Uninit::<f32>::new(PIECE.min(x.len()));
        let mut ds = Uninit::<f32>::new(PIECE.min(x.len()));
        for ((xs, yh), dh) in x
            .chunks(PIECE)
            .zip(y.slots().chunks_mut(PIECE))
            .zip(d.slots().chunks_mut(PIECE))
        {
            let (yt, dt) = (&mut ys.slots()[..xs.len()], &mut ds.slots()[..xs.len()]);
            super::math::gelu_forward_fused_wide(xs, yt, dt);
            // SAFETY: gelu_forward_fused_wide wrote every slot of yt and dt.
            let (yt, dt) = unsafe { (super::assume_init_mut(yt), super::assume_init_mut(dt)) };
            H::round(yt, yh);
            H::round(dt, dh);
        }
        // SAFETY: every piece wrote its slots of y and d.
        let (y, d) = unsafe { (y.assume_init(), d.assume_init()) };
        Ok((
            Tensor::from_vec(y, shape.clone(), &Device::Cpu).ctx(WHAT)?,
            Tensor::from_vec(d, shape.clone(), &Device::Cpu).ctx(WHAT)?,
        ))
    }
    if x.dtype() != DType::F32 {
        return Err(NnError::Stage(format!(
            "{WHAT}: mixed precision runs on f32 activations, not {:?}",
            x.dtype()
        )));
    }
    keep_freed_memory();
    let shape = x.shape().clone();
    read::<f32, _>(x, WHAT, |x| match half {
        Half::Bf16 => pieces::<bf16>(x, &shape),
        Half::F16 => pieces::<f16>(x, &shape),
    })?
}

/// `a ⊙ b` for f32 `a` and a half-precision `b` of the same shape, rounded to `b`'s format:
/// the values of `to_half(mul(a, to_f32(b)))`, piece by piece without the f32 tensors.
pub(crate) fn mul_rounded(a: &Tensor, b: &Tensor, what: &str) -> Result<Tensor, NnError> {
    /// `round(a ⊙ widen(b))` through f32 scratch pieces.
    fn pieces<H: HalfElem>(a: &[f32], b: &[H]) -> Vec<H> {
        let mut out = Uninit::<H>::new(a.len());
        let mut wide = Uninit::<f32>::new(PIECE.min(a.len()));
        let mut product = Uninit::<f32>::new(PIECE.min(a.len()));
        for ((av, bv), ov) in a
            .chunks(PIECE)
            .zip(b.chunks(PIECE))
            .zip(out.slots().chunks_mut(PIECE))
        {
            let (w, p) = (
                &mut wide.slots()[..bv.len()],
                &mut product.slots()[..bv.len()],
            );
            H::widen(bv, w);
            // SAFETY: widen wrote every slot of w.
            product_into(av, unsafe { super::assume_init_mut(w) }, p);
            // SAFETY: product_into wrote every slot of p.
            H::round(unsafe { super::assume_init_mut(p) }, ov);
        }
        // SAFETY: every piece wrote its slots.
        unsafe { out.assume_init() }
    }
    if a.dims() != b.dims() || a.dtype() != DType::F32 {
        return Err(NnError::Stage(format!(
            "{what}: {:?} {:?} and {:?} {:?}: expected f32 and a half-precision tensor of one shape",
            a.dtype(),
            a.dims(),
            b.dtype(),
            b.dims()
        )));
    }
    keep_freed_memory();
    let shape = a.shape().clone();
    if !matches!(b.dtype(), DType::BF16 | DType::F16) {
        return Err(NnError::Stage(format!(
            "{what}: {:?} is not a half-precision type",
            b.dtype()
        )));
    }
    let dev = &Device::Cpu;
    read::<f32, _>(a, what, |a| match b.dtype() {
        DType::BF16 => read::<bf16, _>(b, what, |b| Tensor::from_vec(pieces(a, b), &shape, dev)),
        _ => read::<f16, _>(b, what, |b| Tensor::from_vec(pieces(a, b), &shape, dev)),
    })??
    .ctx(what)
}

wide_kernel! {
    /// `out = a ⊙ b` elementwise.
    fn product_into(a: &[f32], b: &[f32], out: &mut [MaybeUninit<f32>]) => product_into_inline
}

#[inline(always)]
fn product_into_inline(a: &[f32], b: &[f32], out: &mut [MaybeUninit<f32>]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        o.write(x * y);
    }
}

/// `x` as f32 (a half-precision tensor widened exactly; an f32 one returned as is).
pub(crate) fn to_f32(x: &Tensor) -> Result<Tensor, NnError> {
    const WHAT: &str = "widening to f32";
    fn widened<T: candle_core::WithDType>(
        x: &Tensor,
        f: fn(&[T], &mut [MaybeUninit<f32>]),
    ) -> Result<Tensor, NnError> {
        let v = read::<T, _>(x, WHAT, |s| {
            let mut out = Uninit::new(s.len());
            f(s, out.slots());
            // SAFETY: the conversion wrote every slot.
            unsafe { out.assume_init() }
        })?;
        keep_freed_memory();
        Tensor::from_vec(v, x.shape().clone(), &Device::Cpu).ctx(WHAT)
    }
    match x.dtype() {
        DType::F32 => Ok(x.clone()),
        DType::BF16 => widened::<bf16>(x, bf16_to_f32),
        DType::F16 => widened::<f16>(x, f16_to_f32),
        _ => x.to_dtype(DType::F32).ctx(WHAT),
    }
}

/// The bf16 bits of `x` rounded to nearest even, NaN quieted with its upper payload kept:
/// `half::bf16::from_f32(x).to_bits()`, branch-free so that loops over it vectorize.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let quiet = (b >> 16) | 0x40;
    if b & 0x7fff_ffff > 0x7f80_0000 {
        quiet as u16
    } else {
        rounded as u16
    }
}

#[inline(always)]
fn f32_to_bf16_inner(src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(bf16::from_bits(bf16_bits(x)));
    }
}

#[inline(always)]
fn round_bf16_inner(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(f32::from_bits((bf16_bits(x) as u32) << 16));
    }
}

/// The f32 value of the bf16 bits `x`: exact, a signalling NaN quieted (as
/// `half::bf16::to_f32` and the processor's conversions do).
#[inline(always)]
fn bf16_bits_to_f32(x: u16) -> f32 {
    let wide = (x as u32) << 16;
    f32::from_bits(if x & 0x7fff > 0x7f80 {
        wide | 0x0040_0000
    } else {
        wide
    })
}

#[inline(always)]
fn bf16_to_f32_inner(src: &[bf16], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(bf16_bits_to_f32(x.to_bits()));
    }
}

wide_kernel! {
    /// `dst[i] = bf16(src[i])` (round to nearest even), vectorized.
    fn f32_to_bf16(src: &[f32], dst: &mut [MaybeUninit<bf16>]) => f32_to_bf16_inner
}

wide_kernel! {
    /// `dst[i] = f32(bf16(src[i]))`: f32 values rounded to bf16, vectorized.
    fn round_bf16(src: &[f32], dst: &mut [MaybeUninit<f32>]) => round_bf16_inner
}

wide_kernel! {
    /// `dst[i] = f32(src[i])` (exact; NaN quieted), vectorized.
    fn bf16_to_f32(src: &[bf16], dst: &mut [MaybeUninit<f32>]) => bf16_to_f32_inner
}

/// Whether the AVX-512 f16 conversions (`vcvtps2ph`, `vcvtph2ps` on zmm) can run.
#[cfg(target_arch = "x86_64")]
fn avx512_f16() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// `dst[i] = f16(src[i])` (round to nearest even).
fn f32_to_f16(src: &[f32], dst: &mut [MaybeUninit<f16>]) {
    #[cfg(target_arch = "x86_64")]
    if avx512_f16() {
        // SAFETY: the processor has the features f16_avx512 is compiled for.
        return unsafe { f16_avx512::from_f32(src, dst) };
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(f16::from_f32(x));
    }
}

/// `dst[i] = f32(f16(src[i]))`: f32 values rounded to f16.
fn round_f16(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    if avx512_f16() {
        // SAFETY: as above; `dst` has the f32 slots `round` asks for.
        return unsafe { f16_avx512::round(src, dst) };
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(f16::from_f32(x).to_f32());
    }
}

/// `dst[i] = f32(src[i])` (exact).
fn f16_to_f32(src: &[f16], dst: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    if avx512_f16() {
        // SAFETY: as above.
        return unsafe { f16_avx512::to_f32(src, dst) };
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(x.to_f32());
    }
}

/// f16 conversions 16 lanes at a time (the same rounding as F16C's, which the `half` crate
/// uses).
#[cfg(target_arch = "x86_64")]
mod f16_avx512 {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    use half::f16;

    /// The mask of the first `count` (at most 16) lanes.
    fn mask16(count: usize) -> u16 {
        if count >= 16 {
            u16::MAX
        } else {
            (1u16 << count) - 1
        }
    }

    /// `dst[i] = f16(src[i])`.
    ///
    /// # Safety
    ///
    /// The processor has AVX-512 F, BW and VL.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn from_f32(src: &[f32], dst: &mut [MaybeUninit<f16>]) {
        let n = src.len().min(dst.len());
        // SAFETY: the masked loads and stores touch only the first n elements.
        unsafe {
            for i in (0..n).step_by(16) {
                let m = mask16(n - i);
                let v = _mm512_maskz_loadu_ps(m, src.as_ptr().add(i));
                let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(i).cast(), m, h);
            }
        }
    }

    /// `dst[i] = f32(f16(src[i]))`.
    ///
    /// # Safety
    ///
    /// As [`from_f32`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn round(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
        let n = src.len().min(dst.len());
        // SAFETY: as above.
        unsafe {
            for i in (0..n).step_by(16) {
                let m = mask16(n - i);
                let v = _mm512_maskz_loadu_ps(m, src.as_ptr().add(i));
                let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i).cast(), m, _mm512_cvtph_ps(h));
            }
        }
    }

    /// `dst[i] = f32(src[i])`.
    ///
    /// # Safety
    ///
    /// As [`from_f32`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn to_f32(src: &[f16], dst: &mut [MaybeUninit<f32>]) {
        let n = src.len().min(dst.len());
        // SAFETY: as above.
        unsafe {
            for i in (0..n).step_by(16) {
                let m = mask16(n - i);
                let h = _mm256_maskz_loadu_epi16(m, src.as_ptr().add(i).cast());
                _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i).cast(), m, _mm512_cvtph_ps(h));
            }
        }
    }
}

/// Benchmark hook for `examples/gemm_peak.rs`, not an API: `dst = a·b` for the f32 operands
/// `a` (`[m, k]`, or stored `[k, m]` and read transposed when `transposed[0]`) and `b`
/// (`[k, n]`, or `[n, k]` transposed), by `kind`: `"f32"` (the f32 GEMM), `"bf16"` or `"f16"`
/// (the mixed-precision GEMM on its fastest path), `"bf16-converting"` (bf16 on the
/// converting path), `"bf16-avx512"` (bf16 on `vdpbf16ps`, where there is AMX too),
/// `"bf16-amx:KC,MC,NC"` (bf16 on AMX with that blocking instead of the kernel's own).
#[doc(hidden)]
pub fn bench_gemm(
    kind: &str,
    [m, k, n]: [usize; 3],
    transposed: [bool; 2],
    a: &[f32],
    b: &[f32],
    dst: &mut [f32],
) -> Result<(), NnError> {
    const WHAT: &str = "benchmark GEMM";
    let a = if transposed[0] {
        Mat::new(a, k, m).t()
    } else {
        Mat::new(a, m, k)
    };
    let b = if transposed[1] {
        Mat::new(b, n, k).t()
    } else {
        Mat::new(b, k, n)
    };
    let (a16, b16) = (HalfOperand::F32(a), HalfOperand::F32(b));
    match kind {
        "f32" => gemm(dst, a, b, false, WHAT),
        "bf16" => gemm_half(Half::Bf16, dst, a16, b16, false, WHAT),
        "f16" => gemm_half(Half::F16, dst, a16, b16, false, WHAT),
        "bf16-converting" => {
            gemm_half_with(HalfPath::Converting, Half::Bf16, dst, a16, b16, false, WHAT)
        }
        "bf16-avx512" => gemm_half_with(HalfPath::Native, Half::Bf16, dst, a16, b16, false, WHAT),
        other => match other.strip_prefix("bf16-amx:") {
            Some(sizes) => bench_amx_blocked(sizes, dst, a, b),
            None => Err(NnError::Stage(format!("{WHAT}: unknown kind {other}"))),
        },
    }
}

/// The bf16 GEMM on AMX with the blocking `sizes` (`"KC,MC,NC"`) instead of the kernel's
/// own: `examples/gemm_peak.rs` compares blockings with it.
fn bench_amx_blocked(
    sizes: &str,
    dst: &mut [f32],
    a: Mat<'_, f32>,
    b: Mat<'_, f32>,
) -> Result<(), NnError> {
    const WHAT: &str = "benchmark GEMM on AMX";
    let bad = || {
        NnError::Stage(format!(
            "{WHAT}: blocking {sizes:?}: give KC,MC,NC, multiples of 32"
        ))
    };
    let sizes: Vec<usize> = sizes
        .split(',')
        .map(|v| v.trim().parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let [kc, mc, nc] = sizes[..] else {
            return Err(bad());
        };
        let blocking = amx::Blocking { kc, mc, nc };
        if !blocking.valid() {
            return Err(bad());
        }
        if !HalfPath::amx_available(Half::Bf16) {
            return Err(NnError::Stage(format!("{WHAT}: this processor has no AMX")));
        }
        let (m, k, n) = (a.rows, a.cols, b.cols);
        if b.rows != k || dst.len() != m * n || m * k * n == 0 {
            return Err(NnError::Stage(format!("{WHAT}: shapes do not fit")));
        }
        // SAFETY: AMX is available, the shapes fit and are not empty, the operands' elements
        // lie in their slices (Mat::new and its transpose), dst is borrowed mutably.
        unsafe { amx::gemm_blocked(dst.as_mut_ptr(), n, a, b, None, Skip::None, blocking) };
        Ok(())
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = (sizes, dst, a, b);
        Err(NnError::Stage(format!("{WHAT}: no AMX off x86-64 Linux")))
    }
}

/// Benchmark hook for `examples/gemm_peak.rs`, not an API: runs `iters` rounds of four
/// independent `tdpbf16ps` on zero tiles and returns the FLOPs done (the caller times it),
/// `None` where this processor or the operating system has no AMX.
#[doc(hidden)]
pub fn bench_amx_peak(iters: usize) -> Option<f64> {
    if !HalfPath::amx_available(Half::Bf16) {
        return None;
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    // SAFETY: AMX is available (checked above).
    return Some(unsafe { amx::peak(iters) });
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// How an operand is stored.
    #[derive(Clone, Copy, Debug)]
    enum Layout {
        /// Row-major, contiguous.
        RowMajor,
        /// Stored as its transpose (`Mat::new(.., cols, rows).t()`).
        Transposed,
        /// Row-major inside wider rows (a head's columns).
        Padded,
        /// Column-major with padding after each column.
        ColumnPadded,
        /// Neither rows nor columns contiguous.
        Scattered,
    }

    const LAYOUTS: [Layout; 5] = [
        Layout::RowMajor,
        Layout::Transposed,
        Layout::Padded,
        Layout::ColumnPadded,
        Layout::Scattered,
    ];

    /// The element type an operand is stored in.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Kind {
        F32,
        Bf16,
        F16,
    }

    /// An operand's storage (gaps filled with NaN, so that reading one shows) and its values
    /// as the GEMM must see them (rounded to the format).
    struct Operand {
        f32s: Vec<f32>,
        bf16s: Vec<bf16>,
        f16s: Vec<f16>,
        kind: Kind,
        rows: usize,
        cols: usize,
        rs: usize,
        cs: usize,
        rounded: Vec<f64>,
    }

    impl Operand {
        fn new(
            rng: &mut ChaCha8Rng,
            rows: usize,
            cols: usize,
            layout: Layout,
            kind: Kind,
            half: Half,
        ) -> Operand {
            let (rs, cs, len) = match layout {
                Layout::RowMajor => (cols, 1, rows * cols),
                Layout::Transposed => (1, rows, rows * cols),
                Layout::Padded => (cols + 3, 1, rows * (cols + 3)),
                Layout::ColumnPadded => (1, rows + 2, cols * (rows + 2)),
                Layout::Scattered => (2 * cols + 1, 2, rows * (2 * cols + 1)),
            };
            let mut f32s = vec![f32::NAN; len.max(1)];
            let mut rounded = vec![0.0; rows * cols];
            for i in 0..rows {
                for j in 0..cols {
                    let x: f32 = rng.random_range(-1.0..1.0) * 2f32.powi(rng.random_range(-8..8));
                    f32s[i * rs + j * cs] = x;
                    rounded[i * cols + j] = match (kind, half) {
                        (Kind::F16, _) | (Kind::F32, Half::F16) => f16::from_f32(x).to_f64(),
                        _ => bf16::from_f32(x).to_f64(),
                    };
                }
            }
            Operand {
                bf16s: f32s.iter().map(|&x| bf16::from_f32(x)).collect(),
                f16s: f32s.iter().map(|&x| f16::from_f32(x)).collect(),
                f32s,
                kind,
                rows,
                cols,
                rs,
                cs,
                rounded,
            }
        }

        fn operand(&self) -> HalfOperand<'_> {
            let (r, c, rs, cs) = (self.rows, self.cols, self.rs, self.cs);
            match self.kind {
                Kind::F32 => HalfOperand::F32(Mat::strided(&self.f32s, r, c, rs, cs)),
                Kind::Bf16 => HalfOperand::Bf16(Mat::strided(&self.bf16s, r, c, rs, cs)),
                Kind::F16 => HalfOperand::F16(Mat::strided(&self.f16s, r, c, rs, cs)),
            }
        }
    }

    /// One GEMM against the f64 reference of the rounded operands: each element within the
    /// worst-case error of an f32 sum of `k` products.
    #[allow(clippy::too_many_arguments)]
    fn check(
        path: HalfPath,
        half: Half,
        [m, k, n]: [usize; 3],
        layouts: [Layout; 2],
        kinds: [Kind; 2],
        accumulate: bool,
        seed: u64,
    ) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = Operand::new(&mut rng, m, k, layouts[0], kinds[0], half);
        let b = Operand::new(&mut rng, k, n, layouts[1], kinds[1], half);
        let start: Vec<f32> = (0..m * n).map(|_| rng.random_range(-4.0..4.0)).collect();
        let mut dst = start.clone();
        gemm_half_with(
            path,
            half,
            &mut dst,
            a.operand(),
            b.operand(),
            accumulate,
            "test",
        )
        .unwrap();
        let gamma = (k + 2) as f64 * f32::EPSILON as f64;
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut size) = (0.0, 0.0);
                for l in 0..k {
                    let p = a.rounded[i * k + l] * b.rounded[l * n + j];
                    exact += p;
                    size += p.abs();
                }
                if accumulate {
                    exact += start[i * n + j] as f64;
                    size += (start[i * n + j] as f64).abs();
                }
                let got = dst[i * n + j] as f64;
                assert!(
                    (got - exact).abs() <= gamma * size + 1e-30,
                    "{path:?} {half:?} [{m}, {k}, {n}] {layouts:?} {kinds:?} acc {accumulate}: \
                     ({i}, {j}) is {got}, expected {exact} (size {size})"
                );
            }
        }
    }

    /// The paths to test for `half` on this processor.
    fn paths(half: Half) -> Vec<HalfPath> {
        let all = [HalfPath::Amx, HalfPath::Native, HalfPath::Converting];
        for path in all.iter().filter(|p| !p.available(half)) {
            if half == Half::Bf16 {
                eprintln!("note: this processor has no {path:?} bf16 path; it is not tested");
            }
        }
        all.into_iter().filter(|p| p.available(half)).collect()
    }

    const SHAPES: [[usize; 3]; 17] = [
        [1, 1, 1],
        [1, 1, 2],
        [2, 3, 1],
        [1, 7, 40],
        [13, 7, 33],
        [14, 32, 32],
        [15, 33, 31],
        [16, 2, 17],
        [29, 65, 70],
        [28, 64, 64],
        [3, 513, 5],
        [50, 300, 97],
        [320, 20, 17],
        [650, 9, 40],
        [5, 31, 2100],
        [17, 257, 3],
        [42, 1, 96],
    ];

    /// Every shape of [`SHAPES`] in pairs of [`LAYOUTS`] and operand formats on `path`.
    fn every_shape_and_layout(path: HalfPath, half: Half) {
        let other = if half == Half::Bf16 {
            Kind::Bf16
        } else {
            Kind::F16
        };
        for (s, &shape) in SHAPES.iter().enumerate() {
            // Every pair of layouts on the small shapes, a cycle of them on the large.
            let small = shape.iter().product::<usize>() < 20_000;
            for (c, (la, lb)) in LAYOUTS
                .iter()
                .flat_map(|&la| LAYOUTS.iter().map(move |&lb| (la, lb)))
                .enumerate()
            {
                if !small && c % 6 != s % 6 {
                    continue;
                }
                let kinds = match (s + c) % 4 {
                    0 => [Kind::F32, Kind::F32],
                    1 => [Kind::F32, other],
                    2 => [other, Kind::F32],
                    _ => [other, other],
                };
                let accumulate = (s + c) % 3 == 0;
                let seed = (s * 100 + c) as u64;
                check(path, half, shape, [la, lb], kinds, accumulate, seed);
            }
        }
    }

    #[test]
    fn gemm_matches_the_reference_on_every_path_shape_and_layout() {
        for half in [Half::Bf16, Half::F16] {
            for path in paths(half) {
                every_shape_and_layout(path, half);
            }
        }
    }

    /// Switches this thread's AMX GEMMs to the model of the tiles where the processor has the
    /// AVX-512 their packing uses, and says so; else notes what is `untested` and is false.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn amx_model_runs(untested: &str) -> bool {
        let avx512 = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl");
        if !avx512 {
            eprintln!("note: no AVX-512 F/BW/VL on this processor; {untested}");
        }
        amx::model::ON.set(avx512);
        avx512
    }

    /// The AMX path's packing, padding and blocking, on every processor with AVX-512: its
    /// GEMMs with the tile instructions replaced by a scalar model of `tdpbf16ps` (the real
    /// tiles are tested above where the processor has them).
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn amx_blocking_on_a_model_of_the_tiles() {
        if !amx_model_runs("the AMX packing is not tested") {
            return;
        }
        every_shape_and_layout(HalfPath::Amx, Half::Bf16);
        start_read_in_place(HalfPath::Amx, Half::Bf16);
        causal_zeros_left_out(HalfPath::Amx);
        // More rows, columns and steps of k than one packed block holds, in every packing
        // branch (k contiguous, entries contiguous, neither), partial tiles at every edge.
        let (rm, tr, sc) = (Layout::RowMajor, Layout::Transposed, Layout::Scattered);
        let (f, bf) = (Kind::F32, Kind::Bf16);
        let cases = [
            ([2100, 70, 40], [tr, rm], [f, bf], true, 10),
            ([300, 1100, 40], [rm, tr], [f, f], true, 11),
            ([33, 600, 1090], [tr, rm], [bf, f], false, 12),
            ([20, 40, 4200], [sc, sc], [f, bf], true, 13),
        ];
        for (shape, layouts, kinds, accumulate, seed) in cases {
            check(
                HalfPath::Amx,
                Half::Bf16,
                shape,
                layouts,
                kinds,
                accumulate,
                seed,
            );
        }
        amx::model::ON.set(false);
    }

    /// Every blocking `gemm_peak --amx-blocking` compares computes the same GEMM (on the model
    /// of the tiles, where there is AVX-512), and a bad blocking is refused.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn amx_benchmark_blockings_agree_with_the_converting_path() {
        let [m, k, n] = [70, 1100, 90];
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 32.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 16.0)
            .collect();
        let run = |kind: &str| {
            let mut dst = vec![0f32; m * n];
            bench_gemm(kind, [m, k, n], [false, true], &a, &b, &mut dst).map(|()| dst)
        };
        for bad in [
            "bf16-amx:100,32,32",
            "bf16-amx:512,256",
            "bf16-amx:512,x,32",
        ] {
            let err = run(bad).unwrap_err().to_string();
            assert!(err.contains("give KC,MC,NC"), "{bad}: {err}");
        }
        if !amx_model_runs("the AMX blockings are not compared") {
            return;
        }
        let want = run("bf16-converting").unwrap();
        // Products of bf16 values are exact in f32; only the sums' order differs.
        let tol = (k + 2) as f32 * f32::EPSILON * 3.2 * 3.2 * k as f32;
        for blocking in ["1024,128,4096", "512,256,4096", "256,64,512", "64,32,32"] {
            let got = run(&format!("bf16-amx:{blocking}")).unwrap();
            let worst = got
                .iter()
                .zip(&want)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(worst <= tol, "{blocking}: off by {worst} (tolerance {tol})");
        }
        amx::model::ON.set(false);
    }

    #[test]
    fn gemm_on_the_gpt_shapes() {
        // A d-128 forward, backward-input and weight-gradient GEMM (more than one block of k
        // and of m), with f32 and bf16 operands.
        let (rm, tr) = (Layout::RowMajor, Layout::Transposed);
        let cases = [
            ([400, 128, 384], [rm, tr], [Kind::F32, Kind::F32], false, 1),
            ([400, 512, 128], [rm, rm], [Kind::Bf16, Kind::F32], true, 2),
            ([512, 400, 128], [tr, rm], [Kind::Bf16, Kind::Bf16], true, 3),
        ];
        for path in paths(Half::Bf16) {
            for (shape, layouts, kinds, accumulate, seed) in cases {
                check(path, Half::Bf16, shape, layouts, kinds, accumulate, seed);
            }
        }
    }

    /// A start read in place on `path`: partial tiles, k in one block, in two (the second
    /// block adds to what the first wrote) and empty, bit for bit what accumulating into a
    /// copy gives, and every element written.
    fn start_read_in_place(path: HalfPath, half: Half) {
        let shapes = [
            [13, 7, 33],
            [29, 65, 70],
            [650, 9, 40],
            [20, 2100, 40],
            [3, 0, 5],
        ];
        for (s, &[m, k, n]) in shapes.iter().enumerate() {
            let mut rng = ChaCha8Rng::seed_from_u64(s as u64);
            let a = Operand::new(&mut rng, m, k, Layout::Transposed, Kind::F32, half);
            let b = Operand::new(&mut rng, k, n, Layout::RowMajor, Kind::F32, half);
            let start: Vec<f32> = (0..m * n).map(|_| rng.random_range(-4.0..4.0)).collect();
            let mut want = start.clone();
            gemm_half_with(path, half, &mut want, a.operand(), b.operand(), true, "t").unwrap();
            let (a, b) = (a.operand(), b.operand());
            let got = raw_bits(path, half, a, b, Start::Other(&start), Skip::None);
            let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{path:?} {half:?} [{m}, {k}, {n}]");
        }
    }

    #[test]
    fn a_start_read_in_place_equals_accumulating_into_its_copy() {
        for half in [Half::Bf16, Half::F16] {
            for path in paths(half) {
                start_read_in_place(path, half);
            }
        }
        let mut dst = vec![MaybeUninit::new(0.0); 6];
        let (a, b) = (vec![1.0f32; 6], vec![1.0f32; 3]);
        let err = gemm_half_from(
            Half::Bf16,
            &mut dst,
            &[0.0; 5],
            HalfOperand::F32(Mat::new(&a, 6, 1)),
            HalfOperand::F32(Mat::new(&b, 1, 1)),
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("a start of 5 elements for a product of 6"),
            "{err}"
        );
    }

    /// The bits of `start + a·b` that `gemm_half_raw` writes on `path` leaving out what `skip`
    /// says, into an output of NaN (which stays where nothing was written).
    fn raw_bits(
        path: HalfPath,
        half: Half,
        a: HalfOperand<'_>,
        b: HalfOperand<'_>,
        start: Start<'_>,
        skip: Skip,
    ) -> Vec<u32> {
        let (m, n) = (a.dims().0, b.dims().1);
        let mut got = vec![MaybeUninit::new(f32::NAN); m * n];
        // SAFETY: got is a live slice of m · n elements (a start is as long).
        unsafe {
            let out = Dst {
                ptr: got.as_mut_ptr().cast(),
                len: m * n,
                ldc: n,
            };
            gemm_half_raw(path, half, out, a, b, start, skip, "t").unwrap();
        }
        // SAFETY: initialized to NaN, then by the GEMM.
        got.iter()
            .map(|v| unsafe { v.assume_init() }.to_bits())
            .collect()
    }

    /// [`raw_bits`] of `a·b` in bf16.
    fn skipping(path: HalfPath, a: &Operand, b: &Operand, skip: Skip) -> Vec<u32> {
        raw_bits(
            path,
            Half::Bf16,
            a.operand(),
            b.operand(),
            Start::Zero,
            skip,
        )
    }

    #[test]
    fn leaving_out_the_causal_zeros_changes_no_wanted_value() {
        for path in paths(Half::Bf16) {
            causal_zeros_left_out(path);
        }
    }

    /// Triangular A, and a causal output, against the full product on `path`, bit for bit:
    /// tiles cut at the diagonal, rows across the `vdpbf16ps` kernel's blocks (308 rows)
    /// and steps of k across them (1024 steps), odd sizes.
    fn causal_zeros_left_out(path: HalfPath) {
        type Zero = fn(usize, usize) -> bool;
        let triangles: [(Skip, Zero); 2] =
            [(Skip::ALower, |i, l| l > i), (Skip::AUpper, |i, l| l < i)];
        for (s, &(m, n)) in [(33, 17), (45, 37), (128, 64), (330, 33), (1100, 20)]
            .iter()
            .enumerate()
        {
            let mut rng = ChaCha8Rng::seed_from_u64(s as u64);
            let (rm, bf) = (Layout::RowMajor, Kind::Bf16);
            let mut a = Operand::new(&mut rng, m, m, rm, Kind::F32, Half::Bf16);
            let b = Operand::new(&mut rng, m, n, rm, bf, Half::Bf16);
            let full = a.f32s.clone();
            for (skip, zero) in triangles {
                for i in 0..m {
                    for l in 0..m {
                        a.f32s[i * m + l] = if zero(i, l) { 0.0 } else { full[i * m + l] };
                    }
                }
                let want = skipping(path, &a, &b, Skip::None);
                let got = skipping(path, &a, &b, skip);
                assert_eq!(got, want, "{path:?} {skip:?} [{m}, {m}, {n}]");
            }
            if m > 400 {
                continue;
            }
            // q kᵀ: the output's entries on and below the diagonal, and every one written.
            a.f32s = full;
            let kt = Operand::new(&mut rng, 40, m, Layout::Transposed, bf, Half::Bf16);
            let q = Operand::new(&mut rng, m, 40, rm, bf, Half::Bf16);
            let want = skipping(path, &q, &kt, Skip::None);
            let got = skipping(path, &q, &kt, Skip::AboveDiagonal);
            for i in 0..m {
                let row = i * m..i * m + m;
                assert_eq!(
                    got[row.start..=row.start + i],
                    want[row.start..=row.start + i],
                    "{path:?} row {i} of {m}"
                );
                assert!(
                    got[row].iter().all(|&x| !f32::from_bits(x).is_nan()),
                    "{path:?} row {i} of {m}"
                );
            }
        }
    }

    #[test]
    fn native_paths_cross_every_block_edge() {
        // More rows, columns and steps of k than one packed block of either native path holds
        // (rows: 308 on vdpbf16ps, 2048 on AMX; k in two blocks, none a whole number of
        // tiles), with partial tiles at every edge.
        let (rm, tr) = (Layout::RowMajor, Layout::Transposed);
        let (f, bf) = (Kind::F32, Kind::Bf16);
        let cases = [
            ([2100, 70, 40], [tr, rm], [f, bf], true, 10),
            ([650, 1100, 2100], [rm, tr], [f, f], true, 7),
            ([270, 1030, 70], [tr, rm], [bf, f], false, 8),
            ([20, 600, 4200], [rm, rm], [f, bf], true, 9),
        ];
        for path in paths(Half::Bf16) {
            if path == HalfPath::Converting {
                continue;
            }
            for (shape, layouts, kinds, accumulate, seed) in cases {
                check(path, Half::Bf16, shape, layouts, kinds, accumulate, seed);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn gemm_matches_the_reference_on_random_shapes(
            m in 1usize..40,
            k in 1usize..80,
            n in 1usize..70,
            la in 0usize..5,
            lb in 0usize..5,
            kinds in 0usize..4,
            f16_format in any::<bool>(),
            accumulate in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let half = if f16_format { Half::F16 } else { Half::Bf16 };
            let other = if f16_format { Kind::F16 } else { Kind::Bf16 };
            let kinds = [
                if kinds & 1 == 0 { Kind::F32 } else { other },
                if kinds & 2 == 0 { Kind::F32 } else { other },
            ];
            for path in paths(half) {
                check(path, half, [m, k, n], [LAYOUTS[la], LAYOUTS[lb]], kinds, accumulate, seed);
            }
        }
    }

    #[test]
    fn gemm_half_takes_the_best_path_and_empty_shapes() {
        let a = [1.5f32, -2.0, 0.25, 3.0];
        let mut dst = [7.0f32; 4];
        let op = HalfOperand::F32(Mat::new(&a, 2, 2));
        gemm_half(Half::Bf16, &mut dst, op, op, false, "test").unwrap();
        assert_eq!(dst, [1.75, -9.0, 1.125, 8.5]);
        gemm_half(Half::F16, &mut dst, op, op.t(), true, "test").unwrap();
        assert_eq!(
            dst,
            [1.75 + 6.25, -9.0 - 5.625, 1.125 - 5.625, 8.5 + 9.0625]
        );
        // k = 0: the product is zero.
        let empty: [f32; 0] = [];
        let e = HalfOperand::F32(Mat::new(&empty, 2, 0));
        gemm_half(Half::Bf16, &mut dst, e, e.t(), true, "test").unwrap();
        assert_eq!(dst[0], 8.0);
        gemm_half(Half::Bf16, &mut dst, e, e.t(), false, "test").unwrap();
        assert_eq!(dst, [0.0; 4]);
        // m = 0: nothing to write.
        let none = HalfOperand::F32(Mat::new(&empty, 0, 3));
        let b = HalfOperand::F32(Mat::new(&a[..3], 3, 1));
        gemm_half(Half::Bf16, &mut [], none, b, false, "test").unwrap();
    }

    #[test]
    fn wrong_formats_and_shapes_are_errors() {
        let x = [bf16::ONE; 4];
        let h = [f16::ONE; 4];
        let f = [1.0f32; 6];
        let mut dst = [0.0f32; 4];
        // The message of a GEMM into a 2 x 2 destination that must fail.
        let error = |path, half, a, b, what| {
            let mut dst = [0.0f32; 4];
            gemm_half_with(path, half, &mut dst, a, b, false, what)
                .unwrap_err()
                .to_string()
        };
        for path in [HalfPath::Amx, HalfPath::Native, HalfPath::Converting] {
            let (xb, hf) = (Mat::new(&x, 2, 2), Mat::new(&h, 2, 2));
            let (f22, f23) = (Mat::new(&f, 2, 2), Mat::new(&f, 2, 3));
            let err = error(
                path,
                Half::F16,
                HalfOperand::Bf16(xb),
                HalfOperand::F32(f22),
                "wrong format",
            );
            assert!(
                err.contains("wrong format") && err.contains("other format than f16"),
                "{err}"
            );
            let err = error(
                path,
                Half::Bf16,
                HalfOperand::F32(f22),
                HalfOperand::F16(hf),
                "wrong format",
            );
            assert!(err.contains("other format than bf16"), "{err}");
            // [2, 3] x [2, 2]: k differs.
            let err = error(
                path,
                Half::Bf16,
                HalfOperand::F32(f23),
                HalfOperand::Bf16(xb),
                "shapes",
            );
            assert!(
                err.contains("shapes: shapes do not fit: [2, 3] x [2, 2]"),
                "{err}"
            );
            // dst too small, operand outside its slice.
            let small = HalfOperand::F32(f23);
            let too_small = gemm_half_with(
                path,
                Half::Bf16,
                &mut dst[..3],
                small,
                small.t(),
                false,
                "t",
            );
            assert!(too_small.is_err());
            let outside = HalfOperand::F32(Mat::strided(&f, 2, 2, 5, 1));
            assert!(
                gemm_half_with(path, Half::Bf16, &mut dst, outside, outside, false, "t").is_err()
            );
        }
        // No native f16 GEMM.
        let f16s = HalfOperand::F16(Mat::new(&h, 2, 2));
        let err = error(HalfPath::Native, Half::F16, f16s, f16s, "native f16");
        assert!(err.contains("no AVX512_BF16 f16 GEMM"), "{err}");
        let err = error(HalfPath::Amx, Half::F16, f16s, f16s, "amx f16");
        assert!(err.contains("no AMX f16 GEMM"), "{err}");
    }

    /// f32 values that stress rounding: zeros, infinities, NaNs (quiet and signalling, with
    /// payloads), subnormals, the formats' extremes and overflow thresholds, every tie of a
    /// range of bf16 and f16 values with its neighbours, and random bit patterns.
    fn hard_values() -> Vec<f32> {
        let mut v: Vec<f32> = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xff80_0001),
            f32::from_bits(0x7fbf_ffff),
            f32::from_bits(0x7fc1_2345),
            f32::from_bits(0x7f80_8000),
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
            f32::from_bits(0x007f_ffff),
            f32::from_bits(0x0000_8000),
            f32::from_bits(0x0001_8000),
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            bf16::MAX.to_f32(),
            f16::MAX.to_f32(),
            65520.0,
            65519.996,
            f16::MIN_POSITIVE.to_f32(),
            f16::MIN_POSITIVE_SUBNORMAL.to_f32(),
            f16::MIN_POSITIVE_SUBNORMAL.to_f32() / 2.0,
            f16::MIN_POSITIVE_SUBNORMAL.to_f32() * 0.75,
        ];
        let around = |x: f32, v: &mut Vec<f32>| {
            if x.is_finite() {
                v.extend([
                    x,
                    f32::from_bits(x.to_bits() + 1),
                    f32::from_bits(x.to_bits() - 1),
                ]);
            }
        };
        // bf16 ties: the low 16 bits exactly 0x8000 on even and odd bf16 values.
        for hi in (0u32..0x8000).step_by(97).chain(0x7f70..0x7f80) {
            for sign in [0, 0x8000_0000] {
                around(f32::from_bits(sign | (hi << 16) | 0x8000), &mut v);
            }
        }
        // f16 ties: the midpoints between neighbouring f16 values (subnormal to the largest).
        for h in (0u16..0x7bff).step_by(13).chain(0x7bf0..0x7bff) {
            for sign in [0, 0x8000] {
                let lo = f16::from_bits(sign | h).to_f64();
                let hi = f16::from_bits(sign | (h + 1)).to_f64();
                around(((lo + hi) / 2.0) as f32, &mut v);
            }
        }
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        v.extend((0..20_000).map(|_| f32::from_bits(rng.random::<u32>())));
        v.extend((0..5_000).map(|_| f32::from_bits(rng.random::<u32>() & 0x807f_ffff)));
        v
    }

    fn slots<T: Copy, U>(src: &[T], f: fn(&[T], &mut [MaybeUninit<U>])) -> Vec<U> {
        let mut out = Uninit::new(src.len());
        f(src, out.slots());
        // SAFETY: the conversions write every slot.
        unsafe { out.assume_init() }
    }

    #[test]
    fn conversions_are_bit_identical_to_the_half_crate() {
        let v = hard_values();
        // Odd lengths exercise the vector loops' tails.
        for len in [v.len(), 1, 15, 17, 33] {
            let v = &v[..len];
            let bf: Vec<bf16> = slots(v, f32_to_bf16);
            let hf: Vec<f16> = slots(v, f32_to_f16);
            let rb: Vec<f32> = slots(v, round_bf16);
            let rh: Vec<f32> = slots(v, round_f16);
            for (i, &x) in v.iter().enumerate() {
                let (want_b, want_h) = (bf16::from_f32(x), f16::from_f32(x));
                assert_eq!(
                    bf[i].to_bits(),
                    want_b.to_bits(),
                    "bf16 of {x:e} ({:#x})",
                    x.to_bits()
                );
                assert_eq!(bf16_bits(x), want_b.to_bits());
                assert_eq!(
                    hf[i].to_bits(),
                    want_h.to_bits(),
                    "f16 of {x:e} ({:#x})",
                    x.to_bits()
                );
                assert_eq!(rb[i].to_bits(), want_b.to_f32().to_bits(), "{x:e}");
                assert_eq!(rh[i].to_bits(), want_h.to_f32().to_bits(), "{x:e}");
            }
            let wb: Vec<f32> = slots(&bf, bf16_to_f32);
            let wh: Vec<f32> = slots(&hf, f16_to_f32);
            for i in 0..len {
                assert_eq!(wb[i].to_bits(), bf[i].to_f32().to_bits());
                assert_eq!(wh[i].to_bits(), hf[i].to_f32().to_bits());
            }
        }
        // Every bf16 and f16 bit pattern widens exactly.
        let all_b: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        let all_h: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let wb: Vec<f32> = slots(&all_b, bf16_to_f32);
        let wh: Vec<f32> = slots(&all_h, f16_to_f32);
        for i in 0..=u16::MAX as usize {
            assert_eq!(wb[i].to_bits(), all_b[i].to_f32().to_bits());
            assert_eq!(wh[i].to_bits(), all_h[i].to_f32().to_bits());
        }
    }

    #[test]
    fn tensor_conversions_round_trip() {
        let v = hard_values();
        let x = Tensor::from_vec(v[..1000].to_vec(), (10, 100), &Device::Cpu).unwrap();
        for half in [Half::Bf16, Half::F16] {
            let h = to_half(&x, half).unwrap();
            assert_eq!(h.dtype(), half.dtype());
            assert_eq!(h.dims(), [10, 100]);
            let back = to_f32(&h).unwrap();
            assert_eq!(back.dtype(), DType::F32);
            let back = back.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (i, &x) in v[..1000].iter().enumerate() {
                let want = match half {
                    Half::Bf16 => bf16::from_f32(x).to_f32(),
                    Half::F16 => f16::from_f32(x).to_f32(),
                };
                assert_eq!(back[i].to_bits(), want.to_bits(), "{half:?} {x:e}");
            }
            // A strided view is read contiguously; an f32 tensor stays as it is.
            let t = to_half(&x.t().unwrap(), half).unwrap();
            assert_eq!(t.dims(), [100, 10]);
            assert_eq!(to_f32(&x).unwrap().id(), x.id());
        }
    }

    /// The fused GELU forward and the product with a widened tensor give, bit for bit, the
    /// values of the unfused passes (over several pieces, a partial one last; hard values
    /// and NaN included).
    #[test]
    fn fused_conversions_match_the_passes() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut v: Vec<f32> = (0..2 * PIECE + 123)
            .map(|_| rng.random_range(-6.0..6.0))
            .collect();
        v.extend(hard_values());
        let x = Tensor::from_vec(v.clone(), v.len(), &Device::Cpu).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_dtype(DType::F32)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        // The one-pass values: the fused GELU over the whole tensor, then the rounding.
        let (mut y0, mut d0) = (
            vec![MaybeUninit::new(0.0); v.len()],
            vec![MaybeUninit::new(0.0); v.len()],
        );
        super::super::math::gelu_forward_fused_wide(&v, &mut y0, &mut d0);
        // SAFETY: every element was initialized (to 0, then by the GELU).
        let (y0, d0): (Vec<f32>, Vec<f32>) = unsafe {
            (
                y0.iter().map(|v| v.assume_init()).collect(),
                d0.iter().map(|v| v.assume_init()).collect(),
            )
        };
        let y0 = Tensor::from_vec(y0, v.len(), &Device::Cpu).unwrap();
        let d0 = Tensor::from_vec(d0, v.len(), &Device::Cpu).unwrap();
        for half in [Half::Bf16, Half::F16] {
            let (y, d) = gelu_forward_half(&x, half).unwrap();
            let (y0, d0) = (to_half(&y0, half).unwrap(), to_half(&d0, half).unwrap());
            assert_eq!((y.dtype(), d.dtype()), (half.dtype(), half.dtype()));
            assert_eq!(bits(&y), bits(&y0), "{half:?} values");
            assert_eq!(bits(&d), bits(&d0), "{half:?} derivatives");
            let p = mul_rounded(&x, &d, "t").unwrap();
            let p0 = super::super::mul(&x, &to_f32(&d).unwrap(), "t").unwrap();
            assert_eq!(p.dtype(), half.dtype());
            assert_eq!(
                bits(&p),
                bits(&to_half(&p0, half).unwrap()),
                "{half:?} product"
            );
        }
        let err = mul_rounded(&x, &x, "t").unwrap_err().to_string();
        assert!(err.contains("not a half-precision type"), "{err}");
        let err = gelu_forward_half(&x.to_dtype(DType::F64).unwrap(), Half::Bf16)
            .unwrap_err()
            .to_string();
        assert!(err.contains("f32 activations"), "{err}");
    }

    /// The native paths' packing rounds as the `half` crate does (normal values only:
    /// `vdpbf16ps` and `tdpbf16ps` treat subnormal inputs as zero), through both packing
    /// layouts of `A`.
    #[test]
    fn native_packing_rounds_as_the_half_crate() {
        for path in paths(Half::Bf16) {
            if path != HalfPath::Converting {
                packing_rounds_as_the_half_crate(path);
            }
        }
    }

    fn packing_rounds_as_the_half_crate(path: HalfPath) {
        let v: Vec<f32> = hard_values()
            .into_iter()
            .filter(|x| x.is_normal() && x.abs() < 1e38 && x.abs() > 1e-37)
            .collect();
        let m = v.len();
        let one = [1.0f32, 0.0];
        // A as one column (entries contiguous) and as [m, 2] row-major (k contiguous).
        let mut dst = vec![0.0; m];
        gemm_half_with(
            path,
            Half::Bf16,
            &mut dst,
            HalfOperand::F32(Mat::new(&v, m, 1)),
            HalfOperand::F32(Mat::new(&one[..1], 1, 1)),
            false,
            "t",
        )
        .unwrap();
        for (x, d) in v.iter().zip(&dst) {
            assert_eq!(d.to_bits(), bf16::from_f32(*x).to_f32().to_bits(), "{x:e}");
        }
        let pairs: Vec<f32> = v.iter().flat_map(|&x| [x, 3.0]).collect();
        gemm_half_with(
            path,
            Half::Bf16,
            &mut dst,
            HalfOperand::F32(Mat::new(&pairs, m, 2)),
            HalfOperand::F32(Mat::new(&one, 2, 1)),
            false,
            "t",
        )
        .unwrap();
        for (x, d) in v.iter().zip(&dst) {
            assert_eq!(d.to_bits(), bf16::from_f32(*x).to_f32().to_bits(), "{x:e}");
        }
    }
}
