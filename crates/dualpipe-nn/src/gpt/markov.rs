//! [`MarkovSource`]: a seeded order-2 Markov text whose entropy rate is known exactly, so a
//! language model's validation loss can be scored as its distance from the best possible.
//!
//! The alphabet is [`ALPHABET`] (16 bytes); each context of the two previous bytes allows
//! [`SUCCESSORS`] next bytes with seeded weights. The entropy rate is
//! `H = -Σ_ctx π(ctx) Σ_x p(x | ctx) ln p(x | ctx)` under the long-run frequency `π` of the
//! contexts, computed by averaging the chain's distribution from its starting context.

use rand::Rng;

use crate::rng::{self, Purpose};

/// The source's bytes: a space and fifteen frequent English letters.
pub const ALPHABET: &[u8; 16] = b" etaoinsrhldcumf";
/// Next bytes each context allows.
pub const SUCCESSORS: usize = 4;
/// Power-iteration steps averaged for the long-run context frequencies.
const ITERATIONS: usize = 4000;

/// A seeded order-2 Markov source over [`ALPHABET`].
#[derive(Clone, Debug, PartialEq)]
pub struct MarkovSource {
    /// `next[c][k]`: the `k`-th allowed successor (an alphabet index) of context `c`
    /// (`c = 16·a + b` for the two previous bytes `a`, `b`) and its probability.
    next: Vec<[(usize, f64); SUCCESSORS]>,
}

const K: usize = ALPHABET.len();

impl MarkovSource {
    /// The source of `seed`: each context's successors are distinct alphabet indices with
    /// weights drawn uniformly from `[0.05, 1)`, normalised.
    pub fn new(seed: u64) -> Self {
        let mut r = rng::stream(seed, Purpose::Text, 8, 0);
        let next = (0..K * K)
            .map(|_| {
                let mut chosen = [(0usize, 0f64); SUCCESSORS];
                let mut n = 0;
                while n < SUCCESSORS {
                    let x = r.random_range(0..K);
                    if chosen[..n].iter().all(|&(y, _)| y != x) {
                        chosen[n] = (x, r.random_range(0.05..1.0));
                        n += 1;
                    }
                }
                let total: f64 = chosen.iter().map(|&(_, w)| w).sum();
                chosen.map(|(x, w)| (x, w / total))
            })
            .collect();
        MarkovSource { next }
    }

    /// `len` bytes of the source, starting from the context of two spaces.
    pub fn text(&self, seed: u64, len: usize) -> Vec<u8> {
        let mut r = rng::stream(seed, Purpose::Text, 9, 0);
        let mut context = 0usize;
        let mut out = Vec::with_capacity(len);
        for _ in 0..len {
            let u: f64 = r.random();
            let options = &self.next[context];
            let mut acc = 0.0;
            let mut pick = options[SUCCESSORS - 1].0;
            for &(x, p) in options {
                acc += p;
                if u < acc {
                    pick = x;
                    break;
                }
            }
            out.push(ALPHABET[pick]);
            context = (context % K) * K + pick;
        }
        out
    }

    /// The entropy rate in nats per byte: the least mean next-byte cross-entropy any model
    /// reaches on a long text of the source (one that sees the two previous bytes).
    pub fn entropy_rate(&self) -> f64 {
        let mut dist = vec![0.0; K * K];
        dist[0] = 1.0;
        let mut average = vec![0.0; K * K];
        for _ in 0..ITERATIONS {
            let mut step = vec![0.0; K * K];
            for (c, &mass) in dist.iter().enumerate() {
                if mass == 0.0 {
                    continue;
                }
                for &(x, p) in &self.next[c] {
                    step[(c % K) * K + x] += mass * p;
                }
            }
            dist = step;
            for (a, d) in average.iter_mut().zip(&dist) {
                *a += d / ITERATIONS as f64;
            }
        }
        average
            .iter()
            .zip(&self.next)
            .map(|(&pi, options)| {
                pi * options
                    .iter()
                    .map(|&(_, p)| if p > 0.0 { -p * p.ln() } else { 0.0 })
                    .sum::<f64>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_seeded_and_its_empirical_entropy_is_the_rate() {
        let source = MarkovSource::new(3);
        assert_eq!(source, MarkovSource::new(3));
        assert_ne!(source, MarkovSource::new(4));
        let text = source.text(3, 200_000);
        assert_eq!(text, source.text(3, 200_000));
        assert!(text.iter().all(|b| ALPHABET.contains(b)));
        // The mean surprisal of the text under the true model converges to the entropy rate.
        let index = |b: u8| ALPHABET.iter().position(|&a| a == b).unwrap();
        let mut context = 0;
        let mut total = 0.0;
        for &b in &text {
            let x = index(b);
            let p = source.next[context]
                .iter()
                .find(|&&(y, _)| y == x)
                .map(|&(_, p)| p)
                .expect("every byte is an allowed successor");
            total -= p.ln();
            context = (context % K) * K + x;
        }
        let empirical = total / text.len() as f64;
        let rate = source.entropy_rate();
        assert!(rate > 0.5 && rate < (SUCCESSORS as f64).ln(), "{rate}");
        assert!((empirical - rate).abs() < 0.02, "{empirical} vs {rate}");
    }
}
