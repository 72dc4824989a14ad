//! The native bf16 GEMM on x86-64 with AVX512_BF16: `vdpbf16ps` multiplies pairs of bf16
//! values and adds both products to an f32 lane, so a `k`-step of two products per lane
//! replaces two f32 FMAs.
//!
//! The loops are the classic blocked GEMM. For each block of at most `KC` steps of `k` (even,
//! so that pairs never straddle two blocks) and `NC` columns, `B` is packed into panels of
//! [`NR`] columns: for each pair `p` of `k` rows, the `NR` 32-bit words `(B[2p, j],
//! B[2p+1, j])` (the even row in the low half), which are the two zmm operands of one
//! `vdpbf16ps` step. For each block of `MC` rows, `A` is packed into panels of [`MR`] rows:
//! for each pair `p`, the `MR` words `(A[i, 2p], A[i, 2p+1])`, each broadcast to all lanes by
//! the microkernel. Packing rounds f32 operands to bf16 (round to nearest even, by integer
//! arithmetic on the bits: the processor's `vcvtneps2bf16` flushes subnormals to zero, the
//! `half` crate does not) and pads short panels and an odd last `k` with zeros, so the
//! microkernel always computes a full `MR × NR` tile in `2·MR` zmm accumulators and only
//! its stores are masked at the edges. `k` is cut into equal blocks of at most `KC` = 1024
//! steps, so that the GPT's d-512 weight-gradient GEMMs (`k` = the micro-batch's 1024
//! tokens) make one pass over their output and its `k` = 1536-2048 GEMMs two, not two to
//! four, which matters when an output is several MiB: a `B` panel (at most `KC × NR` bf16,
//! 64 KiB) sits in L2 while the `A` panels of the block (`MC × KC` bf16, at most 616 KiB)
//! stream from the 1 MiB L2 of a Zen 4 or Zen 5 core. The microkernel reads under 7 bytes
//! per cycle from them (two zmm of `B` and `MR` broadcast words per 28 `vdpbf16ps`), so
//! neither needs L1. (On a Zen 5 core this
//! blocking's d-512 bf16 GPT step took 1-4% less time than `KC` 512 with 616 rows of `A`,
//! three rounds alternated; docs/performance.md.)
//! Operands whose entries (rows of `A`, columns of `B`) are far apart in memory are
//! prefetched by hand, as is each output tile before the microkernel's loop.
//!
//! `vdpbf16ps` treats subnormal bf16 inputs as zero and flushes subnormal results to zero
//! (MXCSR is not consulted), and adds its two products to the accumulator one after the
//! other, each rounded to f32: results can differ from the converting path's f32 GEMM by the
//! accumulation order's rounding and below f32's smallest normal value.

use std::arch::x86_64::*;
use std::cell::RefCell;

use half::bf16;

use super::super::gemm::Mat;
use super::Skip;

/// Rows of the microkernel's tile.
pub(super) const MR: usize = 14;
/// Columns of the microkernel's tile (two zmm of f32).
pub(super) const NR: usize = 32;
/// The most steps of `k` per packed block (even); `k` is cut into equal even blocks.
const KC: usize = 1024;
/// Rows of `A` per packed block (a multiple of [`MR`]).
const MC: usize = 22 * MR;
/// Columns of `B` per packed block (a multiple of [`NR`]).
const NC: usize = 64 * NR;

/// Whether this processor runs the native kernel.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512bf16")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
}

/// 64 bytes, the alignment of the packed panels (one zmm, one cache line).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u32; 16]);

/// A reusable packing buffer of 64-byte aligned words.
#[derive(Default)]
pub(super) struct Buf(Vec<Line>);

impl Buf {
    /// Room for at least `words` words (old contents kept, never shrunk).
    pub(super) fn words(&mut self, words: usize) -> *mut u32 {
        let lines = words.div_ceil(16);
        if self.0.len() < lines {
            self.0.resize(lines, Line([0; 16]));
        }
        self.0.as_mut_ptr().cast()
    }
}

thread_local! {
    /// The packed `A` block and `B` block of this thread's GEMMs.
    static BUFS: RefCell<(Buf, Buf)> = RefCell::new((Buf::default(), Buf::default()));
}

/// An operand element the packing reads: f32 (rounded to bf16) or bf16.
pub(super) trait Src: Copy {
    /// Up to 16 elements at `p`, `p + stride`, ... (`stride` 1: contiguous), as 32-bit lanes
    /// whose upper halves hold the bf16 bits; lanes from `count` on are zero.
    ///
    /// # Safety
    ///
    /// AVX-512 is available and the first `count` elements are readable.
    unsafe fn load16(p: *const Self, count: usize) -> __m512i;
    /// Up to 32 contiguous elements at `p` as bf16 bits in 16-bit lanes, in order; lanes from
    /// `count` on are zero.
    ///
    /// # Safety
    ///
    /// AVX-512 F and BW are available and the first `count` elements are readable.
    unsafe fn load32(p: *const Self, count: usize) -> __m512i;
    /// The element's bf16 bits.
    fn bits(self) -> u16;
}

/// The mask of the first `count` (at most 16) lanes.
#[inline(always)]
pub(super) fn mask16(count: usize) -> u16 {
    if count >= 16 {
        u16::MAX
    } else {
        (1u16 << count) - 1
    }
}

impl Src for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32, count: usize) -> __m512i {
        // SAFETY: masked-off lanes are not read; the caller vouches for the others.
        unsafe { round_upper(_mm512_castps_si512(_mm512_maskz_loadu_ps(mask16(count), p))) }
    }

    #[inline(always)]
    unsafe fn load32(p: *const f32, count: usize) -> __m512i {
        // SAFETY: as load16's, on the two halves.
        unsafe {
            let lo = Self::load16(p, count.min(16));
            let hi = if count > 16 {
                Self::load16(p.add(16), count - 16)
            } else {
                _mm512_setzero_si512()
            };
            // Each 32-bit lane's upper half is a bf16: narrowed to 16 bits.
            let a = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(lo));
            let b = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(hi));
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
        }
    }

    fn bits(self) -> u16 {
        bf16::from_f32(self).to_bits()
    }
}

impl Src for bf16 {
    #[inline(always)]
    unsafe fn load16(p: *const bf16, count: usize) -> __m512i {
        // SAFETY: as above.
        unsafe {
            let h = _mm256_maskz_loadu_epi16(mask16(count), p.cast());
            _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h))
        }
    }

    #[inline(always)]
    unsafe fn load32(p: *const bf16, count: usize) -> __m512i {
        let mask = if count >= 32 {
            u32::MAX
        } else {
            (1u32 << count) - 1
        };
        // SAFETY: masked-off lanes are not read; the caller vouches for the others.
        unsafe { _mm512_maskz_loadu_epi16(mask, p.cast()) }
    }

    fn bits(self) -> u16 {
        self.to_bits()
    }
}

/// f32 bits rounded to bf16 in the upper 16 bits of each lane (the lower bits are left over):
/// round to nearest even, NaN quieted with its upper payload kept, as `half::bf16::from_f32`.
#[inline(always)]
unsafe fn round_upper(x: __m512i) -> __m512i {
    // SAFETY: AVX-512 is available (the callers' target features).
    unsafe {
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
        let rounded = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb);
        let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7fff_ffff));
        let nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f80_0000));
        let quiet = _mm512_or_si512(x, _mm512_set1_epi32(0x0040_0000));
        _mm512_mask_blend_epi32(nan, rounded, quiet)
    }
}

/// The pair words `(lo, hi)` of two `load16` results: `lo`'s bf16 in the low half.
#[inline(always)]
unsafe fn pair(lo: __m512i, hi: __m512i) -> __m512i {
    // SAFETY: AVX-512 BW is available.
    unsafe { _mm512_mask_blend_epi16(0xAAAA_AAAA, _mm512_srli_epi32::<16>(lo), hi) }
}

/// Transposes the 16 × 16 matrix of 32-bit words whose row `i` is `r[i]`.
#[inline(always)]
pub(super) unsafe fn transpose16(r: &mut [__m512i; 16]) {
    // SAFETY: AVX-512 F is available (the callers' target features).
    unsafe {
        // Within each 128-bit block q: rows 4g..4g+4 of columns 4q..4q+4, 4 × 4 transposed:
        // c[4g + s] holds, in block q, rows 4g..4g+4 of column 4q + s.
        let mut c = [_mm512_setzero_si512(); 16];
        for g in 0..4 {
            let [r0, r1, r2, r3] = [r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]];
            let (lo01, hi01) = (_mm512_unpacklo_epi32(r0, r1), _mm512_unpackhi_epi32(r0, r1));
            let (lo23, hi23) = (_mm512_unpacklo_epi32(r2, r3), _mm512_unpackhi_epi32(r2, r3));
            c[4 * g] = _mm512_unpacklo_epi64(lo01, lo23);
            c[4 * g + 1] = _mm512_unpackhi_epi64(lo01, lo23);
            c[4 * g + 2] = _mm512_unpacklo_epi64(hi01, hi23);
            c[4 * g + 3] = _mm512_unpackhi_epi64(hi01, hi23);
        }
        // Column 4q + s gathers block q of c[4g + s] into its block g.
        for s in 0..4 {
            let [c0, c1, c2, c3] = [c[s], c[4 + s], c[8 + s], c[12 + s]];
            let u0 = _mm512_shuffle_i32x4::<0x44>(c0, c1);
            let u1 = _mm512_shuffle_i32x4::<0xEE>(c0, c1);
            let u2 = _mm512_shuffle_i32x4::<0x44>(c2, c3);
            let u3 = _mm512_shuffle_i32x4::<0xEE>(c2, c3);
            r[s] = _mm512_shuffle_i32x4::<0x88>(u0, u2);
            r[4 + s] = _mm512_shuffle_i32x4::<0xDD>(u0, u2);
            r[8 + s] = _mm512_shuffle_i32x4::<0x88>(u1, u3);
            r[12 + s] = _mm512_shuffle_i32x4::<0xDD>(u1, u3);
        }
    }
}

/// Packs `width` panel entries (rows of `A` or columns of `B`), the first `valid` of them
/// real, over `kc` steps of `k`: entry `e` at step `l` is at `src + e·es + l·ks`. Writes the
/// `⌈kc/2⌉ · width` pair words to `dst` (entry-fastest), zeros for padding.
///
/// # Safety
///
/// The AVX-512 features are available, every real element is readable and `dst` has room.
#[inline(always)]
pub(super) unsafe fn pack<T: Src>(
    src: *const T,
    es: usize,
    ks: usize,
    width: usize,
    valid: usize,
    kc: usize,
    dst: *mut u32,
) {
    let kp = kc.div_ceil(2);
    // SAFETY: every read is of a real element (l < kc, e < valid) and every write inside
    // dst's kp·width words.
    unsafe {
        if es == 1 {
            // Entries contiguous: two k-rows of 16 entries make 16 pair words.
            for p in 0..kp {
                let (l0, l1) = (2 * p, 2 * p + 1);
                for e0 in (0..width).step_by(16) {
                    let count = valid.saturating_sub(e0).min(16);
                    // Rows of k are an operand's row apart: fetch 8 pairs ahead.
                    for l in [l0 + 16, l1 + 16] {
                        let ahead = src.wrapping_add(l * ks + e0).cast::<i8>();
                        _mm_prefetch::<_MM_HINT_T0>(ahead);
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(63));
                    }
                    let lo = T::load16(src.add(l0 * ks + e0), count);
                    let hi = if l1 < kc {
                        T::load16(src.add(l1 * ks + e0), count)
                    } else {
                        _mm512_setzero_si512()
                    };
                    let words = pair(lo, hi);
                    let out = dst.add(p * width + e0);
                    if width - e0 >= 16 {
                        _mm512_storeu_si512(out.cast(), words);
                    } else {
                        _mm512_mask_storeu_epi32(out.cast(), mask16(width - e0), words);
                    }
                }
            }
        } else if ks == 1 {
            // k contiguous: 32 steps of one entry make 16 pair words; 16 entries' words are
            // transposed in registers into 16 pairs' rows of entries.
            for e0 in (0..width).step_by(16) {
                let entries = valid.saturating_sub(e0).min(16);
                let lanes = mask16(width - e0);
                for l0 in (0..kc).step_by(32) {
                    let mut rows = [_mm512_setzero_si512(); 16];
                    for (e, r) in rows.iter_mut().enumerate().take(entries) {
                        let row = src.add((e0 + e) * es + l0);
                        // The entries' rows are far apart (a whole row of the operand): the
                        // hardware prefetchers miss them, so fetch two chunks ahead.
                        let ahead = row.wrapping_add(64).cast::<i8>();
                        _mm_prefetch::<_MM_HINT_T0>(ahead);
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
                        // 32 steps of k as bf16, two (k even, k odd) per 32-bit word.
                        *r = T::load32(row, (kc - l0).min(32));
                    }
                    transpose16(&mut rows);
                    let p0 = l0 / 2;
                    for (q, r) in rows.iter().enumerate().take(kp - p0) {
                        let out = dst.add((p0 + q) * width + e0);
                        _mm512_mask_storeu_epi32(out.cast(), lanes, *r);
                    }
                }
            }
        } else {
            for p in 0..kp {
                for e in 0..width {
                    let word = if e < valid {
                        let lo = (*src.add(e * es + 2 * p * ks)).bits() as u32;
                        let hi = if 2 * p + 1 < kc {
                            (*src.add(e * es + (2 * p + 1) * ks)).bits() as u32
                        } else {
                            0
                        };
                        lo | hi << 16
                    } else {
                        0
                    };
                    *dst.add(p * width + e) = word;
                }
            }
        }
    }
}

/// The `MR × NR` tile over `kp` pairs: `c[i·ldc + j] = from[i·ldc + j] + Σ_p a·b` for
/// `i < rows`, `j < cols` (`from` may be `c` itself), or `Σ_p a·b` when there is no `from`.
///
/// # Safety
///
/// The AVX-512 BF16 features are available; `a` holds `kp·MR` words, `b` `kp·NR` words
/// (64-byte aligned); the `rows × cols` tile of `c` may be written, that of `from` read.
#[target_feature(enable = "avx512bf16,avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel(
    kp: usize,
    a: *const u32,
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    from: Option<*const f32>,
) {
    let mut lo = [_mm512_setzero_ps(); MR];
    let mut hi = [_mm512_setzero_ps(); MR];
    // SAFETY: the reads stay inside the panels (kp pairs), the writes inside the tile.
    unsafe {
        // The tile of c is written (and that of from read) after the loop: fetch them while
        // computing (once when from is c itself).
        let other = from.filter(|&f| f != c.cast_const());
        for i in 0..MR {
            if i < rows {
                for tile in [Some(c.cast_const()), other].into_iter().flatten() {
                    let row = tile.add(i * ldc).cast::<i8>();
                    _mm_prefetch::<_MM_HINT_T0>(row);
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(64));
                }
            }
        }
        let (mut a, mut b) = (a, b);
        for _ in 0..kp {
            let b0: __m512bh = std::mem::transmute(_mm512_load_si512(b.cast()));
            let b1: __m512bh = std::mem::transmute(_mm512_load_si512(b.add(16).cast()));
            for i in 0..MR {
                let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i) as i32));
                lo[i] = _mm512_dpbf16_ps(lo[i], ai, b0);
                hi[i] = _mm512_dpbf16_ps(hi[i], ai, b1);
            }
            a = a.add(MR);
            b = b.add(NR);
        }
        let m0 = mask16(cols);
        let m1 = mask16(cols.saturating_sub(16));
        for i in 0..MR {
            if i < rows {
                let row = c.add(i * ldc);
                let (mut v0, mut v1) = (lo[i], hi[i]);
                if let Some(from) = from {
                    let start = from.add(i * ldc);
                    v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, start));
                    v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, start.add(16)));
                }
                _mm512_mask_storeu_ps(row, m0, v0);
                _mm512_mask_storeu_ps(row.add(16), m1, v1);
            }
        }
    }
}

/// Packs an operand block with the AVX-512 features enabled.
///
/// # Safety
///
/// As [`pack`].
#[target_feature(enable = "avx512bf16,avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_panels<T: Src>(
    src: *const T,
    es: usize,
    ks: usize,
    width: usize,
    entries: usize,
    kc: usize,
    dst: *mut u32,
) {
    let kp = kc.div_ceil(2);
    // SAFETY: panel q covers entries q·width.. of the block, its words q·kp·width.. of dst.
    unsafe {
        for (q, e0) in (0..entries).step_by(width).enumerate() {
            pack(
                src.add(e0 * es),
                es,
                ks,
                width,
                entries - e0,
                kc,
                dst.add(q * kp * width),
            );
        }
    }
}

/// `c[i·ldc + j] = from[i·ldc + j] + (a·b)[i, j]` for `i < a.rows`, `j < b.cols` (`from`
/// may be `c` itself: accumulation), or `(a·b)[i, j]` when there is no `from`; each tile
/// runs over the pairs of `k` steps that `skip` says it needs (no pairs: the start alone).
///
/// # Safety
///
/// [`available`] is true; `a` and `b` have fitting shapes (`a.cols == b.rows`, none zero)
/// and every element of them lies inside its slice; the `a.rows × b.cols` rows of `c` may be
/// written, those of `from` (rows `ldc` apart too) read, and neither aliases an operand;
/// `from` is `c` or does not overlap it.
pub(super) unsafe fn gemm<A: Src, B: Src>(
    c: *mut f32,
    ldc: usize,
    a: Mat<'_, A>,
    b: Mat<'_, B>,
    from: Option<*const f32>,
    skip: Skip,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    BUFS.with(|bufs| {
        let mut bufs = bufs.borrow_mut();
        let (abuf, bbuf) = &mut *bufs;
        // k in equal even blocks of at most KC (k = 2048 as 1024 + 1024, k = 1100 as
        // 550 + 550, not 1024 + 76).
        let kc_step = k.div_ceil(k.div_ceil(KC)).next_multiple_of(2);
        let kp_max = kc_step.min(k).div_ceil(2);
        let apack = abuf.words(kp_max * MC.min(m.next_multiple_of(MR)));
        let bpack = bbuf.words(kp_max * NC.min(n.next_multiple_of(NR)));
        // SAFETY: the packs read elements (i, l) of a and (l, j) of b with i < m, l < k,
        // j < n, which the caller guarantees are in their slices; the kernels write the
        // tiles of c inside its m × n rows; the buffers hold the blocks' panels.
        unsafe {
            for jc in (0..n).step_by(NC) {
                let nc = NC.min(n - jc);
                for pc in (0..k).step_by(kc_step) {
                    let kc = kc_step.min(k - pc);
                    let kp = kc.div_ceil(2);
                    pack_panels(
                        b.data.as_ptr().add(pc * b.rs + jc * b.cs),
                        b.cs,
                        b.rs,
                        NR,
                        nc,
                        kc,
                        bpack,
                    );
                    // Later blocks of k add to what the first ones wrote.
                    let from = if pc == 0 { from } else { Some(c.cast_const()) };
                    for ic in (0..m).step_by(MC) {
                        let mc = MC.min(m - ic);
                        pack_panels(
                            a.data.as_ptr().add(ic * a.rs + pc * a.cs),
                            a.rs,
                            a.cs,
                            MR,
                            mc,
                            kc,
                            apack,
                        );
                        for (jq, jr) in (0..nc).step_by(NR).enumerate() {
                            let bp = bpack.add(jq * kp * NR);
                            for (iq, ir) in (0..mc).step_by(MR).enumerate() {
                                let tile = (ic + ir) * ldc + jc + jr;
                                let rows = (mc - ir).min(MR);
                                let (lo, hi) = skip.pairs(ic + ir, rows, jc + jr, pc, kp);
                                kernel(
                                    hi - lo,
                                    apack.add((iq * kp + lo) * MR),
                                    bp.add(lo * NR),
                                    c.add(tile),
                                    ldc,
                                    mc - ir,
                                    nc - jr,
                                    from.map(|f| f.add(tile)),
                                );
                            }
                        }
                    }
                }
            }
        }
    });
}
