//! The GPUs of a domain that still have room while it is filled, [`Ready`], ordered by (load,
//! index) so that the least-loaded one that may take a replica is found without scanning every
//! GPU: a sorted vector up to [`SORTED_MAX_GPUS`] GPUs (an update moves at most that many
//! entries, which costs less than a tree's allocations), a tree beyond.

use std::collections::BTreeSet;

use super::Total;

/// Up to this many GPUs the ready GPUs are kept in a sorted vector.
pub(super) const SORTED_MAX_GPUS: usize = 4096;

/// A GPU with room, keyed by its load then its index.
pub(super) type Key = (Total, usize);

/// GPUs with room, by (load, index).
pub(super) enum Ready {
    /// Sorted ascending, no duplicates.
    Sorted(Vec<Key>),
    /// The same set as a tree.
    Tree(BTreeSet<Key>),
}

impl Ready {
    /// The GPUs `keys` (in any order), sorted or in a tree.
    pub fn new(keys: impl Iterator<Item = Key>, sorted: bool) -> Self {
        if sorted {
            let mut keys: Vec<Key> = keys.collect();
            keys.sort_unstable();
            Ready::Sorted(keys)
        } else {
            Ready::Tree(keys.collect())
        }
    }

    /// Removes `key` (which must be present).
    pub fn remove(&mut self, key: &Key) {
        match self {
            Ready::Sorted(keys) => {
                if let Ok(i) = keys.binary_search(key) {
                    keys.remove(i);
                }
            }
            Ready::Tree(keys) => {
                keys.remove(key);
            }
        }
    }

    /// Adds `key`.
    pub fn insert(&mut self, key: Key) {
        match self {
            Ready::Sorted(keys) => {
                if let Err(i) = keys.binary_search(&key) {
                    keys.insert(i, key);
                }
            }
            Ready::Tree(keys) => {
                keys.insert(key);
            }
        }
    }

    /// The first GPU in (load, index) order for which `ok` holds.
    pub fn first(&self, mut ok: impl FnMut(usize) -> bool) -> Option<usize> {
        match self {
            Ready::Sorted(keys) => keys.iter().map(|&(_, g)| g).find(|&g| ok(g)),
            Ready::Tree(keys) => keys.iter().map(|&(_, g)| g).find(|&g| ok(g)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sorted_vector_and_the_tree_agree() {
        let mut x: u64 = 99;
        let mut next = move || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            x >> 33
        };
        let mut loads: Vec<f64> = (0..40).map(|_| (next() % 7) as f64).collect();
        let keys = |loads: &[f64]| (0..40).map(|g| (Total(loads[g]), g)).collect::<Vec<_>>();
        let mut sorted = Ready::new(keys(&loads).into_iter(), true);
        let mut tree = Ready::new(keys(&loads).into_iter(), false);
        for _ in 0..2000 {
            let g = next() as usize % 40;
            let old = (Total(loads[g]), g);
            sorted.remove(&old);
            tree.remove(&old);
            loads[g] += (next() % 3) as f64;
            sorted.insert((Total(loads[g]), g));
            tree.insert((Total(loads[g]), g));
            let m = next() as usize % 5;
            assert_eq!(sorted.first(|h| h % 5 == m), tree.first(|h| h % 5 == m));
        }
    }
}
