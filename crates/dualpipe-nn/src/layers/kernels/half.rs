//! Mixed-precision GEMMs: operands rounded to bf16 or f16, products accumulated in f32. The
//! conversions between f32 and the half formats are in `convert`, the benchmark hooks of
//! `examples/gemm_peak.rs` in `bench`.
//!
//! Three paths compute a GEMM ([`HalfPath`]):
//!
//! - **AMX** (bf16 on Linux on x86-64 processors with AMX-BF16, Sapphire Rapids and later
//!   Xeons; `amx`): a blocked GEMM around `tdpbf16ps` tiles, 16 384 FLOPs per instruction,
//!   with `A` packed once per GEMM and `B` in blocks that stay in L2. On a 2-core Intel Xeon
//!   with AMX (model 207) it runs the GPT's d-512 GEMMs at 595-1,128 GFLOP/s from run to run,
//!   4.3-5.5x the f32 GEMM in one run and 19-35% of the tiles' peak measured in the same run
//!   (packing from f32 included); the tile loop alone, on prepacked operands, reached 41-49%
//!   there, and that machine's tile rate is not steady (docs/performance.md). PyTorch's
//!   oneDNN on the same shapes there, in interleaved rounds (`scripts/gemm_onednn.py`):
//!   25.5% of the peak on f32 operands under autocast against our 27.2%, 35.5% on bf16
//!   operands against our 30.5%. Preferred over
//!   the next path where both exist (`vdpbf16ps` ran at half the f32 FMA rate on those
//!   cores).
//! - **Native** (bf16 on x86-64 processors with AVX512_BF16, such as Zen 4, Zen 5 or Sapphire
//!   Rapids; `native`): a blocked GEMM around `vdpbf16ps`, which multiplies pairs of bf16
//!   values and accumulates in f32 at twice the rate of f32 FMAs on AMD's cores. Packing the
//!   operands into the microkernel's panels rounds f32 values to bf16 on the way, so there is
//!   no separate conversion pass. On one Zen 5 core it runs the GPT's d-512 GEMMs at 86-94%
//!   of the measured `vdpbf16ps` peak (`examples/gemm_peak.rs`). `vdpbf16ps` treats subnormal
//!   bf16 inputs as zero and flushes subnormal results, so this path differs from the
//!   converting one below f32's smallest normal value as well as by the accumulation order.
//! - **Converting** (f16 everywhere, bf16 without AVX512_BF16): each operand is rounded to the
//!   half format and widened back to f32 in one vectorized pass into a reused buffer, then
//!   multiplied by the f32 GEMM. Products of two half values are exact in f32, so this path
//!   differs from a native one only by the accumulation's rounding; it is no faster than f32.
//!
//! There is no native f16 path: AVX512_FP16 accumulates in f16, not f32, and AMX has f16
//! tiles only from Granite Rapids on (AMX-FP16), which no machine here has.
//!
//! Every path rounds to nearest even, bit for bit as the `half` crate does (`convert`). Each
//! keeps its packing buffers in thread-locals (each pipeline rank is one thread), so a GEMM
//! allocates only when it is larger than the thread's largest so far.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use half::{bf16, f16};

use super::gemm::{gemm_raw, Mat};
use crate::error::NnError;
use crate::precision::Half;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
mod bench;
mod convert;
#[cfg(target_arch = "x86_64")]
mod native;
#[cfg(test)]
mod tests;

pub use bench::{bench_amx_peak, bench_gemm, bench_gemm_bf16};
use convert::{bf16_bits, bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, round_bf16, round_f16};
pub(crate) use convert::{gelu_forward_half, mul_rounded, to_f32, to_half};

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
