//! Benchmark hooks for `examples/gemm_peak.rs` (not an API): one GEMM by kind and path, and
//! the AMX tiles' peak.

use super::super::gemm::{gemm, Mat};
use super::{gemm_half, gemm_half_with, HalfOperand, HalfPath, Skip};
use crate::error::NnError;
use crate::precision::Half;
use half::bf16;

/// `a` (`[m, k]`, or stored `[k, m]` and read transposed when `transposed[0]`) and `b`
/// (`[k, n]`, or stored `[n, k]` when `transposed[1]`) as the GEMM's operands.
fn operands<'a, T>(
    [m, k, n]: [usize; 3],
    transposed: [bool; 2],
    a: &'a [T],
    b: &'a [T],
) -> (Mat<'a, T>, Mat<'a, T>) {
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
    (a, b)
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
    let (a, b) = operands([m, k, n], transposed, a, b);
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

/// Benchmark hook for `examples/gemm_peak.rs`, not an API: [`bench_gemm`]'s `"bf16"` with
/// operands that are bf16 already (as the training code's saved activations are under mixed
/// precision), so that packing copies them instead of rounding f32: the rate to set beside a
/// kernel library's GEMM on bf16 tensors.
#[doc(hidden)]
pub fn bench_gemm_bf16(
    [m, k, n]: [usize; 3],
    transposed: [bool; 2],
    a: &[bf16],
    b: &[bf16],
    dst: &mut [f32],
) -> Result<(), NnError> {
    let (a, b) = operands([m, k, n], transposed, a, b);
    gemm_half(
        Half::Bf16,
        dst,
        HalfOperand::Bf16(a),
        HalfOperand::Bf16(b),
        false,
        "benchmark GEMM",
    )
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
        let blocking = super::amx::Blocking { kc, mc, nc };
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
        unsafe { super::amx::gemm_blocked(dst.as_mut_ptr(), n, a, b, None, Skip::None, blocking) };
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
    return Some(unsafe { super::amx::peak(iters) });
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    None
}
