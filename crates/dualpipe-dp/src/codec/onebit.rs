//! 1bit: per chunk an `f32` scale (mean absolute value), then one sign bit per value.

use super::scale_at;
use crate::GradFloat;

/// Appends one chunk: `mean |x|` as `f32`, then the bits (1 for `x >= 0`), least significant
/// bit first, `ceil(len / 8)` bytes.
pub fn encode_chunk<T: GradFloat>(chunk: &[T], out: &mut Vec<u8>) {
    let sum: f64 = chunk.iter().map(|v| v.to_f64().abs()).sum();
    let scale = if sum.is_finite() {
        (sum / chunk.len().max(1) as f64) as f32
    } else {
        f32::NAN
    };
    out.extend_from_slice(&scale.to_le_bytes());
    for group in chunk.chunks(8) {
        let mut byte = 0u8;
        for (j, v) in group.iter().enumerate() {
            if v.to_f64() >= 0.0 {
                byte |= 1 << j;
            }
        }
        out.push(byte);
    }
}

/// Decodes one chunk of `out.len()` values from the start of `bytes`; returns the bytes used.
pub fn decode_chunk<T: GradFloat>(bytes: &[u8], out: &mut [T]) -> usize {
    let scale = scale_at(bytes) as f64;
    let (plus, minus) = (T::from_f64(scale), T::from_f64(-scale));
    let n = out.len();
    let bits = &bytes[4..4 + n.div_ceil(8)];
    for (j, v) in out.iter_mut().enumerate() {
        *v = if bits[j / 8] >> (j % 8) & 1 == 1 {
            plus
        } else {
            minus
        };
    }
    4 + bits.len()
}

#[cfg(test)]
mod tests {
    use super::super::{Codec, Compression, Rounding};

    #[test]
    fn signs_and_the_mean_magnitude_survive() {
        let c = Codec {
            compression: Compression::OneBit,
            chunk_values: 4,
            rounding: Rounding::Nearest,
        };
        let v = [1.0f32, -3.0, 0.0, 4.0, -2.0, -0.5];
        let bytes = c.encode(&v, 0);
        assert_eq!(bytes.len(), 4 + 1 + 4 + 1);
        assert_eq!(bytes[4], 0b1101, "bits of chunk 0");
        assert_eq!(bytes[9], 0b00, "bits of chunk 1");
        let mut out = [0.0f32; 6];
        c.decode(&bytes, &mut out).unwrap();
        assert_eq!(out, [2.0, -2.0, 2.0, 2.0, -1.25, -1.25]);
        // Each value is off by at most its own magnitude plus the scale.
        for (x, y) in v.iter().zip(out) {
            let scale = y.abs();
            assert!((x - y).abs() <= x.abs() + scale);
        }
        // The chunk's sum of magnitudes is kept exactly.
        let kept: f32 = out[..4].iter().map(|v| v.abs()).sum();
        assert_eq!(kept, 8.0);
    }
}
