//! Conversions between f32 and the half formats: slices rounded to nearest even and widened
//! exactly, vectorized, and the tensor conversions built on them, two of them fused with the
//! elementwise work beside them (GELU's forward, a product rounded) so that no f32 tensor is
//! made in between.

use std::mem::MaybeUninit;

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};

use super::super::{keep_freed_memory, read, Uninit};
use super::HalfElem;
use crate::error::{NnError, TensorContext};
use crate::precision::Half;

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
pub(super) const PIECE: usize = 4096;

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
            super::super::math::gelu_forward_fused_wide(xs, yt, dt);
            // SAFETY: gelu_forward_fused_wide wrote every slot of yt and dt.
            let (yt, dt) = unsafe {
                (
                    super::super::assume_init_mut(yt),
                    super::super::assume_init_mut(dt),
                )
            };
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
            product_into(av, unsafe { super::super::assume_init_mut(w) }, p);
            // SAFETY: product_into wrote every slot of p.
            H::round(unsafe { super::super::assume_init_mut(p) }, ov);
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
pub(super) fn bf16_bits(x: f32) -> u16 {
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
    pub(super) fn f32_to_bf16(src: &[f32], dst: &mut [MaybeUninit<bf16>]) => f32_to_bf16_inner
}

wide_kernel! {
    /// `dst[i] = f32(bf16(src[i]))`: f32 values rounded to bf16, vectorized.
    pub(super) fn round_bf16(src: &[f32], dst: &mut [MaybeUninit<f32>]) => round_bf16_inner
}

wide_kernel! {
    /// `dst[i] = f32(src[i])` (exact; NaN quieted), vectorized.
    pub(super) fn bf16_to_f32(src: &[bf16], dst: &mut [MaybeUninit<f32>]) => bf16_to_f32_inner
}

/// Whether the AVX-512 f16 conversions (`vcvtps2ph`, `vcvtph2ps` on zmm) can run.
#[cfg(target_arch = "x86_64")]
fn avx512_f16() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// `dst[i] = f16(src[i])` (round to nearest even).
pub(super) fn f32_to_f16(src: &[f32], dst: &mut [MaybeUninit<f16>]) {
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
pub(super) fn round_f16(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
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
pub(super) fn f16_to_f32(src: &[f16], dst: &mut [MaybeUninit<f32>]) {
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

    use super::super::native::mask16;

    /// `f16(v)` of 16 lanes, rounded to nearest even.
    #[inline(always)]
    unsafe fn narrow(v: __m512) -> __m256i {
        // SAFETY: the caller's function enables AVX-512 F.
        unsafe { _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v) }
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
                let h = narrow(_mm512_maskz_loadu_ps(m, src.as_ptr().add(i)));
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
                let v = _mm512_cvtph_ps(narrow(_mm512_maskz_loadu_ps(m, src.as_ptr().add(i))));
                _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i).cast(), m, v);
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
                let v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src.as_ptr().add(i).cast()));
                _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i).cast(), m, v);
            }
        }
    }
}
