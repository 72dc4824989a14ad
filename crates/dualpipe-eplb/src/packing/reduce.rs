//! Bringing moved replicas back: exchanges that return a replica to a GPU that held its expert
//! before, within a load cap.

use super::search::work_budget;
use super::Domain;

/// The exchanges' work allowance, in sweeps' worth of the local search's (see
/// [`work_budget`]): as many as the sweeps the caller allows at most.
const SWEEPS_OF_WORK: u64 = 8;

impl Domain {
    /// Lowers the number of moved replicas by exchanging replicas between GPUs, each exchange
    /// bringing a moved replica back to a GPU that held its expert before, while no GPU goes
    /// above `cap_load` and no expert above its per-GPU cap. First-improvement sweeps, at most
    /// `max_sweeps`, and bounded by work as the local search is: every moved slot costs one
    /// read per GPU that held its expert, every GPU examined one per slot; past
    /// `SWEEPS_OF_WORK` times the search's [`work_budget`] no further exchange is looked for.
    /// Returns the number of exchanges made.
    pub fn reduce_moves(&mut self, cap_load: f64, max_sweeps: usize) -> usize {
        let budget = SWEEPS_OF_WORK.saturating_mul(work_budget(self.slot.len(), self.experts()));
        self.reduce_moves_within(cap_load, max_sweeps, budget)
    }

    /// [`Domain::reduce_moves`] with an explicit work budget.
    fn reduce_moves_within(&mut self, cap_load: f64, max_sweeps: usize, budget: u64) -> usize {
        let mut loads = self.gpu_loads();
        let mut done = 0;
        let mut work: u64 = 0;
        // The GPUs that held each expert before, ascending.
        let held_by = std::mem::take(&mut self.orig_gpus);
        'sweeps: for _ in 0..max_sweeps {
            let mut changed = false;
            for a in 0..self.slot.len() {
                let ga = a / self.slots;
                let x = self.slot[a];
                if self.was_on(ga, x) {
                    continue;
                }
                work += 1 + held_by[x].len() as u64;
                if work > budget {
                    break 'sweeps;
                }
                let rx = self.share(x, self.count[x]);
                let mut best: Option<(i64, f64, usize)> = None;
                for h in held_by[x].iter().map(|&h| h as usize).filter(|&h| h != ga) {
                    if self.on(h, x) >= self.cap(self.count[x]) {
                        continue;
                    }
                    work += self.slots as u64;
                    for b in h * self.slots..(h + 1) * self.slots {
                        let y = self.slot[b];
                        if y == x || self.on(ga, y) >= self.cap(self.count[y]) {
                            continue;
                        }
                        let dm = self.cost(ga, y, false) - 1 - self.cost(h, y, false);
                        if dm >= 0 {
                            continue;
                        }
                        let ry = self.share(y, self.count[y]);
                        let la = loads[ga] - rx + ry;
                        let lh = loads[h] - ry + rx;
                        if la > cap_load || lh > cap_load {
                            continue;
                        }
                        let worst = la.max(lh);
                        if best.is_none_or(|(d, w, _)| (dm, worst) < (d, w)) {
                            best = Some((dm, worst, b));
                        }
                    }
                }
                if let Some((_, _, b)) = best {
                    let h = b / self.slots;
                    let y = self.slot[b];
                    let ry = self.share(y, self.count[y]);
                    loads[ga] += ry - rx;
                    loads[h] += rx - ry;
                    self.take(a);
                    self.take(b);
                    self.put(a, y);
                    self.put(b, x);
                    done += 1;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        self.orig_gpus = held_by;
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moved_replicas_go_back_within_the_load_cap() {
        // Before: expert e on GPU e / 2 (2 slots per GPU). Now GPUs 0 and 1 swapped contents.
        let loads = vec![1.0, 2.0, 3.0, 4.0];
        let mut orig = vec![false; 2 * 4];
        for e in 0..4 {
            orig[(e / 2) * 4 + e] = true;
        }
        let mut d = Domain::new(2, 2, loads, orig, 0.0);
        for (s, e) in [2, 3, 0, 1].into_iter().enumerate() {
            d.put(s, e);
        }
        assert_eq!(d.moves(), 4);
        // Every exchange puts some GPU at 5 or more: a cap of 4.9 keeps everything in place.
        assert_eq!(d.reduce_moves(4.9, 8), 0);
        assert_eq!(d.moves(), 4);
        assert!(d.reduce_moves(7.0, 8) > 0);
        assert_eq!(d.moves(), 0);
        assert!(d.max_load() <= 7.0);
    }
}
