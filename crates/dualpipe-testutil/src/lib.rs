//! Helpers the integration tests of `dualpipe-nn` and `dualpipe-train` share: seeded f64
//! tensors, their values, and relative errors between them.
#![warn(missing_docs)]

use candle_core::{DType, Device, Tensor};
use dualpipe_nn::rng::{stream, uniform, Purpose};
use dualpipe_nn::stage::to_f64_vec;

/// A seeded f64 tensor with entries uniform in [-1, 1).
pub fn rand_tensor(seed: u64, dims: &[usize]) -> Tensor {
    let count = dims.iter().product();
    let mut rng = stream(seed, Purpose::Inputs, 1000, 0);
    Tensor::from_vec(uniform(&mut rng, count, 1.0), dims, &Device::Cpu).unwrap()
}

/// Flat f64 values of a tensor.
pub fn values(t: &Tensor) -> Vec<f64> {
    to_f64_vec(t).unwrap()
}

/// A tensor of the same shape as `like` holding `v` (f64).
pub fn from_values(v: Vec<f64>, like: &Tensor) -> Tensor {
    Tensor::from_vec(v, like.dims(), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
}

/// max |a - b| / max |b| (0 when both are zero).
pub fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    let scale = b.iter().map(|y| y.abs()).fold(0.0, f64::max);
    if diff == 0.0 {
        0.0
    } else {
        diff / scale
    }
}

/// Asserts `rel_err(a, b) <= tol` with a message naming `what`.
pub fn assert_close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes differ");
    let e = rel_err(&values(a), &values(b));
    assert!(e <= tol, "{what}: relative error {e:e} > {tol:e}");
}

/// Scalar relative error.
pub fn scalar_rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
    }
}
