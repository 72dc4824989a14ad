//! The bf16 GEMM on x86-64 processors with AMX (Sapphire Rapids and later Xeons): `tdpbf16ps`
//! multiplies a 16 × 32 tile of bf16 by a 32 × 16 one and adds the 16 × 16 products into an
//! f32 tile, 16 384 FLOPs in one instruction.
//!
//! The blocking, its sizes in [`BLOCKING`]: for each block of at most `kc` steps of `k`, a
//! block of at most `mc` rows of `A` is packed, then for each block of at most `nc` columns
//! `B` is packed, and each 32-row panel of `A` runs across the whole `B` block (which stays
//! in L2). `B` is packed into panels of [`TN`] = 32 columns in the pair layout that
//! `vdpbf16ps` reads, which is also AMX's "VNNI" layout of a `B` tile (row `p` of a tile: the
//! words `(B[2p, j], B[2p+1, j])` of its 16 columns), so a panel is two column tiles read
//! with a 128-byte row stride. `A` is packed into panels of
//! [`TM`] = 32 rows stored tile by tile in the order the microkernel reads them (for each 32
//! steps of `k`, the 1 KiB tile of rows 0-15, then that of rows 16-31): rounded row by row
//! where `A`'s rows run along `k` in memory (the forward's and the input gradient's), else the
//! pair layout of 16 rows at a time transposed in registers. Both are padded with zeros to
//! whole tiles of 32 steps of `k`.
//! The microkernel keeps a 32 × 32 output block in four accumulator tiles over the whole
//! block of `k` (two `A` and two `B` tile loads per four `tdpbf16ps`); the accumulators start
//! as zeros and are stored into `C` in place, or, where a start is added or the block is cut
//! by `C`'s edge, into a scratch block that masked vector loads and stores add to the start
//! and write into `C`. Where a block of `k` is short and the output wide, a block's lines of
//! `C` are asked for before its products ([`prefetch_block`]).
//!
//! The tile instructions are written as inline assembly: Rust's AMX intrinsics and its
//! detection of the AMX features are not stable yet. The processor reports AMX through
//! `cpuid`; Linux hands the 8 KiB tile state to a process only after it asks
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), which [`available`] does once,
//! for every thread of the process. Like `vdpbf16ps`, `tdpbf16ps` treats subnormal bf16
//! inputs as zero, flushes subnormal results, and rounds each partial sum to f32 in its own
//! order, so results differ from the converting path by the accumulation's rounding and
//! below f32's smallest normal value.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use super::super::gemm::Mat;
use super::native::{mask16, pack, transpose16, Buf, Src};
use super::Skip;

/// Rows of the microkernel's output block (two `A` tiles of 16 rows).
const TM: usize = 32;
/// Columns of the microkernel's output block (two `B` tiles of 16 columns).
const TN: usize = 32;
/// Pairs of `k` steps in one tile (32 bf16 of an `A` row).
const TILE_PAIRS: usize = 16;
/// How [`gemm`] blocks its operands: at most `kc` steps of `k` (a multiple of 32), `mc` rows
/// of `A` (a multiple of [`TM`]) and `nc` columns of `B` (a multiple of [`TN`]) per packed
/// block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Blocking {
    /// Steps of `k` per block.
    pub(super) kc: usize,
    /// Rows of `A` per block.
    pub(super) mc: usize,
    /// Columns of `B` per block.
    pub(super) nc: usize,
}

impl Blocking {
    /// Whether the sizes are positive multiples of the tiles'.
    pub(super) fn valid(&self) -> bool {
        self.kc > 0
            && self.kc.is_multiple_of(2 * TILE_PAIRS)
            && self.mc > 0
            && self.mc.is_multiple_of(TM)
            && self.nc > 0
            && self.nc.is_multiple_of(TN)
    }
}

/// The blocking [`gemm`] uses, chosen with `gemm_peak --amx-blocking` on a 2-core Intel Xeon
/// with AMX (the tiles' rates interleaved in rounds, best of each): `k` up to 1024 in one
/// block, so that the output is read and written once; up to 2048 rows of `A` per block, so
/// that `A` and `B` are each packed once in every GEMM of the GPT; and 512 columns of `B`
/// (1 MiB of bf16 at `kc` 1024) per block, so that the packed `B` stays in the core's 2 MiB
/// L2 while every 32-row panel of `A` runs across it. On the d-512 GEMMs (operands rounded
/// from f32 as they are packed; `gemm_peak`, best of three runs of each build, alternated)
/// 595-870 GFLOP/s against 544-779 for the blocking before it (`kc` 1024, `mc` 128, `nc`
/// 4096, which packed `B` in blocks of up to 4 MiB), +18-31% on the four with `n` 1536 and
/// 2048.
pub(super) const BLOCKING: Blocking = Blocking {
    kc: 1024,
    mc: 64 * TM,
    nc: 16 * TN,
};

/// `arch_prctl` request for permission to use an extended state component.
const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
/// The extended state component of AMX's tile data.
const XFEATURE_XTILEDATA: libc::c_long = 18;

/// Whether this processor has AMX-BF16 (and the AVX-512 the packing uses) and the kernel let
/// this process use the tiles (asked once per process).
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        if __cpuid(0).eax < 7 {
            return false;
        }
        let leaf7 = __cpuid_count(7, 0);
        let amx_bf16 = leaf7.edx >> 22 & 1 == 1;
        let amx_tile = leaf7.edx >> 24 & 1 == 1;
        amx_bf16
            && amx_tile
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            // SAFETY: a plain system call with integer arguments; it changes no memory of ours.
            && unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) } == 0
    })
}

/// The tile configuration `ldtilecfg` reads (palette 1): tiles 0-7 of 16 rows of 64 bytes
/// (accumulators 0-3: 16 × 16 f32; `A` tiles 4-5: 16 rows × 32 bf16; `B` tiles 6-7: 16
/// pair rows × 16 columns).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    fn new() -> TileConfig {
        let mut colsb = [0; 16];
        let mut rows = [0; 16];
        colsb[..8].fill(64);
        rows[..8].fill(16);
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb,
            rows,
        }
    }
}

/// A 32 × 32 f32 output block, where the tiles are stored before they are added into `C`.
#[repr(C, align(64))]
struct Block([[f32; TN]; TM]);

thread_local! {
    /// The packed `A` block, the packed `B` block and the pair-layout scratch of `A`'s
    /// packing, of this thread's GEMMs.
    static BUFS: RefCell<(Buf, Buf, Buf)> = RefCell::new((Buf::default(), Buf::default(), Buf::default()));
}

/// Packs `entries` columns of `B` (`src`: element `(l, j)` at `src + j·es + l·ks`) over `kc`
/// steps of `k` into panels of [`TN`] columns of `kp_pad` pair rows each (zero past `kc`).
///
/// # Safety
///
/// AVX-512 F/BW/VL are available, every real element is readable and `dst` holds
/// `⌈entries/TN⌉ · kp_pad · TN` words.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pack_b<T: Src>(
    src: *const T,
    es: usize,
    ks: usize,
    entries: usize,
    kc: usize,
    kp_pad: usize,
    dst: *mut u32,
) {
    let kp = kc.div_ceil(2);
    // SAFETY: panel q's words are q·kp_pad·TN.. of dst; pack reads real elements only.
    unsafe {
        for (q, e0) in (0..entries).step_by(TN).enumerate() {
            let panel = dst.add(q * kp_pad * TN);
            pack(src.add(e0 * es), es, ks, TN, entries - e0, kc, panel);
            std::ptr::write_bytes(panel.add(kp * TN), 0, (kp_pad - kp) * TN);
        }
    }
}

/// The word of row `r` (< [`TM`]) and pair `p` of `k` in a packed `A` panel. A panel is its
/// tiles of `k` in order, each two 1 KiB `A` tiles (rows 0-15, then rows 16-31) of 16 rows of
/// 16 pairs, so that the microkernel reads it front to back.
#[inline(always)]
fn a_word(r: usize, p: usize) -> usize {
    ((p / TILE_PAIRS) * 2 + r / 16) * 16 * TILE_PAIRS + (r % 16) * TILE_PAIRS + p % TILE_PAIRS
}

/// Packs `entries` rows of `A` (`src`: element `(i, l)` at `src + i·es + l·ks`) over `kc`
/// steps of `k` into panels of [`TM`] rows and `kp_pad` pairs laid out as [`a_word`] says
/// (zero past `kc` and for rows past `entries`), using `tmp` (`kp_pad · 16` words) for the
/// pair layout of 16 rows before it is transposed.
///
/// # Safety
///
/// As [`pack_b`], `dst` holding `⌈entries/TM⌉ · TM · kp_pad` words.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_a<T: Src>(
    src: *const T,
    es: usize,
    ks: usize,
    entries: usize,
    kc: usize,
    kp_pad: usize,
    tmp: *mut u32,
    dst: *mut u32,
) {
    let kp = kc.div_ceil(2);
    if ks == 1 {
        // SAFETY: as the caller vouches; see `pack_rows`.
        unsafe { pack_rows(src, es, entries, kc, kp_pad, dst) };
        return;
    }
    // SAFETY: each group of 16 rows is packed into tmp's kp·16 words, then transposed into
    // its tiles (inside its panel, inside dst); reads of tmp stay below kp·16 words.
    unsafe {
        for r0 in (0..entries.next_multiple_of(TM)).step_by(16) {
            let valid = (entries - r0.min(entries)).min(16);
            if valid > 0 {
                pack(src.add(r0 * es), es, ks, 16, valid, kc, tmp);
            }
            let panel = dst.add(r0 / TM * TM * kp_pad);
            for p0 in (0..kp_pad).step_by(TILE_PAIRS) {
                let mut r = [_mm512_setzero_si512(); 16];
                if valid > 0 {
                    for (q, w) in r.iter_mut().enumerate().take(kp.saturating_sub(p0)) {
                        *w = _mm512_loadu_si512(tmp.add((p0 + q) * 16).cast());
                    }
                    transpose16(&mut r);
                }
                // Rows r0..r0 + 16 of this tile of k: one A tile, 16 rows of 16 pairs.
                let tile = panel.add(a_word(r0 % TM, p0));
                for (e, w) in r.iter().enumerate() {
                    _mm512_storeu_si512(tile.add(e * TILE_PAIRS).cast(), *w);
                }
            }
        }
    }
}

/// [`pack_a`] for rows whose `k` steps are contiguous (`ks` 1): each row is its values rounded
/// to bf16, 32 at a time (a bf16 row copied), with no transposition.
///
/// # Safety
///
/// As [`pack_a`].
#[inline(always)]
unsafe fn pack_rows<T: Src>(
    src: *const T,
    es: usize,
    entries: usize,
    kc: usize,
    kp_pad: usize,
    dst: *mut u32,
) {
    // SAFETY: the loads read the first kc elements of real rows; the stores write row r's
    // kp_pad words in its panel (32 steps of k, one tile row of 16 words, at a time: kp_pad·2
    // is kc rounded up to 32).
    unsafe {
        for r in 0..entries.next_multiple_of(TM) {
            let panel = dst.add(r / TM * TM * kp_pad);
            let row = r % TM;
            if r >= entries {
                for p0 in (0..kp_pad).step_by(TILE_PAIRS) {
                    std::ptr::write_bytes(panel.add(a_word(row, p0)), 0, TILE_PAIRS);
                }
                continue;
            }
            let from = src.add(r * es);
            for l0 in (0..kc).step_by(32) {
                // One tile row: 32 steps of k as bf16, in order (one load from a bf16 row).
                let v = T::load32(from.add(l0), (kc - l0).min(32));
                _mm512_storeu_si512(panel.add(a_word(row, l0 / 2)).cast(), v);
            }
        }
    }
}

/// `c = A·B` for one 32 × 32 block over `tiles` (at least one) tiles of `k`: `a` is a packed
/// `A` panel ([`a_word`]), `b` a packed `B` panel (pair rows of 32 words), `c` the block's
/// first element with `c_bytes` bytes between its rows. The accumulator tiles start as zeros:
/// a start is added afterwards ([`store_block`]), as on the `vdpbf16ps` path, so that
/// `start + A·B` rounds the same whether the start is read in place or added later.
///
/// # Safety
///
/// The tiles are configured as [`TileConfig::new`]; the panels hold `tiles` tiles of `k`;
/// the 32 × 32 block at `c` may be written.
#[inline(always)]
unsafe fn tile_block(tiles: usize, a: *const u32, b: *const u32, c: *mut f32, c_bytes: usize) {
    let c = c.cast::<u8>();
    // SAFETY: the loads read tiles · (2 × 1 KiB) of a and tiles · (16 pair rows × 128
    // bytes) of b, inside the panels; the stores write the 32 × 32 block.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{a} + {sa}*1]",
            "tileloadd tmm5, [{a} + {sa}*1 + 1024]",
            "tileloadd tmm6, [{b} + {sb}*1]",
            "tileloadd tmm7, [{b} + {sb}*1 + 64]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, 2048",
            "add {b}, 2048",
            "dec {n}",
            "jnz 2b",
            "tilestored [{c} + {sc}*1], tmm0",
            "tilestored [{c} + {sc}*1 + 64], tmm1",
            "tilestored [{c2} + {sc}*1], tmm2",
            "tilestored [{c2} + {sc}*1 + 64], tmm3",
            a = inout(reg) a => _,
            b = inout(reg) b => _,
            n = inout(reg) tiles => _,
            sa = in(reg) 4 * TILE_PAIRS,
            sb = in(reg) 4 * TN,
            sc = in(reg) c_bytes,
            c = in(reg) c,
            c2 = in(reg) c.add(16 * c_bytes),
            options(nostack),
        );
    }
}

/// One 32 × 32 block on the tiles, or on the tests' [`model`] of them; zeros with no tiles
/// of `k`.
///
/// # Safety
///
/// As [`tile_block`], `tiles` may be zero.
#[inline(always)]
unsafe fn block(tiles: usize, a: *const u32, b: *const u32, c: *mut f32, c_bytes: usize) {
    // SAFETY: as the caller vouches; without tiles only the block's rows are written.
    unsafe {
        if tiles == 0 {
            for i in 0..TM {
                std::ptr::write_bytes(c.byte_add(i * c_bytes), 0, TN);
            }
        } else if modelled() {
            model::block(tiles, a, b, c, c_bytes / 4);
        } else {
            tile_block(tiles, a, b, c, c_bytes);
        }
    }
}

/// [`gemm`] asks for a block's lines of `C` with the intent to write them
/// ([`prefetch_block`]) before the block's products when a block of `k` has at most this many
/// steps...
const PREFETCH_C_MAX_K: usize = 256;
/// ... and the output at least this many columns.
const PREFETCH_C_MIN_N: usize = 256;

/// Asks for the 32 rows of 128 bytes of the output block at `c` (rows `ldc` floats apart)
/// with the intent to write them (`prefetchw`), so that fetching their ownership overlaps the
/// block's products instead of stalling its tile stores. Measured on a 2-core Xeon with AMX
/// (`gemm_peak`, bf16 operands, with and without alternated in one process, best of eight
/// turns): d 128's GEMMs with `k` 128 and 384-512 output columns 1.18-1.53x (`C` 1.5-2 MiB
/// per GEMM, written once), but 0.91-0.94x where the output is 128 columns wide (`C` of 512
/// KiB stays in L2 from one GEMM to the next) and 0.91-1.07x on d 512's, whose blocks run 16
/// tiles of `k` or more; hence the two bounds above.
///
/// # Safety
///
/// The block's rows lie in `C` (a prefetch does not fault, but the addresses are formed with
/// `add`).
#[inline(always)]
unsafe fn prefetch_block(c: *mut f32, ldc: usize) {
    // SAFETY: the 32 rows of the block lie inside C (the caller vouches).
    unsafe {
        for i in 0..TM {
            let row = c.add(i * ldc).cast::<i8>();
            _mm_prefetch::<_MM_HINT_ET0>(row);
            _mm_prefetch::<_MM_HINT_ET0>(row.add(64));
        }
    }
}

/// `c[i·ldc + j] = from[i·ldc + j] + block[i][j]` (or `block[i][j]` where there is no
/// `from`) for `i < rows`, `j < cols` (at most 32 each).
///
/// # Safety
///
/// AVX-512 F is available; the `rows × cols` tile of `c` may be written, that of `from`
/// read (it may be `c` itself).
#[inline(always)]
unsafe fn store_block(
    block: &Block,
    c: *mut f32,
    from: Option<*const f32>,
    ldc: usize,
    rows: usize,
    cols: usize,
) {
    let (m0, m1) = (mask16(cols), mask16(cols.saturating_sub(16)));
    // SAFETY: the masked loads and stores touch the tile's elements only.
    unsafe {
        for (i, r) in block.0.iter().enumerate().take(rows) {
            let mut v0 = _mm512_loadu_ps(r.as_ptr());
            let mut v1 = _mm512_loadu_ps(r.as_ptr().add(16));
            if let Some(f) = from {
                let f = f.add(i * ldc);
                v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, f), v0);
                v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, f.add(16)), v1);
            }
            let row = c.add(i * ldc);
            _mm512_mask_storeu_ps(row, m0, v0);
            _mm512_mask_storeu_ps(row.add(16), m1, v1);
        }
    }
}

/// `c[i·ldc + j] = from[i·ldc + j] + (a·b)[i, j]` for `i < a.rows`, `j < b.cols` (`from`
/// may be `c` itself: accumulation), or `(a·b)[i, j]` when there is no `from`; each block
/// runs over the tiles of `k` that hold the pairs `skip` says it needs (none: the start
/// alone).
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
    // SAFETY: as the caller vouches.
    unsafe { gemm_blocked(c, ldc, a, b, from, skip, BLOCKING) }
}

/// [`gemm`] with the blocking `blocking` (the benchmark compares blockings with it).
///
/// # Safety
///
/// As [`gemm`]; `blocking` is [`Blocking::valid`].
pub(super) unsafe fn gemm_blocked<A: Src, B: Src>(
    c: *mut f32,
    ldc: usize,
    a: Mat<'_, A>,
    b: Mat<'_, B>,
    from: Option<*const f32>,
    skip: Skip,
    blocking: Blocking,
) {
    // SAFETY: as the caller vouches; the function only adds AVX-512 to what it may use.
    unsafe { gemm_avx512(c, ldc, a, b, from, skip, blocking) }
}

/// [`gemm_blocked`] with the AVX-512 features enabled for the packing and the edges.
///
/// # Safety
///
/// As [`gemm_blocked`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn gemm_avx512<A: Src, B: Src>(
    c: *mut f32,
    ldc: usize,
    a: Mat<'_, A>,
    b: Mat<'_, B>,
    from: Option<*const f32>,
    skip: Skip,
    Blocking {
        kc: kc_max,
        mc: mc_max,
        nc: nc_max,
    }: Blocking,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let config = TileConfig::new();
    let mut edge = Block([[0.0; TN]; TM]);
    BUFS.with(|bufs| {
        let mut bufs = bufs.borrow_mut();
        let (abuf, bbuf, tbuf) = &mut *bufs;
        // k in equal blocks of whole tiles, at most kc_max (k = 1536 as 512 + 512 + 512,
        // k = 600 as 320 + 280 at kc_max 512).
        let kc_step = k
            .div_ceil(k.div_ceil(kc_max))
            .next_multiple_of(2 * TILE_PAIRS);
        let kp_max = kc_step.min(k.next_multiple_of(2 * TILE_PAIRS)) / 2;
        let apack = abuf.words(kp_max * mc_max.min(m.next_multiple_of(TM)));
        let bpack = bbuf.words(kp_max * nc_max.min(n.next_multiple_of(TN)));
        let tmp = tbuf.words(kp_max * 16);
        // SAFETY: the packs read elements (i, l) of a and (l, j) of b with i < m, l < k,
        // j < n, which the caller guarantees are in their slices; the blocks read and write
        // the tiles of c inside its m × n rows (whole 32 × 32 blocks in place, blocks at the
        // edges through `edge`); the buffers hold the blocks' panels; the tiles are
        // configured before the first tile instruction and released after the last.
        unsafe {
            if !modelled() {
                asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
            }
            for pc in (0..k).step_by(kc_step) {
                let kc = kc_step.min(k - pc);
                let kp = kc.div_ceil(2);
                let kp_pad = kc.next_multiple_of(2 * TILE_PAIRS) / 2;
                // Few tiles of k per block and a wide output: ask for the block's lines of
                // `C` before its products (see `prefetch_block`).
                let prefetch_c = kc <= PREFETCH_C_MAX_K && n >= PREFETCH_C_MIN_N;
                // Later blocks of k add to what the first ones wrote.
                let from = if pc == 0 { from } else { Some(c.cast_const()) };
                for ic in (0..m).step_by(mc_max) {
                    let mc = mc_max.min(m - ic);
                    let a_src = a.data.as_ptr().add(ic * a.rs + pc * a.cs);
                    pack_a(a_src, a.rs, a.cs, mc, kc, kp_pad, tmp, apack);
                    for jc in (0..n).step_by(nc_max) {
                        let nc = nc_max.min(n - jc);
                        let b_src = b.data.as_ptr().add(pc * b.rs + jc * b.cs);
                        pack_b(b_src, b.cs, b.rs, nc, kc, kp_pad, bpack);
                        for (iq, ir) in (0..mc).step_by(TM).enumerate() {
                            let ap = apack.add(iq * TM * kp_pad);
                            for (jq, jr) in (0..nc).step_by(TN).enumerate() {
                                let bp = bpack.add(jq * kp_pad * TN);
                                let at = (ic + ir) * ldc + jc + jr;
                                let cp = c.add(at);
                                let fp = from.map(|f| f.add(at));
                                let rows = (mc - ir).min(TM);
                                let cols = (nc - jr).min(TN);
                                // The tiles of k holding the pairs the block needs.
                                let (lo, hi) = skip.pairs(ic + ir, rows, jc + jr, pc, kp);
                                let (t0, t1) = (lo / TILE_PAIRS, hi.div_ceil(TILE_PAIRS));
                                let n_tiles = t1.saturating_sub(t0);
                                let (ap, bp) = (
                                    ap.add(a_word(0, t0 * TILE_PAIRS)),
                                    bp.add(t0 * TILE_PAIRS * TN),
                                );
                                if rows == TM && cols == TN && fp.is_none() {
                                    if prefetch_c {
                                        prefetch_block(cp, ldc);
                                    }
                                    block(n_tiles, ap, bp, cp, 4 * ldc);
                                } else {
                                    let e = edge.0.as_mut_ptr().cast::<f32>();
                                    block(n_tiles, ap, bp, e, 4 * TN);
                                    store_block(&edge, cp, fp, ldc, rows, cols);
                                }
                            }
                        }
                    }
                }
            }
            if !modelled() {
                asm!("tilerelease", options(nostack, nomem));
            }
        }
    });
}

/// Runs `iters` rounds of four independent `tdpbf16ps` on zero tiles (the benchmark's peak);
/// returns the FLOPs done.
///
/// # Safety
///
/// [`available`] is true.
pub(super) unsafe fn peak(iters: usize) -> f64 {
    let config = TileConfig::new();
    // SAFETY: the tiles are configured first and released last; nothing is read or written
    // but the configuration.
    unsafe {
        asm!(
            "ldtilecfg [{cfg}]",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tilezero tmm4",
            "tilezero tmm5",
            "tilezero tmm6",
            "tilezero tmm7",
            "2:",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "dec {n}",
            "jnz 2b",
            "tilerelease",
            cfg = in(reg) &config,
            n = inout(reg) iters.max(1) => _,
            options(nostack, readonly),
        );
    }
    (iters.max(1) * 4 * 16 * 16 * 32 * 2) as f64
}

/// Whether this thread's GEMMs run on the tests' [`model`] of the tiles: never outside the
/// tests, where the branch is compiled away.
pub(super) fn modelled() -> bool {
    cfg!(test) && model::ON.get()
}

/// A scalar model of the tile instructions, so that the packing and the blocking around them
/// are tested on processors without AMX: with [`model::ON`] set, [`gemm`] computes each block
/// in Rust from the packed panels, as `tdpbf16ps` does (products of bf16 exact in f32, summed
/// in f32), and runs no tile instruction.
pub(super) mod model {
    use std::cell::Cell;

    use super::{a_word, TILE_PAIRS, TM, TN};

    thread_local! {
        /// Whether this thread's AMX GEMMs run on the model (set by tests only).
        pub(in super::super) static ON: Cell<bool> = const { Cell::new(false) };
    }

    /// The bf16 halves of a pair word as f32: (low, high).
    fn halves(w: u32) -> (f32, f32) {
        (f32::from_bits(w << 16), f32::from_bits(w & 0xffff_0000))
    }

    /// [`super::tile_block`] computed from the panels: `c` has `ldc` floats between rows.
    ///
    /// # Safety
    ///
    /// The panels hold `tiles` tiles of `k`; the 32 × 32 block at `c` may be written.
    pub(super) unsafe fn block(
        tiles: usize,
        a: *const u32,
        b: *const u32,
        c: *mut f32,
        ldc: usize,
    ) {
        for i in 0..TM {
            for j in 0..TN {
                // SAFETY: element (i, j) of the block, pair p of row i and pair row p's
                // column j are inside the block and the panels.
                unsafe {
                    let mut acc = 0.0;
                    for p in 0..tiles * TILE_PAIRS {
                        let (aw, bw) = (*a.add(a_word(i, p)), *b.add(p * TN + j));
                        let ((a0, a1), (b0, b1)) = (halves(aw), halves(bw));
                        acc += a1 * b1;
                        acc += a0 * b0;
                    }
                    *c.add(i * ldc + j) = acc;
                }
            }
        }
    }
}
