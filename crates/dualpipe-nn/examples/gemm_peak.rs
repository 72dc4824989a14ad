//! One core's peak FLOP/s for f32 FMAs and bf16 dot products, and the FLOP/s that the f32 GEMM
//! and the mixed-precision bf16 GEMM reach on the GPT's largest GEMMs (N = 1024 rows; d 512
//! and d 128: the forward `x Wᵀ`, the backward-input `dy W` and the weight-gradient `dyᵀ x`
//! of the attention projections and the MLP), each as a share of its dtype's peak.
//!
//! `cargo run --release -p dualpipe-nn --example gemm_peak [-- --json] [--only TEXT] [--mlp]
//! [--amx-blocking]`
//!
//! `--mlp`: the MLP benchmark's layers instead (128 rows, widths 128, 512 and 1024). Each GEMM
//! reads its operands in the layout the training code uses: the f32 forward multiplies by the
//! weight's cached transpose, the mixed-precision forward reads the weight transposed.
//! `--amx-blocking` (processors with AMX): the bf16 GEMMs of d 512 on AMX under each of a set
//! of blockings (steps of `k`, rows of `A`, columns of `B` per packed block), as a share of
//! the tiles' peak, to choose the kernel's blocking on a machine that has the tiles.
//!
//! Everything runs on one thread (a pipeline rank's share of the machine), timed in the
//! thread's CPU time (Linux) as the best of repetitions, so that other processes sharing the
//! core take nothing off the rates (their cache traffic still can). The peaks are loops
//! of independent `vfmadd231ps` (16 lanes × 2 FLOPs) or `vdpbf16ps` (16 lanes × 2 products ×
//! 2 FLOPs) on 16 accumulator registers, AVX2 (8 lanes) where there is no AVX-512. The GEMMs'
//! operands are f32 (the bf16 GEMM rounds them as it packs them), timed as the best of several
//! repetitions after a warm-up; the column "bf16 in" is the same bf16 GEMM on operands that
//! are bf16 already (its packing copies them), the rate to set beside a library's GEMM on
//! bf16 tensors (`scripts/gemm_onednn.py` puts PyTorch's oneDNN beside it). The last column
//! is the f16 GEMM, on the converting path (operands rounded to f16 and widened, then the f32
//! GEMM), for comparison. Where the processor has AMX, the bf16 GEMM runs on its tiles: the
//! bf16 peak is then four independent `tdpbf16ps` on zero tiles (16 × 16 × 32 × 2 FLOPs
//! each), and a last column gives the `vdpbf16ps` kernel's rate for comparison.

use std::hint::black_box;
use std::time::{Duration, Instant};

use dualpipe_nn::layers::{bench_amx_peak, bench_gemm, bench_gemm_bf16};
use dualpipe_nn::NnError;
use half::bf16;

/// Seconds of CPU time this thread has run (wall time where that clock is not available), so
/// that other processes' time slices on a shared machine do not count.
fn thread_seconds(epoch: Instant) -> f64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0 {
            return t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9;
        }
    }
    epoch.elapsed().as_secs_f64()
}

/// FLOP/s of `flops` operations done by `f`, the best of repetitions over about `budget` of
/// wall time (each timed in this thread's CPU time).
fn best_rate(flops: f64, budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let epoch = Instant::now();
    let mut best = f64::INFINITY;
    let mut reps = 0;
    while reps < 3 || epoch.elapsed() < budget {
        let t = thread_seconds(epoch);
        f();
        best = best.min(thread_seconds(epoch) - t);
        reps += 1;
    }
    flops / best
}

#[cfg(target_arch = "x86_64")]
mod peak {
    use std::arch::x86_64::*;

    /// Accumulator registers per loop.
    const ACC: usize = 16;

    /// `iters` rounds of 16 independent zmm FMAs; returns a value that depends on them all.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma512(iters: usize) -> f32 {
        let mut acc = [_mm512_setzero_ps(); ACC];
        let x = _mm512_set1_ps(std::hint::black_box(1e-7));
        let y = _mm512_set1_ps(std::hint::black_box(0.999));
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, y, x);
            }
        }
        acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum::<f32>()
    }

    /// As [`fma512`] on ymm registers (AVX2 with FMA).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma256(iters: usize) -> f32 {
        let mut acc = [_mm256_setzero_ps(); ACC];
        let x = _mm256_set1_ps(std::hint::black_box(1e-7));
        let y = _mm256_set1_ps(std::hint::black_box(0.999));
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, y, x);
            }
        }
        let mut out = [0f32; 8];
        let mut s = 0.0;
        for a in acc {
            _mm256_storeu_ps(out.as_mut_ptr(), a);
            s += out.iter().sum::<f32>();
        }
        s
    }

    /// `iters` rounds of 16 independent `vdpbf16ps` on zmm registers.
    #[target_feature(enable = "avx512bf16,avx512f,avx512bw,avx512vl")]
    pub unsafe fn dpbf16(iters: usize) -> f32 {
        let mut acc = [_mm512_setzero_ps(); ACC];
        let x = _mm512_cvtne2ps_pbh(
            _mm512_set1_ps(std::hint::black_box(1e-3)),
            _mm512_set1_ps(std::hint::black_box(2e-3)),
        );
        let y = _mm512_cvtne2ps_pbh(
            _mm512_set1_ps(std::hint::black_box(0.5)),
            _mm512_set1_ps(std::hint::black_box(0.25)),
        );
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_dpbf16_ps(*a, x, y);
            }
        }
        acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum::<f32>()
    }

    /// FLOPs per round of the loops: 16 accumulators × lanes × FLOPs per lane.
    pub const ROUND_FMA512: f64 = (ACC * 16 * 2) as f64;
    /// As above for ymm.
    pub const ROUND_FMA256: f64 = (ACC * 8 * 2) as f64;
    /// As above for `vdpbf16ps` (two products and two additions per lane).
    pub const ROUND_DPBF16: f64 = (ACC * 16 * 4) as f64;
}

/// One core's peak f32 and bf16 FLOP/s (bf16 `None` without AVX512_BF16), and the
/// instructions measured.
fn peaks() -> (f64, &'static str, Option<f64>) {
    // Short repetitions (about 5 ms), so that the best of them misses the other processes'
    // time slices on a shared machine.
    const ITERS: usize = 500_000;
    let budget = Duration::from_millis(600);
    #[cfg(target_arch = "x86_64")]
    {
        let bf16 = is_x86_feature_detected!("avx512bf16").then(|| {
            best_rate(ITERS as f64 * peak::ROUND_DPBF16, budget, || {
                // SAFETY: the processor has AVX512_BF16 (checked above).
                black_box(unsafe { peak::dpbf16(black_box(ITERS)) });
            })
        });
        if is_x86_feature_detected!("avx512f") {
            let f32 = best_rate(ITERS as f64 * peak::ROUND_FMA512, budget, || {
                // SAFETY: the processor has AVX-512 F.
                black_box(unsafe { peak::fma512(black_box(ITERS)) });
            });
            return (f32, "vfmadd231ps zmm", bf16);
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            let f32 = best_rate(ITERS as f64 * peak::ROUND_FMA256, budget, || {
                // SAFETY: the processor has AVX2 and FMA.
                black_box(unsafe { peak::fma256(black_box(ITERS)) });
            });
            return (f32, "vfmadd231ps ymm", bf16);
        }
    }
    let mut acc = [0f32; 16];
    let rate = best_rate(ITERS as f64 * 32.0, budget, || {
        for _ in 0..black_box(ITERS) {
            for a in acc.iter_mut() {
                *a = a.mul_add(0.999, 1e-7);
            }
        }
        black_box(acc);
    });
    (rate, "scalar mul_add", None)
}

/// A GEMM of the GPT: its name, `[m, k, n]` and which operands are read transposed by the f32
/// GEMM and by the mixed-precision ones.
struct Shape {
    name: String,
    dims: [usize; 3],
    transposed: [bool; 2],
    half_transposed: [bool; 2],
}

/// The forward, backward-input and weight-gradient GEMMs of the attention's QKV and output
/// projections and the MLP's two layers at model width `d` on `rows` rows.
fn shapes(d: usize, rows: usize) -> Vec<Shape> {
    let mut out = Vec::new();
    for (layer, input, output) in [
        ("qkv", d, 3 * d),
        ("proj", d, d),
        ("fc1", d, 4 * d),
        ("fc2", 4 * d, d),
    ] {
        // Forward x Wᵀ: the f32 Linear keeps Wᵀ [in, out] contiguous from one weight update
        // to the next; the mixed-precision one reads W [out, in] transposed as it packs it.
        out.push(Shape {
            name: format!("d{d} {layer} fwd x·Wᵀ"),
            dims: [rows, input, output],
            transposed: [false, false],
            half_transposed: [false, true],
        });
        // Backward input dy W: dy [rows, out], W [out, in].
        out.push(Shape {
            name: format!("d{d} {layer} bwd dy·W"),
            dims: [rows, output, input],
            transposed: [false, false],
            half_transposed: [false, false],
        });
        // Weight gradient dyᵀ x: dy [rows, out] read transposed, x [rows, in].
        out.push(Shape {
            name: format!("d{d} {layer} wgrad dyᵀ·x"),
            dims: [output, rows, input],
            transposed: [true, false],
            half_transposed: [true, false],
        });
    }
    out
}

/// A GEMM's operands and output, and its FLOPs.
struct Operands {
    a: Vec<f32>,
    b: Vec<f32>,
    /// `a` and `b` rounded to bf16, for the GEMM on bf16 operands.
    a16: Vec<bf16>,
    b16: Vec<bf16>,
    dst: Vec<f32>,
    flops: f64,
}

impl Operands {
    fn new(shape: &Shape) -> Operands {
        let [m, k, n] = shape.dims;
        let (a, b) = (values(m * k, 1), values(k * n, 2));
        let round = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect();
        Operands {
            a16: round(&a),
            b16: round(&b),
            a,
            b,
            dst: vec![0f32; m * n],
            flops: 2.0 * (m * k * n) as f64,
        }
    }

    /// FLOP/s of the GEMM of `kind` (see `bench_gemm`), its operands read as the training code
    /// reads them for that kind, the best of repetitions over about `budget`.
    fn rate(&mut self, shape: &Shape, kind: &str, budget: Duration) -> Result<f64, NnError> {
        let transposed = if kind == "f32" {
            shape.transposed
        } else {
            shape.half_transposed
        };
        let mut err = None;
        let Operands {
            a,
            b,
            a16,
            b16,
            dst,
            flops,
        } = self;
        let r = best_rate(*flops, budget, || {
            let done = if kind == "bf16-operands" {
                bench_gemm_bf16(shape.dims, transposed, a16, b16, dst)
            } else {
                bench_gemm(kind, shape.dims, transposed, a, b, dst)
            };
            if let Err(e) = done {
                err = Some(e);
            }
            black_box(&dst);
        });
        err.map_or(Ok(r), Err)
    }
}

/// Deterministic values in [-1, 1).
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    // `--only TEXT`: only the GEMMs whose name contains TEXT.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    let (f32_peak, f32_instr, bf16_peak) = peaks();
    // The bf16 GEMM runs on AMX tiles where the processor has them: timed as the others.
    const AMX_ITERS: usize = 200_000;
    let amx_peak = bench_amx_peak(AMX_ITERS).map(|flops| {
        best_rate(flops, Duration::from_millis(600), || {
            black_box(bench_amx_peak(black_box(AMX_ITERS)));
        })
    });
    if args.iter().any(|a| a == "--amx-blocking") {
        return match amx_peak {
            Some(peak) => amx_blocking(peak, &only),
            None => Err("--amx-blocking: this processor (or system) has no AMX".into()),
        };
    }
    let gflops = |p: Option<f64>| p.map_or("null".to_string(), |p| format!("{:.1}", p / 1e9));
    if json {
        println!(
            "{{\"peak\":{{\"f32_gflops\":{:.1},\"f32_instruction\":\"{f32_instr}\",\"bf16_gflops\":{},\"amx_bf16_gflops\":{}}}}}",
            f32_peak / 1e9,
            gflops(bf16_peak),
            gflops(amx_peak),
        );
    } else {
        println!(
            "one-thread peak: f32 {:.1} GFLOP/s ({f32_instr})",
            f32_peak / 1e9
        );
        match bf16_peak {
            Some(p) => println!(
                "one-thread peak: bf16 {:.1} GFLOP/s (vdpbf16ps zmm), {:.2}x f32",
                p / 1e9,
                p / f32_peak
            ),
            None => println!(
                "one-thread peak: bf16 n/a (no AVX512_BF16: bf16 uses the converting path)"
            ),
        }
        if let Some(p) = amx_peak {
            println!(
                "one-thread peak: bf16 {:.1} GFLOP/s (AMX tdpbf16ps), {:.2}x f32; the bf16 GEMM runs on AMX",
                p / 1e9,
                p / f32_peak
            );
        }
        println!();
        println!(
            "{:<26} {:>16} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7} {:>8} {:>9} {:>9}",
            "GEMM (GFLOP/s)",
            "m x k x n",
            "f32",
            "%peak",
            "bf16",
            "%peak",
            "bf16 in",
            "%peak",
            "bf16/f32",
            "f16 conv",
            "bf16 dp"
        );
    }
    let bf16_ref = amx_peak.or(bf16_peak).unwrap_or(f32_peak);
    // With AMX, the `vdpbf16ps` kernel too, for comparison.
    let dp_too = amx_peak.is_some() && bf16_peak.is_some();
    let budget = Duration::from_millis(400);
    // `--mlp`: the MLP benchmark's GEMMs (one micro-batch of 128 rows, widths 128, 512 and
    // 1024) instead of the GPT's.
    let list: Vec<Shape> = if args.iter().any(|a| a == "--mlp") {
        [128, 512, 1024]
            .iter()
            .flat_map(|&d| shapes(d, 128))
            .filter(|s| s.name.contains("fc"))
            .collect()
    } else {
        shapes(512, 1024)
            .into_iter()
            .chain(shapes(128, 1024))
            .collect()
    };
    for shape in list {
        if !shape.name.contains(&only) {
            continue;
        }
        let [m, k, n] = shape.dims;
        let mut ops = Operands::new(&shape);
        let mut rate = |kind: &str| ops.rate(&shape, kind, budget);
        let f32_rate = rate("f32")?;
        let bf16_rate = rate("bf16")?;
        let bf16_in_rate = rate("bf16-operands")?;
        let f16_rate = rate("f16")?;
        let dp_rate = if dp_too {
            Some(rate("bf16-avx512")?)
        } else {
            None
        };
        if json {
            println!(
                "{{\"gemm\":\"{}\",\"m\":{m},\"k\":{k},\"n\":{n},\"f32_gflops\":{:.1},\"f32_share\":{:.3},\"bf16_gflops\":{:.1},\"bf16_share\":{:.3},\"bf16_operands_gflops\":{:.1},\"bf16_operands_share\":{:.3},\"f16_converting_gflops\":{:.1},\"bf16_avx512_gflops\":{}}}",
                shape.name,
                f32_rate / 1e9,
                f32_rate / f32_peak,
                bf16_rate / 1e9,
                bf16_rate / bf16_ref,
                bf16_in_rate / 1e9,
                bf16_in_rate / bf16_ref,
                f16_rate / 1e9,
                gflops(dp_rate),
            );
        } else {
            println!(
                "{:<26} {:>16} {:>9.1} {:>6.1}% {:>9.1} {:>6.1}% {:>9.1} {:>6.1}% {:>7.2}x {:>9.1} {:>9}",
                shape.name,
                format!("{m}x{k}x{n}"),
                f32_rate / 1e9,
                100.0 * f32_rate / f32_peak,
                bf16_rate / 1e9,
                100.0 * bf16_rate / bf16_ref,
                bf16_in_rate / 1e9,
                100.0 * bf16_in_rate / bf16_ref,
                bf16_rate / f32_rate,
                f16_rate / 1e9,
                dp_rate.map_or("-".to_string(), |r| format!("{:.1}", r / 1e9)),
            );
        }
    }
    Ok(())
}

/// The blockings `--amx-blocking` compares: `KC,MC,NC` (the kernel's own first).
const AMX_BLOCKINGS: [&str; 8] = [
    "1024,2048,512",
    "1024,128,4096",
    "1024,1024,512",
    "1024,128,512",
    "1024,2048,1024",
    "1024,2048,256",
    "512,2048,512",
    "1024,256,1024",
];

/// Rounds `--amx-blocking` measures every blocking in, one after the other, keeping each
/// one's best: on a shared host the tiles' rate can change by several times from one second
/// to the next, and interleaving gives every blocking the same chances.
const AMX_ROUNDS: usize = 8;

/// Prints the d-512 bf16 GEMMs' rates on AMX (share of the tiles' `peak`) under each of
/// [`AMX_BLOCKINGS`], and each blocking's mean share.
fn amx_blocking(peak: f64, only: &str) -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "bf16 on AMX, % of the tiles' peak ({:.1} GFLOP/s), by blocking KC,MC,NC",
        peak / 1e9
    );
    print!("{:<26}", "GEMM");
    for b in AMX_BLOCKINGS {
        print!(" {b:>15}");
    }
    println!();
    let mut sums = [0.0; AMX_BLOCKINGS.len()];
    let mut count = 0;
    for shape in shapes(512, 1024) {
        if !shape.name.contains(only) {
            continue;
        }
        let mut ops = Operands::new(&shape);
        print!("{:<26}", shape.name);
        let mut best = [0.0f64; AMX_BLOCKINGS.len()];
        for _ in 0..AMX_ROUNDS {
            for (i, blocking) in AMX_BLOCKINGS.iter().enumerate() {
                let kind = format!("bf16-amx:{blocking}");
                best[i] = best[i].max(ops.rate(&shape, &kind, Duration::from_millis(30))?);
            }
        }
        for (i, rate) in best.iter().enumerate() {
            sums[i] += rate / peak;
            print!(" {:>14.1}%", 100.0 * rate / peak);
        }
        count += 1;
        println!();
    }
    print!("{:<26}", "mean");
    for s in sums {
        print!(" {:>14.1}%", 100.0 * s / count.max(1) as f64);
    }
    println!();
    Ok(())
}
