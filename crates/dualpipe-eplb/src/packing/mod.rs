//! Placement inside one domain (a node, or every GPU for the global policy): duplicate-free
//! packing of replicas onto GPUs ([`fill`]) and the bounded local search that improves it
//! ([`search`]; [`reduce`] brings moved replicas back).
//!
//! A domain owns `gpus` consecutive GPUs with `slots` slots each and a fixed set of logical
//! experts; every one of those experts gets at least one replica in the domain and no replica of
//! another expert lands there. Each replica of expert `e` serves `load[e] / count[e]` tokens, and a
//! GPU's load is the sum over its slots.
//!
//! Duplicate-free means: a GPU holds at most `ceil(count[e] / gpus)` replicas of `e`, which is one
//! unless the expert has more replicas than the domain has GPUs.

mod counts;
mod fill;
mod holders;
mod ready;
mod reduce;
mod score;
mod search;

use counts::Counts;
use holders::Holders;
pub(crate) use search::SearchLimits;

/// Whether a value is exactly "no expert" in a slot being filled.
const EMPTY: usize = usize::MAX;

/// The state of one domain while it is being packed.
#[derive(Clone, Debug)]
pub(crate) struct Domain {
    /// Number of GPUs in the domain.
    pub gpus: usize,
    /// Slots per GPU.
    pub slots: usize,
    /// Load of each local expert.
    pub load: Vec<f64>,
    /// Local expert in each slot, `gpu * slots + slot`; `EMPTY` while unfilled.
    pub slot: Vec<usize>,
    /// Replicas of each local expert.
    pub count: Vec<usize>,
    /// Replicas of every expert on every GPU.
    on: Counts,
    /// The GPUs holding at least one replica of each expert (in no particular order).
    holders: Holders,
    /// Whether expert `e` was on GPU `g` before this rebalance, at `g * experts + e`; empty
    /// when no expert was on any GPU before.
    orig: Vec<bool>,
    /// Slack (absolute load) within which a GPU that held the expert before wins a packing tie.
    prefer_slack: f64,
    /// Whether any expert was on any GPU before (else no packing tie goes to a previous GPU).
    any_orig: bool,
    /// The GPUs each expert was on before, ascending (empty lists without `any_orig`).
    orig_gpus: Vec<Vec<u32>>,
    /// Empty slots of each GPU.
    free: Vec<usize>,
    /// Per GPU, a slot index at or below its first empty slot (every slot before it is full).
    first_empty: Vec<usize>,
}

/// An `f64` ordered by [`f64::total_cmp`], for heaps and ordered sets.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Total(f64);

impl Eq for Total {}

impl PartialOrd for Total {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Total {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl Domain {
    /// An empty domain. `orig[g * experts + e]` says whether expert `e` was on GPU `g` before
    /// (pass all `false` when there is no previous placement).
    pub fn new(
        gpus: usize,
        slots: usize,
        load: Vec<f64>,
        orig: Vec<bool>,
        near_equal: f64,
    ) -> Self {
        debug_assert_eq!(orig.len(), gpus * load.len());
        let any_orig = orig.contains(&true);
        let orig = if any_orig { orig } else { Vec::new() };
        Self::with_orig(gpus, slots, load, orig, any_orig, near_equal)
    }

    /// An empty domain without a previous placement (no expert was on any GPU before): no
    /// GPU x expert table is allocated for it.
    pub fn fresh(gpus: usize, slots: usize, load: Vec<f64>, near_equal: f64) -> Self {
        Self::with_orig(gpus, slots, load, Vec::new(), false, near_equal)
    }

    fn with_orig(
        gpus: usize,
        slots: usize,
        load: Vec<f64>,
        orig: Vec<bool>,
        any_orig: bool,
        near_equal: f64,
    ) -> Self {
        let experts = load.len();
        let total: f64 = load.iter().sum();
        let mut orig_gpus = vec![Vec::new(); experts];
        if any_orig {
            for (i, _) in orig.iter().enumerate().filter(|&(_, &was)| was) {
                orig_gpus[i % experts].push((i / experts) as u32);
            }
        }
        Domain {
            orig_gpus,
            gpus,
            slots,
            count: vec![0; experts],
            on: Counts::new(gpus, experts),
            holders: Holders::new(experts),
            slot: vec![EMPTY; gpus * slots],
            any_orig,
            orig,
            prefer_slack: near_equal * total / gpus as f64,
            load,
            free: vec![slots; gpus],
            first_empty: (0..gpus).map(|g| g * slots).collect(),
        }
    }

    fn experts(&self) -> usize {
        self.load.len()
    }

    /// Puts expert `e` into slot `s` (which must be empty).
    pub fn put(&mut self, s: usize, e: usize) {
        debug_assert_eq!(self.slot[s], EMPTY);
        let g = s / self.slots;
        self.slot[s] = e;
        self.count[e] += 1;
        if self.on.add(g, e) == 1 {
            self.holders.push(e, g as u32);
        }
        self.free[g] -= 1;
        let end = (g + 1) * self.slots;
        while self.first_empty[g] < end && self.slot[self.first_empty[g]] != EMPTY {
            self.first_empty[g] += 1;
        }
    }

    /// Empties slot `s`.
    fn take(&mut self, s: usize) -> usize {
        let e = self.slot[s];
        debug_assert_ne!(e, EMPTY);
        let g = s / self.slots;
        self.slot[s] = EMPTY;
        self.count[e] -= 1;
        if self.on.remove(g, e) == 0 {
            self.holders.remove(e, g as u32);
        }
        self.free[g] += 1;
        self.first_empty[g] = self.first_empty[g].min(s);
        e
    }

    /// Replicas of `e` on GPU `g`.
    pub fn on(&self, g: usize, e: usize) -> u32 {
        self.on.get(g, e)
    }

    /// Whether expert `e` was on GPU `g` before this rebalance.
    fn was_on(&self, g: usize, e: usize) -> bool {
        self.any_orig && self.orig[g * self.experts() + e]
    }

    /// How many replicas of `e` one GPU may hold when `e` has `count` replicas.
    fn cap(&self, count: usize) -> u32 {
        count.div_ceil(self.gpus).max(1) as u32
    }

    /// Per-replica load of `e` at `count` replicas.
    fn share(&self, e: usize, count: usize) -> f64 {
        if count == 0 {
            0.0
        } else {
            self.load[e] / count as f64
        }
    }

    /// Load of every GPU.
    pub fn gpu_loads(&self) -> Vec<f64> {
        let mut loads = vec![0.0; self.gpus];
        for (s, &e) in self.slot.iter().enumerate() {
            if e != EMPTY {
                loads[s / self.slots] += self.share(e, self.count[e]);
            }
        }
        loads
    }

    /// The hottest GPU's load.
    pub fn max_load(&self) -> f64 {
        self.gpu_loads().into_iter().fold(0.0, f64::max)
    }

    /// Slots whose expert was not on that GPU before.
    pub fn moves(&self) -> usize {
        self.slot
            .iter()
            .enumerate()
            .filter(|&(s, &e)| e != EMPTY && !self.was_on(s / self.slots, e))
            .count()
    }

    /// Move cost of having `e` on GPU `g`.
    fn cost(&self, g: usize, e: usize, free: bool) -> i64 {
        i64::from(!free && !self.was_on(g, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A domain without a previous placement.
    pub(super) fn domain(loads: &[f64], gpus: usize, slots: usize) -> Domain {
        Domain::new(
            gpus,
            slots,
            loads.to_vec(),
            vec![false; gpus * loads.len()],
            0.0,
        )
    }

    /// Asserts that no GPU holds more replicas of an expert than its cap, and that the tables
    /// agree with the slots.
    pub(super) fn assert_capped(d: &Domain) {
        for g in 0..d.gpus {
            for e in 0..d.experts() {
                let here = (g * d.slots..(g + 1) * d.slots)
                    .filter(|&s| d.slot[s] == e)
                    .count() as u32;
                assert_eq!(d.on(g, e), here, "gpu {g} expert {e}");
                assert_eq!(
                    d.holders[e].contains(&(g as u32)),
                    here > 0,
                    "holders of {e}"
                );
                assert!(d.on(g, e) <= d.cap(d.count[e]), "gpu {g} expert {e}");
            }
        }
    }

    #[test]
    fn put_and_take_keep_the_tables() {
        let mut d = domain(&[1.0, 2.0, 3.0], 2, 3);
        for (s, e) in [0, 1, 1, 2, 0, 1].into_iter().enumerate() {
            d.put(s, e);
        }
        assert_eq!(d.take(1), 1);
        assert_eq!(d.take(3), 2);
        assert_eq!(d.count, vec![2, 2, 0]);
        assert!(d.holders[2].is_empty());
        assert_eq!(d.on(0, 1), 1);
        assert_eq!(d.on(1, 1), 1);
        assert_eq!(
            d.gpu_loads(),
            vec![1.0 / 2.0 + 2.0 / 2.0, 1.0 / 2.0 + 2.0 / 2.0]
        );
    }
}
