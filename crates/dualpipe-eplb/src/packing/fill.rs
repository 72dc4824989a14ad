//! Filling a domain: replica counts (D'Hondt) and duplicate-free packing, heaviest replica
//! first onto the least-loaded GPU that may take it; and, from a previous placement, freeing the
//! slots that a fresh plan would use otherwise.

use super::ready::{Ready, SORTED_MAX_GPUS};
use super::{Domain, Total, EMPTY};

/// Up to this many GPUs a domain finds the GPU for each replica by a scan, not an ordered set.
const SCAN_MAX_GPUS: usize = 16;

impl Domain {
    /// Frees slots until every expert without a replica can get one: evicts the surplus replica
    /// whose removal raises its expert's per-replica load the least.
    fn make_room_for_missing(&mut self) {
        let missing = self.count.iter().filter(|&&c| c == 0).count();
        let mut free = self.slot.iter().filter(|&&e| e == EMPTY).count();
        while free < missing {
            let victim = (0..self.slot.len())
                .filter(|&s| self.slot[s] != EMPTY && self.count[self.slot[s]] >= 2)
                .min_by(|&a, &b| {
                    let ea = self.slot[a];
                    let eb = self.slot[b];
                    let ka = self.share(ea, self.count[ea] - 1);
                    let kb = self.share(eb, self.count[eb] - 1);
                    ka.total_cmp(&kb).then(a.cmp(&b))
                });
            match victim {
                Some(s) => {
                    self.take(s);
                    free += 1;
                }
                None => break,
            }
        }
    }

    /// Frees the surplus replicas of experts that have more than a fresh plan would give them
    /// (one each, then the extra slots by highest load per replica), taking each from the
    /// hottest GPU that holds one.
    ///
    /// Reads each removal's GPUs only: the loads are kept, and after a removal only the GPUs
    /// holding the expert (whose share changed) and the emptied one are summed again, each in
    /// slot order as [`Domain::gpu_loads`] sums it.
    pub fn trim_to_fair_counts(&mut self) {
        let (fair, _) = dhondt(&self.load, vec![0; self.experts()], self.slot.len());
        let mut loads = self.gpu_loads();
        let mut rep: Vec<f64> = (0..self.experts())
            .map(|x| self.share(x, self.count[x]))
            .collect();
        for (e, &keep) in fair.iter().enumerate() {
            while self.count[e] > keep {
                // The slot of e on the hottest GPU (ties to the lower slot).
                let mut pick: Option<usize> = None;
                for &h in &self.holders[e] {
                    let g = h as usize;
                    for s in g * self.slots..(g + 1) * self.slots {
                        if self.slot[s] != e {
                            continue;
                        }
                        let better = pick.is_none_or(|p| {
                            loads[g]
                                .total_cmp(&loads[p / self.slots])
                                .then(p.cmp(&s))
                                .is_gt()
                        });
                        if better {
                            pick = Some(s);
                        }
                    }
                }
                let s = pick.expect("the expert has replicas");
                self.take(s);
                rep[e] = self.share(e, self.count[e]);
                let emptied = (s / self.slots) as u32;
                for &g in self.holders[e].iter().chain(std::iter::once(&emptied)) {
                    loads[g as usize] = self.summed_load(g as usize, &rep);
                }
            }
        }
    }

    /// Load of GPU `g` with `rep` per replica, summed in slot order.
    fn summed_load(&self, g: usize, rep: &[f64]) -> f64 {
        let mut load = 0.0;
        for &e in &self.slot[g * self.slots..(g + 1) * self.slots] {
            if e != EMPTY {
                load += rep[e];
            }
        }
        load
    }

    /// Fills every empty slot: first one replica for each expert without one, then extra replicas
    /// for the experts with the highest per-replica load (D'Hondt), each placed on the
    /// least-loaded GPU with room that does not already hold its cap of that expert. Among GPUs
    /// within `near_equal` of the least-loaded one, a GPU that held the expert before wins.
    pub fn fill(&mut self) {
        self.make_room_for_missing();
        let free = self.slot.iter().filter(|&&e| e == EMPTY).count();
        if free == 0 {
            return;
        }
        let (final_count, extra) = self.replica_counts(free);
        let final_share: Vec<f64> = (0..self.experts())
            .map(|e| self.share(e, final_count[e]))
            .collect();
        // Heaviest replicas first (longest-processing-time order; ties to the lower index).
        let mut extra: Vec<(std::cmp::Reverse<Total>, usize)> = extra
            .into_iter()
            .map(|e| (std::cmp::Reverse(Total(final_share[e])), e))
            .collect();
        extra.sort_unstable();
        // Loads as they will be once every replica is in: kept replicas already count at their
        // final share.
        let mut loads = vec![0.0; self.gpus];
        for (s, &e) in self.slot.iter().enumerate() {
            if e != EMPTY {
                loads[s / self.slots] += final_share[e];
            }
        }
        // GPUs with room, by (load, index): the least-loaded one that may take a replica is
        // found without scanning every GPU.
        let sorted = self.gpus <= SORTED_MAX_GPUS;
        let rebuild = |d: &Domain, loads: &[f64]| -> Ready {
            let keys = (0..d.gpus)
                .filter(|&g| d.has_room(g))
                .map(|g| (Total(loads[g]), g));
            Ready::new(keys, sorted)
        };
        // A small domain scans its GPUs instead (the same choice, without the ordered set).
        let scan = self.gpus <= SCAN_MAX_GPUS;
        let mut ready = if scan {
            Ready::Sorted(Vec::new())
        } else {
            rebuild(self, &loads)
        };
        for (_, e) in extra {
            let cap = self.cap(final_count[e]);
            let share = final_share[e];
            let g = if scan {
                self.pick_gpu_scan(e, cap, &loads)
            } else {
                self.pick_gpu(e, cap, &loads, &ready)
            };
            let s = match g {
                Some(g) => self.first_free(g).expect("picked GPU has room"),
                None => self.swap_in(e, cap, &final_count, &mut loads),
            };
            self.put(s, e);
            let h = s / self.slots;
            if scan {
                loads[h] += share;
            } else if g.is_some() {
                ready.remove(&(Total(loads[h]), h));
                loads[h] += share;
                if self.has_room(h) {
                    ready.insert((Total(loads[h]), h));
                }
            } else {
                loads[h] += share;
                ready = rebuild(self, &loads);
            }
        }
    }

    /// The replica count of every expert once `free` more replicas are given out, and the
    /// experts that get them: see [`dhondt`].
    fn replica_counts(&self, free: usize) -> (Vec<usize>, Vec<usize>) {
        dhondt(&self.load, self.count.clone(), free)
    }

    /// [`Domain::pick_gpu`] by a scan of every GPU: the least-loaded GPU (ties to the lower
    /// index) with room and under the cap of `e`, unless a GPU that held `e` before is within
    /// the packing slack of it.
    fn pick_gpu_scan(&self, e: usize, cap: u32, loads: &[f64]) -> Option<usize> {
        let ok = |g: usize| self.has_room(g) && self.on(g, e) < cap;
        let least = |pool: &mut dyn Iterator<Item = usize>| {
            pool.min_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(a.cmp(&b)))
        };
        let best = least(&mut (0..self.gpus).filter(|&g| ok(g)))?;
        if !self.any_orig {
            return Some(best);
        }
        let preferred = least(
            &mut self.orig_gpus[e]
                .iter()
                .map(|&g| g as usize)
                .filter(|&g| ok(g) && loads[g] <= loads[best] + self.prefer_slack),
        );
        Some(preferred.unwrap_or(best))
    }

    fn first_free(&self, g: usize) -> Option<usize> {
        if self.free[g] == 0 {
            return None;
        }
        (self.first_empty[g]..(g + 1) * self.slots).find(|&s| self.slot[s] == EMPTY)
    }

    fn has_room(&self, g: usize) -> bool {
        self.free[g] > 0
    }

    /// The GPU for a new replica of `e`, if one has room and is under the cap.
    /// `ready` holds every GPU with room, keyed by its load in `loads`.
    fn pick_gpu(&self, e: usize, cap: u32, loads: &[f64], ready: &Ready) -> Option<usize> {
        let ok = |g: usize| self.has_room(g) && self.on(g, e) < cap;
        let best = ready.first(|g| self.on(g, e) < cap)?;
        if !self.any_orig {
            return Some(best);
        }
        let preferred = self.orig_gpus[e]
            .iter()
            .map(|&g| g as usize)
            .filter(|&g| ok(g) && loads[g] <= loads[best] + self.prefer_slack)
            .min_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(a.cmp(&b)));
        Some(preferred.unwrap_or(best))
    }

    /// No GPU with room may take `e`: move some replica `x` from a full GPU `h` that may take `e`
    /// into a free slot elsewhere, and return `x`'s old slot for `e`. Falls back to any free slot
    /// (breaking the cap) only if no such exchange exists.
    fn swap_in(&mut self, e: usize, cap: u32, final_count: &[usize], loads: &mut [f64]) -> usize {
        let mut with_room: Vec<usize> = (0..self.gpus).filter(|&g| self.has_room(g)).collect();
        with_room.sort_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(a.cmp(&b)));
        let mut takers: Vec<usize> = (0..self.gpus).filter(|&h| self.on(h, e) < cap).collect();
        takers.sort_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(a.cmp(&b)));
        for &g in &with_room {
            for &h in &takers {
                for s in h * self.slots..(h + 1) * self.slots {
                    let x = self.slot[s];
                    if x == EMPTY || x == e || self.on(g, x) >= self.cap(final_count[x]) {
                        continue;
                    }
                    let dst = self.first_free(g).expect("GPU has room");
                    self.take(s);
                    self.put(dst, x);
                    let share = self.share(x, final_count[x]);
                    loads[h] -= share;
                    loads[g] += share;
                    return s;
                }
            }
        }
        self.first_free(with_room[0]).expect("GPU has room")
    }
}

/// The replica count of every expert (from `count`) once `free` more replicas are given out,
/// and the experts that get them (one entry per replica): first one replica for each expert
/// without one, heaviest first, then each further replica to the expert with the highest load
/// per replica (D'Hondt; ties to the lower index).
fn dhondt(load: &[f64], count: Vec<usize>, free: usize) -> (Vec<usize>, Vec<usize>) {
    let mut final_count = count;
    let mut extra = Vec::with_capacity(free);
    let mut missing: Vec<usize> = (0..load.len()).filter(|&e| final_count[e] == 0).collect();
    if missing.len() > free {
        // Not every expert gets one: the heaviest do (ties to the lower index).
        missing.sort_unstable_by(|&a, &b| load[b].total_cmp(&load[a]).then(a.cmp(&b)));
        missing.truncate(free);
    }
    for &e in &missing {
        final_count[e] += 1;
        extra.push(e);
    }
    let key = |e: usize, count: usize| (Total(load[e] / count as f64), std::cmp::Reverse(e));
    let more = free - extra.len();
    if more > 0 {
        let mut heap: std::collections::BinaryHeap<_> = (0..load.len())
            .filter(|&e| final_count[e] > 0)
            .map(|e| key(e, final_count[e]))
            .collect();
        for _ in 0..more {
            let (_, std::cmp::Reverse(e)) = heap.pop().expect("a domain has at least one expert");
            final_count[e] += 1;
            extra.push(e);
            heap.push(key(e, final_count[e]));
        }
    }
    (final_count, extra)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_capped, domain};
    use super::*;

    #[test]
    fn fill_gives_every_expert_a_replica_and_no_duplicates() {
        let loads = [100.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        let mut d = domain(&loads, 4, 2);
        d.fill();
        assert!(d.slot.iter().all(|&e| e != EMPTY));
        assert!(d.count.iter().all(|&c| c >= 1));
        assert_eq!(d.count[0], 3);
        assert_capped(&d);
    }

    #[test]
    fn more_replicas_than_gpus_spread_evenly() {
        let loads = [100.0, 1.0];
        let mut d = domain(&loads, 2, 3);
        d.fill();
        assert_eq!(d.count[0], 5);
        assert_capped(&d);
    }
}
