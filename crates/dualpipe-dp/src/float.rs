//! The element types a gradient can have: `f32` and `f64`.

use std::fmt::Debug;
use std::ops::{Add, Div, Sub};

/// A gradient element: `f32` or `f64`.
///
/// The exchange adds, subtracts and divides in this type (so an `f64` run sums in `f64`), and
/// moves values uncompressed as their little-endian bytes.
pub trait GradFloat:
    Copy
    + Default
    + PartialEq
    + PartialOrd
    + Debug
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Div<Output = Self>
{
    /// Bytes of one value on the wire when uncompressed.
    const BYTES: usize;
    /// `"f32"` or `"f64"`.
    const NAME: &'static str;
    /// Zero.
    const ZERO: Self;

    /// The value as `f64` (exact).
    fn to_f64(self) -> f64;
    /// The nearest value to `v` (round to nearest even).
    fn from_f64(v: f64) -> Self;
    /// The value as `f32` (rounded to nearest even for `f64`).
    fn to_f32(self) -> f32;
    /// `n` as a value (the divisor of a mean).
    fn from_usize(n: usize) -> Self;
    /// Appends the little-endian bytes.
    fn put_le(self, out: &mut Vec<u8>);
    /// Reads one value from exactly [`Self::BYTES`] little-endian bytes.
    fn get_le(bytes: &[u8]) -> Self;
}

impl GradFloat for f32 {
    const BYTES: usize = 4;
    const NAME: &'static str = "f32";
    const ZERO: Self = 0.0;

    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_usize(n: usize) -> Self {
        n as f32
    }
    fn put_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get_le(bytes: &[u8]) -> Self {
        f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

impl GradFloat for f64 {
    const BYTES: usize = 8;
    const NAME: &'static str = "f64";
    const ZERO: Self = 0.0;

    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn from_usize(n: usize) -> Self {
        n as f64
    }
    fn put_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get_le(bytes: &[u8]) -> Self {
        f64::from_le_bytes([
            bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
        ])
    }
}
