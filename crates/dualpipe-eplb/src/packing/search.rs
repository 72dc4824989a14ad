//! The bounded local search that improves a filled domain: exchanges of replicas between the
//! hottest GPU and another, and surplus replicas given to other experts, each step lowering
//! (hottest load, sum of squared loads).
//!
//! A step costs what it reads: the GPU loads and their order are kept up to date (only the GPUs
//! a step changes are recomputed), and a re-assignment is scored on the GPUs that hold its two
//! experts plus the hottest GPU that holds neither; the whole domain is read only when the
//! sum of squares must break a tie on the hottest load.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::{Domain, Total, EMPTY};

/// Tuning of the local search; see [`crate::improved::PlannerOptions`] for the public knobs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SearchLimits {
    /// Stop once the domain's hottest GPU is at or below this load (within rounding).
    pub target: f64,
    /// Also stop (without having reached `target`) once the hottest GPU is at or below this
    /// load: another domain of the layer is left at it (`f64::NEG_INFINITY` for none).
    pub enough: f64,
    /// Give up before the number of moved replicas (slots whose expert was not on that GPU
    /// before) would exceed this.
    pub max_moves: usize,
    /// At most this many accepted steps.
    pub max_steps: usize,
    /// When true, moving a replica costs nothing (planning from scratch).
    pub free_moves: bool,
}

/// The local search's work allowance per domain, as a multiple of `n log2 n` for a domain of
/// `n` slots and experts: about what the deepseek policy spends on the domain, in its own
/// elementary steps, so the search stays within a few times the reference's time at every size.
const WORK_PER_N_LOG_N: u64 = 3;

/// The least work a domain's search may spend (2^14 units, well under a millisecond): the small
/// domains of the reference's test cases finish their search within it.
const WORK_FLOOR: u64 = 1 << 14;

/// The work one domain's search may spend: `max(WORK_FLOOR, WORK_PER_N_LOG_N x n x
/// (floor(log2 n) + 1))` for `n` = slots + experts.
fn work_budget(slots: usize, experts: usize) -> u64 {
    let n = (slots + experts) as u64;
    let log = u64::from(n.max(1).ilog2() + 1);
    WORK_FLOOR.max(WORK_PER_N_LOG_N.saturating_mul(n).saturating_mul(log))
}

/// Experts offered to a surplus replica of the hottest GPU: this many, by load per replica.
const HEAVY: usize = 16;

/// One local-search step.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Exchange the experts of two slots on different GPUs.
    Swap(usize, usize),
    /// Give a slot (holding a surplus replica) to another expert.
    Reassign(usize, usize),
}

/// What the search keeps up to date between steps.
struct State {
    /// Load of every GPU, equal to what [`Domain::gpu_loads`] computes.
    loads: Vec<f64>,
    /// GPUs by load, hottest first (ties to the lower index).
    ranked: BTreeSet<(Reverse<Total>, usize)>,
    /// Load per replica of every expert at its current count.
    rep: Vec<f64>,
    /// Load per replica of every expert with one replica less (0 without any).
    rep_less: Vec<f64>,
    /// Load per replica of every expert with one replica more.
    rep_more: Vec<f64>,
    /// Per-GPU cap of every expert at its current count.
    cap: Vec<u32>,
    /// Per-GPU cap of every expert with one replica less.
    cap_less: Vec<u32>,
    /// Per-GPU cap of every expert with one replica more.
    cap_more: Vec<u32>,
    /// Scratch per GPU (all false between uses).
    mark: Vec<bool>,
    /// Scratch per GPU: replicas of one expert (all zero between uses).
    on_x: Vec<u32>,
    /// Scratch per GPU: replicas of another expert (all zero between uses).
    on_y: Vec<u32>,
    /// Scratch per expert: replicas on the hottest GPU (all zero between steps).
    on_hot: Vec<u32>,
    /// Scratch per expert: the last visit (of a GPU's slots) that met the expert.
    seen: Vec<u64>,
    /// The same for the hottest GPU's slots, whose visits nest the others.
    seen_hot: Vec<u64>,
    /// The last visit handed out.
    visit: u64,
}

impl State {
    fn new(d: &Domain) -> Self {
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
    fn next_visit(&mut self) -> u64 {
        self.visit += 1;
        self.visit
    }

    /// Whether expert `e` is met for the first time in `visit` (and records it): a second
    /// slot of the same expert on the same GPU gives the same candidates as the first, so only
    /// the first is scored (a later equal score never wins).
    fn first_in(seen: &mut [u64], visit: u64, e: usize) -> bool {
        let first = seen[e] != visit;
        seen[e] = visit;
        first
    }

    /// Refreshes the per-replica loads and caps of `e` after its count changed.
    fn recount(&mut self, d: &Domain, e: usize) {
        let c = d.count[e];
        self.rep[e] = d.share(e, c);
        self.rep_less[e] = d.share(e, c.saturating_sub(1));
        self.rep_more[e] = d.share(e, c + 1);
        self.cap[e] = d.cap(c);
        self.cap_less[e] = d.cap(c.saturating_sub(1));
        self.cap_more[e] = d.cap(c + 1);
    }

    fn set_load(&mut self, g: usize, load: f64) {
        self.ranked.remove(&(Reverse(Total(self.loads[g])), g));
        self.loads[g] = load;
        self.ranked.insert((Reverse(Total(load)), g));
    }
}

/// The best step found so far in one round.
struct Best {
    cur_max: f64,
    eps: f64,
    /// Moved replicas the step may still add.
    budget: i64,
    found: Option<(bool, f64, Step)>,
}

impl Best {
    /// Whether a step that lowers the hottest load has been found (one that does not can no
    /// longer win).
    fn primary(&self) -> bool {
        matches!(self.found, Some((true, _, _)))
    }

    /// Whether no step leaving the hottest load at `floor` or above can beat the best one: a
    /// step's score is at most `(cur_max - floor) / 0.25`, and only a higher score wins.
    fn beats_all_above(&self, floor: f64) -> bool {
        match self.found {
            Some((true, score, _)) => score >= (self.cur_max - floor) / 0.25,
            _ => false,
        }
    }

    /// Offers a step that leaves the hottest load at `new_max`, lowers the sum of squares by
    /// `ssq_gain` (read only when `new_max` is not lower) and adds `dmoves` moved replicas.
    fn offer(&mut self, new_max: f64, ssq_gain: f64, dmoves: i64, step: Step) {
        if dmoves > self.budget {
            return;
        }
        let primary = new_max < self.cur_max - self.eps;
        if !(primary || new_max <= self.cur_max && ssq_gain > self.eps) {
            return;
        }
        let gain = if primary {
            self.cur_max - new_max
        } else {
            ssq_gain
        };
        let score = gain / (dmoves.max(0) as f64 + 0.25);
        let better = match &self.found {
            None => true,
            Some((p, s, _)) => (primary, score) > (*p, *s),
        };
        if better {
            self.found = Some((primary, score, step));
        }
    }
}

impl Domain {
    /// Load of GPU `g` with `rep` per replica (summed in slot order, as in `gpu_loads`).
    fn gpu_load(&self, g: usize, rep: &[f64]) -> f64 {
        let mut load = 0.0;
        for &e in &self.slot[g * self.slots..(g + 1) * self.slots] {
            if e != EMPTY {
                load += rep[e];
            }
        }
        load
    }

    /// Improves the placement by exchanging replicas between GPUs and re-assigning surplus
    /// replicas to other experts, always lowering (hottest load, sum of squared loads). Picks the
    /// step with the most gain per moved replica. Returns whether the target was reached.
    ///
    /// Bounded by `limits.max_steps` accepted steps and by work: every candidate costs the
    /// table entries its evaluation reads (an exchange one per slot of the other GPU, a
    /// re-assignment one per GPU holding either expert, plus one per GPU of the domain when the
    /// sum of squares is needed), every step one per slot, GPU and expert; the search stops
    /// (after the best step found so far) once it has spent [`work_budget`].
    pub fn improve(&mut self, limits: &SearchLimits) -> bool {
        self.improve_within(limits, work_budget(self.slot.len(), self.experts()))
    }

    /// [`Domain::improve`] with an explicit work budget.
    fn improve_within(&mut self, limits: &SearchLimits, work_budget: u64) -> bool {
        let eps = 1e-12 * self.load.iter().sum::<f64>().max(1e-300);
        let n = self.experts();
        let mut work: u64 = 0;
        let mut exhausted = false;
        let free = limits.free_moves;
        let mut moves = if free { 0 } else { self.moves() as i64 };
        let mut st = State::new(self);
        let mut heavy: Vec<usize> = Vec::with_capacity(n);
        for _ in 0..limits.max_steps {
            if exhausted {
                break;
            }
            work += (self.slot.len() + self.gpus + n) as u64;
            let top: Vec<usize> = st.ranked.iter().take(3).map(|&(_, g)| g).collect();
            let hot = top[0];
            let cur_max = st.loads[hot];
            if cur_max <= limits.target + eps {
                return true;
            }
            if cur_max <= limits.enough {
                return false;
            }
            let mut best = Best {
                cur_max,
                eps,
                budget: i64::try_from(limits.max_moves).unwrap_or(i64::MAX) - moves,
                found: None,
            };
            let hot_slots = hot * self.slots..(hot + 1) * self.slots;
            for s in hot_slots.clone() {
                st.on_hot[self.slot[s]] += 1;
            }
            // Exchanges between the hottest GPU and any other.
            let hot_visit = st.next_visit();
            for sa in hot_slots.clone() {
                let x = self.slot[sa];
                if !State::first_in(&mut st.seen_hot, hot_visit, x) {
                    continue;
                }
                let rx = st.rep[x];
                let lh = st.loads[hot];
                for &h in &self.holders[x] {
                    st.on_x[h as usize] = self.on(h as usize, x);
                }
                for b in (0..self.gpus).filter(|&b| b != hot) {
                    work += 1;
                    if st.on_x[b] >= st.cap[x] {
                        continue;
                    }
                    // Every exchange with b leaves the hottest load at `rest` or above.
                    let rest = top
                        .iter()
                        .find(|&&g| g != hot && g != b)
                        .map_or(0.0, |&g| st.loads[g]);
                    if best.beats_all_above(rest) {
                        continue;
                    }
                    work += self.slots as u64;
                    if work > work_budget {
                        exhausted = true;
                        break;
                    }
                    // Charged as read, but skipped when no exchange with b can win: one of the
                    // two GPUs ends at their mean or above (less `eps` for rounding), the
                    // hottest at `lh - rx` or above.
                    let mean = 0.5 * (lh + st.loads[b]) - eps;
                    if best.beats_all_above(rest.max(mean).max(lh - rx)) {
                        continue;
                    }
                    let (lh, lb) = (st.loads[hot], st.loads[b]);
                    let visit = st.next_visit();
                    for sb in b * self.slots..(b + 1) * self.slots {
                        let y = self.slot[sb];
                        if y == x
                            || st.on_hot[y] >= st.cap[y]
                            || !State::first_in(&mut st.seen, visit, y)
                        {
                            continue;
                        }
                        let ry = st.rep[y];
                        let la = lh - rx + ry;
                        let lb2 = lb - ry + rx;
                        let new_max = la.max(lb2).max(rest);
                        let ssq_gain = lh * lh + lb * lb - la * la - lb2 * lb2;
                        let dm = self.cost(hot, y, free) + self.cost(b, x, free)
                            - self.cost(hot, x, free)
                            - self.cost(b, y, free);
                        best.offer(new_max, ssq_gain, dm, Step::Swap(sa, sb));
                    }
                }
                for &h in &self.holders[x] {
                    st.on_x[h as usize] = 0;
                }
                if exhausted {
                    break;
                }
            }
            for s in hot_slots.clone() {
                st.on_hot[self.slot[s]] = 0;
            }
            // Re-assign a surplus replica: one on the hottest GPU to a heavy expert, or one
            // anywhere to an expert on the hottest GPU.
            heavy.clear();
            heavy.extend(0..n);
            let by_rep = |a: &usize, b: &usize| st.rep[*b].total_cmp(&st.rep[*a]).then(a.cmp(b));
            if heavy.len() > HEAVY {
                heavy.select_nth_unstable_by(HEAVY - 1, by_rep);
                heavy.truncate(HEAVY);
            }
            heavy.sort_by(by_rep);
            let visit = st.next_visit();
            let hot_experts: Vec<usize> = hot_slots
                .map(|s| self.slot[s])
                .filter(|&e| State::first_in(&mut st.seen, visit, e))
                .collect();
            let mut cur_ssq: Option<f64> = None;
            let mut visit = 0;
            'reassign: for s in 0..self.slot.len() {
                if exhausted {
                    break;
                }
                let g = s / self.slots;
                if s % self.slots == 0 {
                    visit = st.next_visit();
                }
                let x = self.slot[s];
                if self.count[x] < 2 || !State::first_in(&mut st.seen, visit, x) {
                    continue;
                }
                let targets: &[usize] = if g == hot { &heavy } else { &hot_experts };
                for &y in targets {
                    if y == x {
                        continue;
                    }
                    // Charged in full even when the bound below skips the reading, so that
                    // the budget runs out where it would without the bound.
                    work += (1 + self.holders[x].len() + self.holders[y].len()) as u64;
                    if work > work_budget {
                        exhausted = true;
                        break 'reassign;
                    }
                    let dm = self.cost(g, y, free) - self.cost(g, x, free);
                    if dm > best.budget {
                        continue;
                    }
                    // A lower bound on the new hottest load, in constant time: most candidates
                    // cannot beat the best step found so far.
                    let floor = self.reassign_floor(s, g, y, &top, &st);
                    if floor > cur_max
                        || best.primary() && floor >= cur_max - eps
                        || best.beats_all_above(floor)
                    {
                        continue;
                    }
                    let Some(new_max) = self.reassign_max(s, g, y, &top, &mut st) else {
                        continue;
                    };
                    let ssq_gain = if new_max < cur_max - eps {
                        0.0 // not read: the step lowers the hottest load
                    } else if new_max > cur_max || best.primary() {
                        continue;
                    } else {
                        work += self.gpus as u64;
                        let cur =
                            *cur_ssq.get_or_insert_with(|| st.loads.iter().map(|l| l * l).sum());
                        cur - self.reassign_ssq(s, y, &mut st)
                    };
                    best.offer(new_max, ssq_gain, dm, Step::Reassign(s, y));
                }
            }
            let Some((_, _, step)) = best.found else {
                return false;
            };
            match step {
                Step::Swap(sa, sb) => {
                    let (ga, gb) = (sa / self.slots, sb / self.slots);
                    let (x, y) = (self.slot[sa], self.slot[sb]);
                    moves += self.cost(ga, y, free) + self.cost(gb, x, free)
                        - self.cost(ga, x, free)
                        - self.cost(gb, y, free);
                    self.take(sa);
                    self.take(sb);
                    self.put(sa, y);
                    self.put(sb, x);
                    for g in [ga, gb] {
                        let load = self.gpu_load(g, &st.rep);
                        st.set_load(g, load);
                    }
                }
                Step::Reassign(s, y) => {
                    let g = s / self.slots;
                    let x = self.slot[s];
                    // Every GPU holding x or y changes load (their shares change).
                    let touched: Vec<u32> = self.holders[x]
                        .iter()
                        .chain(&self.holders[y])
                        .copied()
                        .collect();
                    moves += self.cost(g, y, free) - self.cost(g, x, free);
                    self.take(s);
                    self.put(s, y);
                    for e in [x, y] {
                        st.recount(self, e);
                    }
                    for h in touched {
                        let load = self.gpu_load(h as usize, &st.rep);
                        st.set_load(h as usize, load);
                    }
                }
            }
        }
        self.max_load() <= limits.target + eps
    }

    /// The hottest load after slot `s` (on GPU `g0`) switches to expert `y`, or `None` when a
    /// cap would be broken. Reads the GPUs holding either expert, then the hottest GPU holding
    /// neither (among `top`, the hottest GPUs in rank order, before the whole ranking).
    fn reassign_max(
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
                None => st
                    .ranked
                    .iter()
                    .map(|&(_, g)| g)
                    .find(|&g| !st.mark[g]),
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
    fn reassign_floor(&self, s: usize, g0: usize, y: usize, top: &[usize], st: &State) -> f64 {
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
    fn reassign_ssq(&self, s: usize, y: usize, st: &mut State) -> f64 {
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
    use super::super::tests::{assert_capped, domain};
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

    #[test]
    fn the_work_bound_grows_as_n_log_n_above_a_floor() {
        assert_eq!(work_budget(16, 8), WORK_FLOOR);
        // 32,768 slots + 16,384 experts: 49,152 x 16 x 3.
        assert_eq!(work_budget(32_768, 16_384), 3 * 49_152 * 16);
        assert!(work_budget(1 << 24, 4) < 1 << 31);
    }

    #[test]
    fn a_bounded_search_stops_early_and_keeps_caps() {
        // 256 GPUs x 2 slots: one step reads far more than the floor allows.
        let loads: Vec<f64> = (0..300).map(|i| 1.0 + ((i * 7919) % 101) as f64).collect();
        let mut d = domain(&loads, 256, 2);
        d.fill();
        let before = d.max_load();
        let mut unbounded = d.clone();
        let limits = SearchLimits {
            target: 0.0,
            enough: f64::NEG_INFINITY,
            max_moves: usize::MAX,
            max_steps: 256,
            free_moves: true,
        };
        d.improve(&limits);
        assert!(d.max_load() <= before);
        assert_capped(&d);
        // Without the bound the same search goes further (or as far).
        unbounded.improve_within(&limits, u64::MAX);
        assert!(unbounded.max_load() <= d.max_load());
    }

    #[test]
    fn search_never_worsens_and_keeps_caps() {
        let loads: Vec<f64> = (0..24).map(|i| 1.0 + ((i * 7919) % 13) as f64).collect();
        let mut d = domain(&loads, 4, 7);
        d.fill();
        let before = d.max_load();
        d.improve(&SearchLimits {
            target: 0.0,
            enough: f64::NEG_INFINITY,
            max_moves: usize::MAX,
            max_steps: 200,
            free_moves: true,
        });
        assert!(d.max_load() <= before + 1e-9);
        assert_capped(&d);
        assert!(d.count.iter().all(|&c| c >= 1));
    }

    #[test]
    fn search_respects_the_move_budget() {
        let loads: Vec<f64> = (0..16).map(|i| 1.0 + (i * i) as f64).collect();
        let mut orig = vec![false; 4 * 16];
        // Previous placement: expert e on GPU e % 4 (4 slots per GPU).
        for e in 0..16 {
            orig[(e % 4) * 16 + e] = true;
        }
        let mut d = Domain::new(4, 4, loads, orig, 0.0);
        for e in 0..16 {
            d.put((e % 4) * 4 + e / 4, e);
        }
        assert_eq!(d.moves(), 0);
        d.improve(&SearchLimits {
            target: 0.0,
            enough: f64::NEG_INFINITY,
            max_moves: 2,
            max_steps: 100,
            free_moves: false,
        });
        assert!(d.moves() <= 2);
    }
}
