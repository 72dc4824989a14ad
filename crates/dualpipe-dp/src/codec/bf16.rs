//! bfloat16: the upper 16 bits of an `f32`, rounded to nearest (ties to even).

use crate::GradFloat;

/// The bfloat16 bits of `v` (round to nearest, ties to even; NaN stays a quiet NaN; values
/// beyond bfloat16's range round to infinity, as IEEE rounding does).
pub fn to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let bias = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(bias) >> 16) as u16
}

/// The `f32` value of bfloat16 bits (exact).
pub fn from_bf16(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Appends each value as bfloat16, `u16` little-endian.
pub fn encode<T: GradFloat>(values: &[T], out: &mut Vec<u8>) {
    for &v in values {
        out.extend_from_slice(&to_bf16(v.to_f32()).to_le_bytes());
    }
}

/// Decodes `2 * out.len()` bytes (the caller checked the count).
pub fn decode<T: GradFloat>(bytes: &[u8], out: &mut [T]) {
    for (v, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *v = T::from_f64(from_bf16(u16::from_le_bytes([b[0], b[1]])) as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_with_ties_to_even() {
        assert_eq!(from_bf16(to_bf16(1.0)), 1.0);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
        assert_eq!(from_bf16(to_bf16(1.0 + 2f32.powi(-8))), 1.0);
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
        assert_eq!(
            from_bf16(to_bf16(1.0 + 3.0 * 2f32.powi(-8))),
            1.0 + 2f32.powi(-6)
        );
        assert_eq!(
            from_bf16(to_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20))),
            1.0 + 2f32.powi(-7)
        );
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
        assert_eq!(from_bf16(to_bf16(f32::MAX)), f32::INFINITY);
        assert_eq!(to_bf16(-0.0), 0x8000);
    }

    #[test]
    fn relative_error_is_at_most_half_an_ulp_of_bf16() {
        let mut x = 1.0e-30f32;
        while x < 1.0e30 {
            for v in [x, -x, x * 1.37, x * 1.999] {
                let back = from_bf16(to_bf16(v));
                assert!(((back - v) / v).abs() <= 2f32.powi(-8), "{v} -> {back}");
            }
            x *= 3.1;
        }
    }
}
