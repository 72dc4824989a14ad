//! The mixed-precision GEMMs on every path against an f64 reference, the conversions against
//! the `half` crate, and the fused conversions against the passes they fuse.

use candle_core::{DType, Device, Tensor};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::super::Uninit;
use super::convert::PIECE;
use super::*;

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

/// `gemm_peak`'s "bf16 in" column runs the bf16 GEMM on operands that are bf16 already: on
/// values that bf16 holds exactly it must give what the f32-operand GEMM gives, bit for bit
/// (the same path; rounding such values changes nothing), in every layout it reads.
#[test]
fn the_bf16_operand_benchmark_is_the_same_gemm() {
    let [m, k, n] = [70, 300, 90];
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut exact = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| bf16::from_f32(rng.random_range(-2.0f32..2.0)).to_f32())
            .collect()
    };
    let (a, b) = (exact(m * k), exact(k * n));
    let (a16, b16): (Vec<bf16>, Vec<bf16>) = (
        a.iter().map(|&x| bf16::from_f32(x)).collect(),
        b.iter().map(|&x| bf16::from_f32(x)).collect(),
    );
    for transposed in [[false, false], [false, true], [true, false]] {
        let mut want = vec![0f32; m * n];
        bench_gemm("bf16", [m, k, n], transposed, &a, &b, &mut want).unwrap();
        let mut got = vec![1f32; m * n];
        bench_gemm_bf16([m, k, n], transposed, &a16, &b16, &mut got).unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{transposed:?}: the bf16-operand GEMM differs"
        );
    }
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
    let triangles: [(Skip, Zero); 2] = [(Skip::ALower, |i, l| l > i), (Skip::AUpper, |i, l| l < i)];
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
        assert!(gemm_half_with(path, Half::Bf16, &mut dst, outside, outside, false, "t").is_err());
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
