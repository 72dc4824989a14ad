//! The element types' special functions: GELU through libm in f64, and a vectorizable f32
//! GELU with its own `exp` and erfc approximation.

use std::mem::MaybeUninit;

use super::Elem;

const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

impl Elem for f64 {
    /// Without the derivative's `exp` (inference, the teacher).
    fn gelu(x: &[f64], y: &mut [MaybeUninit<f64>]) {
        assert_eq!(x.len(), y.len(), "GELU: input and output lengths");
        for (&x, y) in x.iter().zip(y) {
            // The same expression as candle's `gelu_erf`.
            y.write((libm::erf(x * std::f64::consts::FRAC_1_SQRT_2) + 1.0) * 0.5 * x);
        }
    }

    fn gelu_forward(x: &[f64], y: &mut [MaybeUninit<f64>], d: &mut [MaybeUninit<f64>]) {
        assert!(
            x.len() == y.len() && x.len() == d.len(),
            "GELU: input and output lengths"
        );
        for ((&x, y), d) in x.iter().zip(y).zip(d) {
            let erf = libm::erf(x * std::f64::consts::FRAC_1_SQRT_2);
            // The same expression as candle's `gelu_erf`.
            y.write((erf + 1.0) * 0.5 * x);
            d.write(x * (libm::exp(-0.5 * (x * x)) * INV_SQRT_2PI) + (erf * 0.5 + 0.5));
        }
    }

    fn sqrt(self) -> f64 {
        f64::sqrt(self)
    }

    fn exp(self) -> f64 {
        libm::exp(self)
    }

    fn ln(self) -> f64 {
        libm::log(self)
    }
}

impl Elem for f32 {
    fn gelu_forward(x: &[f32], y: &mut [MaybeUninit<f32>], d: &mut [MaybeUninit<f32>]) {
        assert!(
            x.len() == y.len() && x.len() == d.len(),
            "GELU: input and output lengths"
        );
        gelu_forward_wide(x, y, d)
    }

    fn sqrt(self) -> f32 {
        f32::sqrt(self)
    }

    fn exp(self) -> f32 {
        exp_f32(self)
    }

    fn ln(self) -> f32 {
        libm::logf(self)
    }
}

wide_kernel! {
    /// [`gelu_forward_f32`] as wide as the CPU allows.
    fn gelu_forward_wide(x: &[f32], y: &mut [MaybeUninit<f32>], d: &mut [MaybeUninit<f32>]) => gelu_forward_f32
}

wide_kernel! {
    /// [`gelu_forward_fused`] as wide as the CPU allows: the GELU of the mixed-precision
    /// paths, whose outputs are rounded to 16 bits afterwards.
    pub(super) fn gelu_forward_fused_wide(x: &[f32], y: &mut [MaybeUninit<f32>], d: &mut [MaybeUninit<f32>]) => gelu_forward_fused
}

/// Branch-free f32 GELU and derivative (vectorizable): `Φ(x)` from an erfc approximation with
/// relative error below 1.2e-7 everywhere (a Chebyshev fit, Numerical Recipes' `erfcc`), so
/// the tails keep their relative precision. Each step of the polynomials is a multiply, then
/// an add (the f32 path's results stay what they were).
#[inline(always)]
fn gelu_forward_f32(x: &[f32], y: &mut [MaybeUninit<f32>], d: &mut [MaybeUninit<f32>]) {
    gelu_forward_in::<false>(x, y, d)
}

/// [`gelu_forward_f32`] with every multiply-add of its polynomials fused (one rounding): a
/// third fewer instructions where the processor has FMA (slower where it has not), results
/// within the same bounds but not bit-identical to [`gelu_forward_f32`]'s.
#[inline(always)]
fn gelu_forward_fused(x: &[f32], y: &mut [MaybeUninit<f32>], d: &mut [MaybeUninit<f32>]) {
    gelu_forward_in::<true>(x, y, d)
}

/// The f32 GELU and derivative, the polynomials' multiply-adds fused when `FUSED`.
#[inline(always)]
fn gelu_forward_in<const FUSED: bool>(
    x: &[f32],
    y: &mut [MaybeUninit<f32>],
    d: &mut [MaybeUninit<f32>],
) {
    for ((&x, y), d) in x.iter().zip(y).zip(d) {
        let (phi, pdf) = normal_cdf_pdf_f32::<FUSED>(x);
        y.write(x * phi);
        d.write(madd::<FUSED>(x, pdf, phi));
    }
}

/// `a·b + c`, rounded once when `FUSED`, twice otherwise.
#[inline(always)]
fn madd<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `(Φ(x), φ(x))` of the standard normal, in f32.
// The fit's published coefficients, kept as printed (f32 rounds them).
#[allow(clippy::excessive_precision)]
#[inline(always)]
fn normal_cdf_pdf_f32<const FUSED: bool>(x: f32) -> (f32, f32) {
    const C: [f32; 10] = [
        -1.265_512_2,
        1.000_023_7,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / madd::<FUSED>(0.5, z, 1.0);
    let mut poly = C[9];
    for &c in C[..9].iter().rev() {
        poly = madd::<FUSED>(t, poly, c);
    }
    let e = exp_in::<FUSED>(-z * z);
    let erfc = t * e * exp_in::<FUSED>(poly);
    let half = 0.5 * erfc;
    let phi = if x >= 0.0 { 1.0 - half } else { half };
    (phi, e * INV_SQRT_2PI as f32)
}

/// `eˣ` in f32 (relative error about 1e-7), branch-free and without float-to-int casts so it
/// vectorizes; underflows to 0 at -87 and below.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    exp_in::<false>(x)
}

/// [`exp_f32`], the multiply-adds fused when `FUSED`.
#[inline(always)]
fn exp_in<const FUSED: bool>(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 · 2²³: adding it rounds to an integer, held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const ROUND_BITS: u32 = 0x4B40_0000;
    // The Taylor coefficients 1/7!, 1/6!, ..., 1, 1.
    const C: [f32; 8] = [
        1.0 / 5040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
    let x = if x < -87.0 { -87.0 } else { x };
    let x = if x > 88.0 { 88.0 } else { x };
    let kr = madd::<FUSED>(x, LOG2_E, ROUND);
    let k = kr - ROUND;
    let r = madd::<FUSED>(-k, LN2_LO, madd::<FUSED>(-k, LN2_HI, x));
    let mut p = C[0];
    for &c in &C[1..] {
        p = madd::<FUSED>(r, p, c);
    }
    // 2ᵏ: the biased exponent k + 127 shifted into place.
    let scale = f32::from_bits(kr.to_bits().wrapping_sub(ROUND_BITS - 127) << 23);
    let v = p * scale;
    if x <= -87.0 {
        0.0
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phi(x: f64) -> f64 {
        0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
    }

    #[test]
    fn f32_gelu_matches_the_f64_formula() {
        check_gelu(f32::gelu_forward);
    }

    #[test]
    fn fused_gelu_matches_the_f64_formula_and_differs_from_the_f32_path() {
        check_gelu(gelu_forward_fused_wide);
        let xs: Vec<f32> = (0..1000).map(|i| -5.0 + i as f32 * 1e-2).collect();
        let run = |f: GeluFn| {
            let (mut y, mut d) = (
                vec![MaybeUninit::new(0.0); 1000],
                vec![MaybeUninit::new(0.0); 1000],
            );
            f(&xs, &mut y, &mut d);
            // SAFETY: initialized to 0, then written by the GELU.
            unsafe {
                y.iter()
                    .chain(&d)
                    .map(|v| v.assume_init().to_bits())
                    .collect::<Vec<_>>()
            }
        };
        // The fused one-rounding steps really run (on any processor: `mul_add` is exact).
        assert_ne!(run(f32::gelu_forward), run(gelu_forward_fused_wide));
    }

    /// An f32 GELU with its derivative.
    type GeluFn = fn(&[f32], &mut [MaybeUninit<f32>], &mut [MaybeUninit<f32>]);

    fn check_gelu(gelu: GeluFn) {
        // In the tails the error grows like x² ε: the argument of exp(-x²/2) is rounded to f32.
        let xs: Vec<f32> = (0..20_001).map(|i| -10.0 + i as f32 * 1e-3).collect();
        let mut y = vec![MaybeUninit::new(0.0); xs.len()];
        let mut d = vec![MaybeUninit::new(0.0); xs.len()];
        gelu(&xs, &mut y, &mut d);
        // SAFETY: every element was initialized (to 0, then by gelu_forward).
        let (y, d): (Vec<f32>, Vec<f32>) = unsafe {
            (
                y.iter().map(|v| v.assume_init()).collect(),
                d.iter().map(|v| v.assume_init()).collect(),
            )
        };
        for ((&x, &y), &d) in xs.iter().zip(&y).zip(&d) {
            let xf = x as f64;
            let want_y = xf * phi(xf);
            let want_d = phi(xf) + xf * (-0.5 * xf * xf).exp() * INV_SQRT_2PI;
            assert!(
                (y as f64 - want_y).abs() <= 2e-7 * (4.0 + xf * xf) * want_y.abs() + 1e-37,
                "gelu({x}) = {y}, want {want_y}"
            );
            // gelu' crosses 0 near x = -0.75: bound the error by the size of its two terms.
            let size = phi(xf) + xf.abs() * (-0.5 * xf * xf).exp() * INV_SQRT_2PI;
            assert!(
                (d as f64 - want_d).abs() <= 2e-7 * (4.0 + xf * xf) * size + 1e-37,
                "gelu'({x}) = {d}, want {want_d}"
            );
        }
    }

    #[test]
    fn exp_f32_is_accurate_and_underflows() {
        for i in -860..=880 {
            let x = i as f32 * 0.1;
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            assert!(
                (got - want).abs() <= 3e-7 * want,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(exp_f32(-100.0), 0.0);
    }
}
