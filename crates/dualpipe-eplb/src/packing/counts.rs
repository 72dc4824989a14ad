//! Replica counts per (GPU, expert) of one domain: a dense table while the domain is small, a
//! hash map of the non-zero cells when the GPU x expert table would be large (16,384 experts on
//! 16,384 GPUs would need 1 GiB dense, nearly all of it zero).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Above this many GPU x expert cells the counts are kept sparse.
const DENSE_MAX_CELLS: usize = 1 << 22;

/// Replicas of expert `e` on GPU `g`, for every pair of a domain.
#[derive(Clone, Debug)]
pub(crate) enum Counts {
    /// `g * experts + e`.
    Dense { experts: usize, cells: Vec<u32> },
    /// Only the non-zero cells, keyed by `g * experts + e`.
    Sparse {
        experts: usize,
        cells: HashMap<u64, u32, BuildHasherDefault<CellHasher>>,
    },
}

impl Counts {
    /// All zero, for `gpus` GPUs and `experts` experts.
    pub fn new(gpus: usize, experts: usize) -> Self {
        Self::with_limit(gpus, experts, DENSE_MAX_CELLS)
    }

    fn with_limit(gpus: usize, experts: usize, dense_max: usize) -> Self {
        match gpus.checked_mul(experts) {
            Some(cells) if cells <= dense_max => Counts::Dense {
                experts,
                cells: vec![0; cells],
            },
            _ => Counts::Sparse {
                experts,
                cells: HashMap::default(),
            },
        }
    }

    /// Replicas of `e` on `g`.
    #[inline]
    pub fn get(&self, g: usize, e: usize) -> u32 {
        match self {
            Counts::Dense { experts, cells } => cells[g * experts + e],
            Counts::Sparse { experts, cells } => {
                cells.get(&((g * experts + e) as u64)).copied().unwrap_or(0)
            }
        }
    }

    /// Adds one replica of `e` on `g`; returns the new count.
    pub fn add(&mut self, g: usize, e: usize) -> u32 {
        match self {
            Counts::Dense { experts, cells } => {
                let c = &mut cells[g * *experts + e];
                *c += 1;
                *c
            }
            Counts::Sparse { experts, cells } => {
                let c = cells.entry((g * *experts + e) as u64).or_insert(0);
                *c += 1;
                *c
            }
        }
    }

    /// Removes one replica of `e` from `g` (which must hold one); returns the new count.
    pub fn remove(&mut self, g: usize, e: usize) -> u32 {
        match self {
            Counts::Dense { experts, cells } => {
                let c = &mut cells[g * *experts + e];
                *c -= 1;
                *c
            }
            Counts::Sparse { experts, cells } => {
                let key = (g * *experts + e) as u64;
                let c = cells.get_mut(&key).expect("the GPU holds the expert");
                *c -= 1;
                let left = *c;
                if left == 0 {
                    cells.remove(&key);
                }
                left
            }
        }
    }
}

/// A multiplicative hash of a cell index (the keys are small integers, not attacker-chosen:
/// SipHash's protection is not needed and costs more than the lookup).
#[derive(Default)]
pub(crate) struct CellHasher(u64);

impl Hasher for CellHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(b) ^ (self.0 >> 56);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_sparse_count_alike() {
        let mut dense = Counts::with_limit(5, 7, usize::MAX);
        let mut sparse = Counts::with_limit(5, 7, 0);
        assert!(matches!(dense, Counts::Dense { .. }));
        assert!(matches!(sparse, Counts::Sparse { .. }));
        let ops = [(0, 0), (4, 6), (4, 6), (2, 3), (0, 0), (4, 6)];
        for &(g, e) in &ops {
            assert_eq!(dense.add(g, e), sparse.add(g, e));
        }
        assert_eq!(dense.remove(4, 6), 2);
        assert_eq!(sparse.remove(4, 6), 2);
        assert_eq!(sparse.remove(2, 3), 0);
        dense.remove(2, 3);
        for g in 0..5 {
            for e in 0..7 {
                assert_eq!(dense.get(g, e), sparse.get(g, e), "gpu {g} expert {e}");
            }
        }
        assert_eq!(sparse.get(0, 0), 2);
        if let Counts::Sparse { cells, .. } = &sparse {
            assert_eq!(cells.len(), 2, "zero cells are dropped");
        }
    }

    #[test]
    fn a_huge_domain_is_sparse() {
        assert!(matches!(Counts::new(16_384, 16_384), Counts::Sparse { .. }));
        assert!(matches!(Counts::new(64, 256), Counts::Dense { .. }));
    }
}
