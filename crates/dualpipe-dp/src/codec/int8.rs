//! int8: per chunk an `f32` scale (`max |x| / 127`), then one `i8` per value.

use super::{scale_at, Rounding};
use crate::GradFloat;

/// Appends one chunk: its scale, then each value as `i8`. `first` is the index of the chunk's
/// first value in the message (it keys stochastic rounding).
pub fn encode_chunk<T: GradFloat>(
    chunk: &[T],
    rounding: Rounding,
    stream: u64,
    first: usize,
    out: &mut Vec<u8>,
) {
    let mut max = 0.0f64;
    let mut finite = true;
    for &v in chunk {
        let a = v.to_f64().abs();
        finite &= a.is_finite();
        if a > max {
            max = a;
        }
    }
    let scale = if finite {
        (max / 127.0) as f32
    } else {
        f32::NAN
    };
    out.extend_from_slice(&scale.to_le_bytes());
    let s = scale as f64;
    for (j, &v) in chunk.iter().enumerate() {
        let q = if s > 0.0 && s.is_finite() {
            let x = v.to_f64() / s;
            let r = match rounding {
                Rounding::Nearest => x.round(),
                Rounding::Stochastic { seed } => (x + uniform(seed, stream, first + j)).floor(),
            };
            r.clamp(-127.0, 127.0) as i8
        } else {
            0
        };
        out.push(q as u8);
    }
}

/// Decodes one chunk of `out.len()` values from the start of `bytes`; returns the bytes used.
pub fn decode_chunk<T: GradFloat>(bytes: &[u8], out: &mut [T]) -> usize {
    let scale = scale_at(bytes) as f64;
    let n = out.len();
    for (v, &b) in out.iter_mut().zip(&bytes[4..4 + n]) {
        *v = T::from_f64((b as i8) as f64 * scale);
    }
    4 + n
}

/// A uniform number in [0, 1) for value `index` of message `stream`: SplitMix64 over the
/// three keys, so it depends on nothing but them.
pub fn uniform(seed: u64, stream: u64, index: usize) -> f64 {
    let mut z = seed
        ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (index as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::super::{Codec, Compression};
    use super::*;

    fn values(n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| ((i as f64 * 0.7).sin() * 3.0).powi(3) * 1e-3)
            .collect()
    }

    fn codec(rounding: Rounding) -> Codec {
        Codec {
            compression: Compression::Int8,
            chunk_values: 64,
            rounding,
        }
    }

    #[test]
    fn nearest_is_within_half_a_step_of_each_chunk() {
        let v = values(1000);
        let c = codec(Rounding::Nearest);
        let bytes = c.encode(&v, 0);
        let mut out = vec![0.0f64; v.len()];
        c.decode(&bytes, &mut out).unwrap();
        for (k, (chunk, back)) in v.chunks(64).zip(out.chunks(64)).enumerate() {
            let max = chunk.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let step = max / 127.0;
            for (x, y) in chunk.iter().zip(back) {
                assert!(
                    (x - y).abs() <= step * 0.5 * (1.0 + 1e-6),
                    "chunk {k}: {x} {y}"
                );
            }
        }
    }

    #[test]
    fn stochastic_rounding_is_within_a_step_unbiased_and_seeded() {
        let v = vec![0.3f64, -0.3, 1.0];
        let mut mean = [0.0f64; 3];
        let trials = 4000;
        for t in 0..trials {
            let c = codec(Rounding::Stochastic { seed: 7 });
            let mut out = [0.0f64; 3];
            c.decode(&c.encode(&v, t), &mut out).unwrap();
            for i in 0..3 {
                assert!((out[i] - v[i]).abs() < 1.0 / 127.0 + 1e-9);
                mean[i] += out[i] / trials as f64;
            }
        }
        // 0.3 is 38.1 steps: it rounds to 38 or 39 steps, 39 one time in ten.
        for i in 0..3 {
            assert!(
                (mean[i] - v[i]).abs() < 2e-4,
                "{i}: {} vs {}",
                mean[i],
                v[i]
            );
        }
        let c = codec(Rounding::Stochastic { seed: 7 });
        assert_eq!(c.encode(&v, 5), c.encode(&v, 5));
        let other = codec(Rounding::Stochastic { seed: 8 });
        let many = values(500);
        assert_ne!(c.encode(&many, 5), other.encode(&many, 5));
    }

    #[test]
    fn zeros_and_non_finite_values() {
        let c = codec(Rounding::Nearest);
        let mut out = [1.0f32; 3];
        c.decode(&c.encode(&[0.0f32; 3], 0), &mut out).unwrap();
        assert_eq!(out, [0.0; 3]);
        c.decode(&c.encode(&[1.0f32, f32::INFINITY, 2.0], 0), &mut out)
            .unwrap();
        assert!(out.iter().all(|v| v.is_nan()), "{out:?}");
    }
}
