//! The GPUs holding each expert of a domain, [`Holders`]: a short list per expert, kept inline
//! (no allocation of its own) up to [`INLINE`] GPUs and in a vector of its own beyond, so that
//! filling a domain does not allocate once per expert.

use std::ops::Index;

/// Holders of one expert kept without an allocation of their own.
const INLINE: usize = 4;

/// For every expert of a domain, the GPUs holding at least one of its replicas. The order is
/// that of a `Vec` per expert with `push` and `swap_remove` (the search's results depend on
/// it only through ties, but it is kept exactly so that plans do not change).
#[derive(Clone, Debug)]
pub(crate) struct Holders {
    /// The first [`INLINE`] holders of each expert.
    inline: Vec<[u32; INLINE]>,
    /// Holders of each expert.
    len: Vec<u32>,
    /// Every holder of an expert that has more than [`INLINE`] (empty otherwise).
    spill: Vec<Vec<u32>>,
}

impl Holders {
    /// No holder for any of `experts` experts.
    pub fn new(experts: usize) -> Self {
        Holders {
            inline: vec![[0; INLINE]; experts],
            len: vec![0; experts],
            spill: vec![Vec::new(); experts],
        }
    }

    /// Appends GPU `g` to the holders of `e`.
    pub fn push(&mut self, e: usize, g: u32) {
        let n = self.len[e] as usize;
        if n < INLINE {
            self.inline[e][n] = g;
        } else {
            if n == INLINE {
                let spill = &mut self.spill[e];
                spill.clear();
                spill.extend_from_slice(&self.inline[e]);
            }
            self.spill[e].push(g);
        }
        self.len[e] += 1;
    }

    /// Removes GPU `g` from the holders of `e` as `Vec::swap_remove` would (the last holder
    /// takes its place). `g` must be a holder.
    pub fn remove(&mut self, e: usize, g: u32) {
        let n = self.len[e] as usize;
        let list: &mut [u32] = if n <= INLINE {
            &mut self.inline[e][..n]
        } else {
            &mut self.spill[e]
        };
        let i = list
            .iter()
            .position(|&h| h == g)
            .expect("the GPU is listed as a holder");
        list.swap(i, n - 1);
        if n > INLINE {
            let spill = &mut self.spill[e];
            spill.pop();
            if n - 1 == INLINE {
                self.inline[e].copy_from_slice(spill);
                spill.clear();
            }
        }
        self.len[e] -= 1;
    }
}

impl Index<usize> for Holders {
    type Output = [u32];

    /// The holders of expert `e`.
    #[inline]
    fn index(&self, e: usize) -> &[u32] {
        let n = self.len[e] as usize;
        if n <= INLINE {
            &self.inline[e][..n]
        } else {
            &self.spill[e]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_behave_as_a_vec_with_push_and_swap_remove() {
        let mut holders = Holders::new(3);
        let mut model: Vec<Vec<u32>> = vec![Vec::new(); 3];
        // A fixed pseudo-random sequence of pushes and removals crossing the inline size.
        let mut x: u64 = 12345;
        for _ in 0..4000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let e = (x >> 33) as usize % 3;
            let g = ((x >> 40) % 12) as u32;
            if let Some(i) = model[e].iter().position(|&h| h == g) {
                model[e].swap_remove(i);
                holders.remove(e, g);
            } else {
                model[e].push(g);
                holders.push(e, g);
            }
            for (e, list) in model.iter().enumerate() {
                assert_eq!(&holders[e], list.as_slice());
            }
        }
    }
}
