//! Seeded random streams: every random number of the model and the data comes from a stream
//! named by (seed, purpose, a, b), so it depends only on the seed and the shapes, never on the
//! schedule, the rank count or the order in which things are drawn.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What a random stream is used for; part of the stream's seed so streams never overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Purpose {
    /// Parameters of student model stage `a`.
    StageParams = 1,
    /// Parameters of the teacher network.
    Teacher = 2,
    /// Inputs of step `a`, micro-batch `b`.
    Inputs = 3,
    /// Tensor `a` of a GPT model (in the order of `gpt::tensor_names`).
    GptParams = 4,
    /// Text data: the synthetic task's problems (`a` = split) or shuffled windows (`a` = step,
    /// `b` = micro-batch).
    Text = 5,
}

/// The random stream for (`seed`, `purpose`, `a`, `b`): ChaCha8 seeded with the four words in
/// little-endian order.
pub fn stream(seed: u64, purpose: Purpose, a: u64, b: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    for (i, word) in [seed, purpose as u64, a, b].into_iter().enumerate() {
        key[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

/// `count` values drawn uniformly from `[-bound, bound)`.
pub fn uniform(rng: &mut ChaCha8Rng, count: usize, bound: f64) -> Vec<f64> {
    (0..count)
        .map(|_| (rng.random::<f64>() * 2.0 - 1.0) * bound)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a = uniform(&mut stream(7, Purpose::Inputs, 1, 2), 8, 1.0);
        let b = uniform(&mut stream(7, Purpose::Inputs, 1, 2), 8, 1.0);
        let c = uniform(&mut stream(7, Purpose::Inputs, 2, 1), 8, 1.0);
        let d = uniform(&mut stream(7, Purpose::Teacher, 1, 2), 8, 1.0);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
    }
}
