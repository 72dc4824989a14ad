//! Gradient compressors and their exact byte layouts.
//!
//! A [`Codec`] turns a run of gradient values into bytes and back. Four [`Compression`]s:
//!
//! | name | bytes for `n` values (chunk `c`, `k = ceil(n / c)` chunks) | per value (f32 grads, `c` = 2048) |
//! |---|---|---|
//! | `none` | `n * size_of::<T>()`: the values' little-endian bytes | 4 B |
//! | `bf16` | `2 n`: each value rounded to bfloat16 (nearest, ties to even), `u16` LE | 2 B |
//! | `int8` | `4 k + n`: per chunk an `f32` LE scale, then one byte per value (sign and a logarithmic level) | 1.002 B |
//! | `1bit` | `4 k + sum ceil(len_i / 8)`: per chunk an `f32` LE scale, then the sign bits | 0.127 B |
//!
//! Chunks are consecutive runs of `c` values (the last one may be shorter) and are laid out one
//! after the other, each as `[scale][payload]`:
//!
//! - **int8** ([`int8`]): `scale = max |x|` over the chunk (as `f32`); each value's byte is its
//!   sign (bit 7, 1 for negative) and a level `l` in 0..=127 (bits 0-6): 0 decodes to 0, `l >= 1`
//!   to `scale * 2^((l - 127) / 8)` (eight levels per octave). The level is the nearer of the two
//!   around `|x| / scale` (in value, not in logarithm) or, stochastically, either with the
//!   probability that makes the result unbiased (`u` uniform in [0, 1) from a seeded
//!   counter-based generator). Every value keeps its magnitude to within 4.3%, down to
//!   `2^-15.75` of the chunk's largest (a linear code sent everything below `max / 254` as 0,
//!   which AdamW did not forgive; four levels per octave, within 8.6%, left int8 behind on one
//!   seed: issue 31, docs/distributed.md). A chunk of zeros has scale 0.
//! - **1bit** ([`onebit`]): `scale = mean |x|` over the chunk (as `f32`); bit `j` of the chunk
//!   (byte `j / 8`, bit `j % 8`, least significant first) is 1 when `x_j >= 0`; decoded as
//!   `+scale` or `-scale`. Unused bits of the last byte are 0.
//! - **bf16** ([`bf16`]): the value as `f32`, rounded to the upper 16 bits (nearest, ties to
//!   even; NaN stays NaN).
//!
//! A chunk holding a NaN or an infinity gets a NaN scale, so an overflow is never hidden: it
//! decodes to NaN. Decoding checks the byte count against the expected value count first, so a
//! malformed message is an error, never a panic or an allocation of an announced size.

pub mod bf16;
pub mod int8;
pub mod onebit;

use std::fmt;
use std::str::FromStr;

use crate::GradFloat;

/// How gradients cross the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Compression {
    /// The values themselves (`f32` or `f64` little-endian).
    #[default]
    None,
    /// bfloat16: half the bytes of `f32`.
    Bf16,
    /// One byte per value (sign and logarithmic level) plus an `f32` scale per chunk.
    Int8,
    /// One bit per value (the sign) plus an `f32` scale (mean absolute value) per chunk.
    OneBit,
}

impl Compression {
    /// Every compression, in the order of their codes.
    pub const ALL: [Compression; 4] = [
        Compression::None,
        Compression::Bf16,
        Compression::Int8,
        Compression::OneBit,
    ];

    /// The flag value: `none`, `bf16`, `int8`, `1bit`.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Bf16 => "bf16",
            Compression::Int8 => "int8",
            Compression::OneBit => "1bit",
        }
    }

    /// The byte that names it in a message header.
    pub fn code(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Bf16 => 1,
            Compression::Int8 => 2,
            Compression::OneBit => 3,
        }
    }

    /// The compression of a header byte.
    pub fn from_code(code: u8) -> Option<Compression> {
        Compression::ALL.get(code as usize).copied()
    }

    /// Whether decoding loses information (every compression but `none`).
    pub fn is_lossy(self) -> bool {
        self != Compression::None
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A compression name that is not one of `none`, `bf16`, `int8`, `1bit`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown gradient compression {0:?}: use none, bf16, int8 or 1bit")]
pub struct UnknownCompression(pub String);

impl FromStr for Compression {
    type Err = UnknownCompression;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Compression::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| UnknownCompression(s.to_string()))
    }
}

/// How int8 rounds a value to one of its levels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Rounding {
    /// To the nearer of the two levels around it (error at most 4.3% of the value).
    #[default]
    Nearest,
    /// To the upper level with probability `(x - lower) / (upper - lower)`: unbiased, error
    /// below one level's spacing. The uniform number `u`
    /// comes from a counter-based generator keyed by `seed`, the message and the value's index,
    /// so the result never depends on timing or thread count.
    Stochastic {
        /// The generator's seed.
        seed: u64,
    },
}

/// A message body that does not match the expected layout.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{compression} data for {values} values must be {expected} bytes, got {got}")]
pub struct CodecError {
    /// The compression being decoded.
    pub compression: Compression,
    /// The number of values expected.
    pub values: usize,
    /// The bytes that layout needs.
    pub expected: String,
    /// The bytes that arrived.
    pub got: usize,
}

/// A compressor: what, how many values share a scale, how int8 rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Codec {
    /// The format.
    pub compression: Compression,
    /// Values per scale (int8, 1bit); at least 1.
    pub chunk_values: usize,
    /// int8's rounding.
    pub rounding: Rounding,
}

impl Codec {
    /// The number of bytes `values` values of type `T` encode to (`None` on overflow).
    pub fn encoded_len<T: GradFloat>(&self, values: usize) -> Option<usize> {
        let chunks = values.div_ceil(self.chunk_values.max(1));
        match self.compression {
            Compression::None => values.checked_mul(T::BYTES),
            Compression::Bf16 => values.checked_mul(2),
            Compression::Int8 => chunks.checked_mul(4)?.checked_add(values),
            Compression::OneBit => {
                let c = self.chunk_values.max(1);
                let full = values / c;
                let last = values % c;
                let bits = full
                    .checked_mul(c.div_ceil(8))?
                    .checked_add(last.div_ceil(8))?;
                chunks.checked_mul(4)?.checked_add(bits)
            }
        }
    }

    /// Encodes `values`; `stream` names the message (it seeds stochastic rounding, so two
    /// messages never share random numbers).
    pub fn encode<T: GradFloat>(&self, values: &[T], stream: u64) -> Vec<u8> {
        let c = self.chunk_values.max(1);
        let mut out = Vec::with_capacity(self.encoded_len::<T>(values.len()).unwrap_or(0));
        match self.compression {
            Compression::None => {
                for &v in values {
                    v.put_le(&mut out);
                }
            }
            Compression::Bf16 => bf16::encode(values, &mut out),
            Compression::Int8 => {
                for (i, chunk) in values.chunks(c).enumerate() {
                    int8::encode_chunk(chunk, self.rounding, stream, i * c, &mut out);
                }
            }
            Compression::OneBit => {
                for chunk in values.chunks(c) {
                    onebit::encode_chunk(chunk, &mut out);
                }
            }
        }
        out
    }

    /// Decodes `bytes` into `out`, whose length is the number of values expected.
    pub fn decode<T: GradFloat>(&self, bytes: &[u8], out: &mut [T]) -> Result<(), CodecError> {
        let expected = self.encoded_len::<T>(out.len());
        if expected != Some(bytes.len()) {
            return Err(CodecError {
                compression: self.compression,
                values: out.len(),
                expected: expected.map_or("too many".into(), |n| n.to_string()),
                got: bytes.len(),
            });
        }
        let c = self.chunk_values.max(1);
        match self.compression {
            Compression::None => {
                for (v, b) in out.iter_mut().zip(bytes.chunks_exact(T::BYTES)) {
                    *v = T::get_le(b);
                }
            }
            Compression::Bf16 => bf16::decode(bytes, out),
            Compression::Int8 => {
                let mut at = 0;
                for chunk in out.chunks_mut(c) {
                    at += int8::decode_chunk(&bytes[at..], chunk);
                }
            }
            Compression::OneBit => {
                let mut at = 0;
                for chunk in out.chunks_mut(c) {
                    at += onebit::decode_chunk(&bytes[at..], chunk);
                }
            }
        }
        Ok(())
    }
}

/// Reads the `f32` scale at the start of a chunk.
fn scale_at(bytes: &[u8]) -> f32 {
    f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec(compression: Compression, chunk_values: usize) -> Codec {
        Codec {
            compression,
            chunk_values,
            rounding: Rounding::Nearest,
        }
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for c in Compression::ALL {
            assert_eq!(c.name().parse::<Compression>(), Ok(c));
            assert_eq!(Compression::from_code(c.code()), Some(c));
        }
        let err = "2bit".parse::<Compression>().unwrap_err();
        assert!(
            err.to_string().contains("none, bf16, int8 or 1bit"),
            "{err}"
        );
        assert_eq!(Compression::from_code(4), None);
    }

    #[test]
    fn encoded_sizes_follow_the_documented_layout() {
        let values: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.01).collect();
        for (c, chunk, expected) in [
            (Compression::None, 64, 4000),
            (Compression::Bf16, 64, 2000),
            (Compression::Int8, 64, 16 * 4 + 1000),
            // 15 full chunks of 64 (8 bytes of bits each) and one of 40 (5 bytes).
            (Compression::OneBit, 64, 16 * 4 + 15 * 8 + 5),
            (Compression::OneBit, 3, 334 * 4 + 333 + 1),
        ] {
            let codec = codec(c, chunk);
            assert_eq!(codec.encoded_len::<f32>(1000), Some(expected), "{c}");
            assert_eq!(codec.encode(&values, 0).len(), expected, "{c}");
        }
        assert_eq!(codec(Compression::None, 8).encoded_len::<f64>(10), Some(80));
        assert_eq!(
            codec(Compression::None, 8).encoded_len::<f64>(usize::MAX),
            None
        );
    }

    #[test]
    fn a_body_of_the_wrong_size_is_an_error_not_a_panic() {
        for c in Compression::ALL {
            let codec = codec(c, 16);
            let bytes = codec.encode(&[1.0f32; 40], 0);
            let mut out = [0.0f32; 40];
            for cut in [0, 1, bytes.len() - 1] {
                let err = codec.decode(&bytes[..cut], &mut out).unwrap_err();
                assert_eq!(err.got, cut);
            }
            let mut long = bytes.clone();
            long.push(0);
            assert!(codec.decode(&long, &mut out).is_err());
            codec.decode(&bytes, &mut out).unwrap();
        }
    }

    #[test]
    fn none_is_exact_for_both_element_types() {
        let v32 = [1.5f32, -0.0, f32::MIN_POSITIVE, 3.0e38];
        let v64 = [1.0f64 / 3.0, -2.5e-300, 7.0];
        let c = codec(Compression::None, 2);
        let mut o32 = [0.0f32; 4];
        let mut o64 = [0.0f64; 3];
        c.decode(&c.encode(&v32, 0), &mut o32).unwrap();
        c.decode(&c.encode(&v64, 0), &mut o64).unwrap();
        assert_eq!(o32.map(f32::to_bits), v32.map(f32::to_bits));
        assert_eq!(o64, v64);
    }
}
