//! What the local search ([`super::search`]) keeps up to date between its steps, and the
//! scoring of a re-assignment (a surplus replica given to another expert) on that state: its
//! hottest load read on the GPUs holding the two experts, a constant-time lower bound of it,
//! and its sum of squared loads.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::{Domain, Total};

/// What the search keeps up to date between steps.
pub(super) struct State {
    /// Load of every GPU, equal to what [`Domain::gpu_loads`] computes.
    pub(super) loads: Vec<f64>,
    /// GPUs by load, hottest first (ties to the lower index).
    pub(super) ranked: BTreeSet<(Reverse<Total>, usize)>,
    /// Load per replica of every expert at its current count.
    pub(super) rep: Vec<f64>,
    /// Load per replica of every expert with one replica less (0 without any).
    pub(super) rep_less: Vec<f64>,
    /// Load per replica of every expert with one replica more.
    pub(super) rep_more: Vec<f64>,
    /// Per-GPU cap of every expert at its current count.
    pub(super) cap: Vec<u32>,
    /// Per-GPU cap of every expert with one replica less.
    pub(super) cap_less: Vec<u32>,
    /// Per-GPU cap of every expert with one replica more.
    pub(super) cap_more: Vec<u32>,
    /// Scratch per GPU (all false between uses).
    pub(super) mark: Vec<bool>,
    /// Scratch per GPU: replicas of one expert (all zero between uses).
    pub(super) on_x: Vec<u32>,
    /// Scratch per GPU: replicas of another expert (all zero between uses).
    pub(super) on_y: Vec<u32>,
    /// Scratch per expert: replicas on the hottest GPU (all zero between steps).
    pub(super) on_hot: Vec<u32>,
    /// Scratch per expert: the last visit (of a GPU's slots) that met the expert.
    pub(super) seen: Vec<u64>,
    /// The same for the hottest GPU's slots, whose visits nest the others.
    pub(super) seen_hot: Vec<u64>,
    /// The last visit handed out.
    pub(super) visit: u64,
}

impl State {
    pub(super) fn new(d: &Domain) -> Self {
        let n = d.experts();
        let loads = d.gpu_loads();
        let ranked = loads
            .iter()
            .enumerate()
            .map(|(g, &l)| (Reverse(Total(l)), g))
            .collect();
        State {
            loads,
            ranked,
            rep: (0..n).map(|e| d.share(e, d.count[e])).collect(),
            rep_less: (0..n)
                .map(|e| d.share(e, d.count[e].saturating_sub(1)))
                .collect(),
            rep_more: (0..n).map(|e| d.share(e, d.count[e] + 1)).collect(),
            cap: (0..n).map(|e| d.cap(d.count[e])).collect(),
            cap_less: (0..n)
                .map(|e| d.cap(d.count[e].saturating_sub(1)))
                .collect(),
            cap_more: (0..n).map(|e| d.cap(d.count[e] + 1)).collect(),
            mark: vec![false; d.gpus],
            on_x: vec![0; d.gpus],
            on_y: vec![0; d.gpus],
            on_hot: vec![0; n],
            seen: vec![0; n],
            seen_hot: vec![0; n],
            visit: 0,
        }
    }

    /// A new visit, for [`State::first_in`].
    pub(super) fn next_visit(&mut self) -> u64 {
        self.visit += 1;
        self.visit
    }

    /// Whether expert `e` is met for the first time in `visit` (and records it): a second
    /// slot of the same expert on the same GPU gives the same candidates as the first, so only
    /// the first is scored (a later equal score never wins).
    pub(super) fn first_in(seen: &mut [u64], visit: u64, e: usize) -> bool {
        let first = seen[e] != visit;
        seen[e] = visit;
        first
    }

    /// Refreshes the per-replica loads and caps of `e` after its count changed.
    pub(super) fn recount(&mut self, d: &Domain, e: usize) {
        let c = d.count[e];
        self.rep[e] = d.share(e, c);
        self.rep_less[e] = d.share(e, c.saturating_sub(1));
        self.rep_more[e] = d.share(e, c + 1);
        self.cap[e] = d.cap(c);
        self.cap_less[e] = d.cap(c.saturating_sub(1));
        self.cap_more[e] = d.cap(c + 1);
    }

    pub(super) fn set_load(&mut self, g: usize, load: f64) {
        self.ranked.remove(&(Reverse(Total(self.loads[g])), g));
        self.loads[g] = load;
        self.ranked.insert((Reverse(Total(load)), g));
    }
}

impl Domain {
    /// The hottest load after slot `s` (on GPU `g0`) switches to expert `y`, or `None` when a
    /// cap would be broken. Reads the GPUs holding either expert, then the hottest GPU holding
    /// neither (among `top`, the hottest GPUs in rank order, before the whole ranking).
    pub(super) fn reassign_max(
        &self,
        s: usize,
        g0: usize,
        y: usize,
        top: &[usize],
        st: &mut State,
    ) -> Option<f64> {
        let x = self.slot[s];
        let cap_x = st.cap_less[x];
        if self.on(g0, y) + 1 > st.cap_more[y] {
            return None;
        }
        let (rx_old, rx_new) = (st.rep[x], st.rep_less[x]);
        let (ry_old, ry_new) = (st.rep[y], st.rep_more[y]);
        let mut max = 0.0f64;
        let mut ok = true;
        for &h in &self.holders[x] {
            let g = h as usize;
            st.mark[g] = true;
            let mut nx = self.on(g, x);
            let mut ny = self.on(g, y);
            let mut l = st.loads[g] - f64::from(nx) * rx_old - f64::from(ny) * ry_old;
            if g == g0 {
                nx -= 1;
                ny += 1;
            }
            if nx > cap_x {
                ok = false;
                break;
            }
            l += f64::from(nx) * rx_new + f64::from(ny) * ry_new;
            max = max.max(l);
        }
        if ok {
            for &h in &self.holders[y] {
                let g = h as usize;
                if st.mark[g] {
                    continue;
                }
                st.mark[g] = true;
                // No replica of x here: the formula above with nx = 0.
                let ny = f64::from(self.on(g, y));
                max = max.max(st.loads[g] - ny * ry_old + ny * ry_new);
            }
            let hottest_unread = match top.iter().find(|&&g| !st.mark[g]) {
                Some(&g) => Some(g),
                None => st.ranked.iter().map(|&(_, g)| g).find(|&g| !st.mark[g]),
            };
            if let Some(g) = hottest_unread {
                max = max.max(st.loads[g]);
            }
        }
        for &h in self.holders[x].iter().chain(&self.holders[y]) {
            st.mark[h as usize] = false;
        }
        ok.then_some(max)
    }

    /// A lower bound on [`Domain::reassign_max`] read in constant time: the new load of the
    /// hottest GPU, and the load of the second hottest when it holds neither expert (each
    /// computed as `reassign_max` computes it, so the bound is exact, not rounded).
    pub(super) fn reassign_floor(
        &self,
        s: usize,
        g0: usize,
        y: usize,
        top: &[usize],
        st: &State,
    ) -> f64 {
        let x = self.slot[s];
        let (rx_old, rx_new) = (st.rep[x], st.rep_less[x]);
        let (ry_old, ry_new) = (st.rep[y], st.rep_more[y]);
        let new_load = |g: usize| -> f64 {
            let mut nx = self.on(g, x);
            let mut ny = self.on(g, y);
            if nx > 0 {
                let mut l = st.loads[g] - f64::from(nx) * rx_old - f64::from(ny) * ry_old;
                if g == g0 {
                    nx -= 1;
                    ny += 1;
                }
                l += f64::from(nx) * rx_new + f64::from(ny) * ry_new;
                l
            } else if ny > 0 {
                let ny = f64::from(ny);
                st.loads[g] - ny * ry_old + ny * ry_new
            } else {
                st.loads[g]
            }
        };
        let mut floor = new_load(top[0]);
        if let Some(&second) = top.get(1) {
            if self.on(second, x) == 0 && self.on(second, y) == 0 {
                floor = floor.max(st.loads[second]);
            }
        }
        floor
    }

    /// The sum of squared GPU loads after slot `s` switches to expert `y` (a switch
    /// [`Domain::reassign_max`] allows), summed over every GPU in order.
    pub(super) fn reassign_ssq(&self, s: usize, y: usize, st: &mut State) -> f64 {
        let g0 = s / self.slots;
        let x = self.slot[s];
        let (rx_old, rx_new) = (st.rep[x], st.rep_less[x]);
        let (ry_old, ry_new) = (st.rep[y], st.rep_more[y]);
        for &h in &self.holders[x] {
            st.on_x[h as usize] = self.on(h as usize, x);
        }
        for &h in &self.holders[y] {
            st.on_y[h as usize] = self.on(h as usize, y);
        }
        let mut ssq = 0.0;
        for g in 0..self.gpus {
            let mut nx = st.on_x[g];
            let mut ny = st.on_y[g];
            let mut l = st.loads[g] - f64::from(nx) * rx_old - f64::from(ny) * ry_old;
            if g == g0 {
                nx -= 1;
                ny += 1;
            }
            l += f64::from(nx) * rx_new + f64::from(ny) * ry_new;
            ssq += l * l;
        }
        for &h in &self.holders[x] {
            st.on_x[h as usize] = 0;
        }
        for &h in &self.holders[y] {
            st.on_y[h as usize] = 0;
        }
        ssq
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::domain;
    use super::*;

    /// Hottest load after slot `s` switches to `y`, recomputed from scratch on a copy, or
    /// `None` when the switch breaks a cap.
    fn switched_max(d: &Domain, s: usize, y: usize) -> Option<f64> {
        let mut c = d.clone();
        let x = c.take(s);
        c.put(s, y);
        let broken = (0..c.gpus).any(|g| c.on(g, x) > c.cap(c.count[x]))
            || c.on(s / c.slots, y) > c.cap(c.count[y]);
        (!broken).then(|| c.max_load())
    }

    #[test]
    fn a_reassignment_is_scored_as_a_full_recomputation_would() {
        // 5 GPUs x 4 slots, 7 experts: the heavy ones get more replicas than there are GPUs.
        let loads = [90.0, 50.0, 7.0, 3.0, 2.0, 1.5, 1.0];
        let mut d = domain(&loads, 5, 4);
        d.fill();
        assert!(
            d.count[0] > d.gpus,
            "the case covers two replicas of one expert on a GPU"
        );
        let mut st = State::new(&d);
        let mut checked = 0;
        for s in 0..d.slot.len() {
            if d.count[d.slot[s]] < 2 {
                continue;
            }
            for y in (0..loads.len()).filter(|&y| y != d.slot[s]) {
                let top: Vec<usize> = st.ranked.iter().take(3).map(|&(_, g)| g).collect();
                let fast = d.reassign_max(s, s / d.slots, y, &top, &mut st);
                let full = switched_max(&d, s, y);
                // The constant-time bound never exceeds the hottest load it bounds.
                if let Some(max) = fast {
                    let floor = d.reassign_floor(s, s / d.slots, y, &top, &st);
                    assert!(floor <= max, "slot {s} to {y}: bound {floor} above {max}");
                }
                match (fast, full) {
                    (Some(a), Some(b)) => assert!((a - b).abs() <= 1e-9 * b, "slot {s} to {y}"),
                    (None, None) => {}
                    other => panic!("slot {s} to {y}: {other:?}"),
                }
                // The sum of squares is the one a recomputation gives.
                if fast.is_some() {
                    let mut c = d.clone();
                    c.take(s);
                    c.put(s, y);
                    let want: f64 = c.gpu_loads().iter().map(|l| l * l).sum();
                    let got = d.reassign_ssq(s, y, &mut st);
                    assert!((got - want).abs() <= 1e-9 * want, "slot {s} to {y}");
                }
                checked += 1;
            }
        }
        assert!(checked > 20);
        assert!(st.mark.iter().all(|&m| !m) && st.on_x.iter().all(|&c| c == 0));
    }
}
