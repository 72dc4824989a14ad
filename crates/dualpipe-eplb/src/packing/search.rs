//! The bounded local search that improves a filled domain: exchanges of replicas between the
//! hottest GPU and another, and surplus replicas given to other experts, each step lowering
//! (hottest load, sum of squared loads).
//!
//! A step costs what it reads: the GPU loads and their order are kept up to date (only the GPUs
//! a step changes are recomputed), and a re-assignment is scored on the GPUs that hold its two
//! experts plus the hottest GPU that holds neither; the whole domain is read only when the
//! sum of squares must break a tie on the hottest load.

use super::score::State;
use super::{Domain, EMPTY};

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
pub(super) fn work_budget(slots: usize, experts: usize) -> u64 {
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
        // gain / 0.25 is gain x 4 exactly (a power of two), without the division.
        let score = if dmoves <= 0 {
            gain * 4.0
        } else {
            gain / (dmoves as f64 + 0.25)
        };
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
        let mut work = Work {
            spent: 0,
            budget: work_budget,
            exhausted: false,
        };
        let free = limits.free_moves;
        let mut moves = if free { 0 } else { self.moves() as i64 };
        let mut st = State::new(self);
        let mut heavy: Vec<usize> = Vec::with_capacity(n);
        // The heavy experts depend only on the per-replica loads, which only a re-assignment
        // changes: they are chosen again after one.
        let mut heavy_stale = true;
        let mut hot_experts: Vec<usize> = Vec::new();
        let mut touched: Vec<u32> = Vec::new();
        for _ in 0..limits.max_steps {
            if work.exhausted {
                break;
            }
            work.spent += (self.slot.len() + self.gpus + n) as u64;
            let mut top_buf = [0usize; 3];
            let mut ranked_top = 0;
            for &(_, g) in st.ranked.iter().take(3) {
                top_buf[ranked_top] = g;
                ranked_top += 1;
            }
            let top = &top_buf[..ranked_top];
            let cur_max = st.loads[top[0]];
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
            self.offer_exchanges(&mut st, top, free, &mut best, &mut work);
            if heavy_stale {
                rank_heavy(&st, n, &mut heavy);
                heavy_stale = false;
            }
            let targets = Targets {
                heavy: &heavy,
                hot_experts: &mut hot_experts,
            };
            self.offer_reassignments(&mut st, top, free, targets, &mut best, &mut work);
            let Some((_, _, step)) = best.found else {
                return false;
            };
            moves += self.apply(step, &mut st, free, &mut touched);
            heavy_stale |= matches!(step, Step::Reassign(..));
        }
        self.max_load() <= limits.target + eps
    }

    /// Offers `best` every exchange of a replica on the hottest GPU (`top[0]`; `top` the
    /// three hottest) with one on another GPU, charging `work` what each reads.
    fn offer_exchanges(
        &self,
        st: &mut State,
        top: &[usize],
        free: bool,
        best: &mut Best,
        work: &mut Work,
    ) {
        let (hot, eps) = (top[0], best.eps);
        let hot_slots = hot * self.slots..(hot + 1) * self.slots;
        for s in hot_slots.clone() {
            st.on_hot[self.slot[s]] += 1;
        }
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
                work.spent += 1;
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
                if !work.charge(self.slots as u64) {
                    break;
                }
                // Charged as read, but skipped when no exchange with b can win: one of the
                // two GPUs ends at their mean or above (less `eps` for rounding), the
                // hottest at `lh - rx` or above.
                let mean = 0.5 * (lh + st.loads[b]) - eps;
                if best.beats_all_above(rest.max(mean).max(lh - rx)) {
                    continue;
                }
                self.offer_exchanges_with(st, (sa, b), rest, free, best);
            }
            for &h in &self.holders[x] {
                st.on_x[h as usize] = 0;
            }
            if work.exhausted {
                break;
            }
        }
        for s in hot_slots {
            st.on_hot[self.slot[s]] = 0;
        }
    }

    /// Offers `best` the exchanges of slot `sa` (on the hottest GPU) with each expert on GPU
    /// `b`, the hottest load outside the two being `rest`.
    fn offer_exchanges_with(
        &self,
        st: &mut State,
        (sa, b): (usize, usize),
        rest: f64,
        free: bool,
        best: &mut Best,
    ) {
        let hot = sa / self.slots;
        let x = self.slot[sa];
        let rx = st.rep[x];
        let (lh, lb) = (st.loads[hot], st.loads[b]);
        let visit = st.next_visit();
        for sb in b * self.slots..(b + 1) * self.slots {
            let y = self.slot[sb];
            if y == x || st.on_hot[y] >= st.cap[y] || !State::first_in(&mut st.seen, visit, y) {
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

    /// Offers `best` every re-assignment of a surplus replica: one on the hottest GPU
    /// (`top[0]`) to a heavy expert, or one anywhere to an expert on the hottest GPU.
    fn offer_reassignments(
        &self,
        st: &mut State,
        top: &[usize],
        free: bool,
        targets: Targets<'_>,
        best: &mut Best,
        work: &mut Work,
    ) {
        let (hot, eps, cur_max) = (top[0], best.eps, best.cur_max);
        let visit = st.next_visit();
        targets.hot_experts.clear();
        targets.hot_experts.extend(
            (hot * self.slots..(hot + 1) * self.slots)
                .map(|s| self.slot[s])
                .filter(|&e| State::first_in(&mut st.seen, visit, e)),
        );
        let mut cur_ssq: Option<f64> = None;
        let mut visit = 0;
        'reassign: for s in 0..self.slot.len() {
            if work.exhausted {
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
            let candidates: &[usize] = if g == hot {
                targets.heavy
            } else {
                &targets.hot_experts[..]
            };
            for &y in candidates {
                if y == x {
                    continue;
                }
                // Charged in full even when the bound below skips the reading, so that
                // the budget runs out where it would without the bound.
                if !work.charge((1 + self.holders[x].len() + self.holders[y].len()) as u64) {
                    break 'reassign;
                }
                let dm = self.cost(g, y, free) - self.cost(g, x, free);
                if dm > best.budget {
                    continue;
                }
                // A lower bound on the new hottest load, in constant time: most candidates
                // cannot beat the best step found so far.
                let floor = self.reassign_floor(s, g, y, top, st);
                if floor > cur_max
                    || best.primary() && floor >= cur_max - eps
                    || best.beats_all_above(floor)
                {
                    continue;
                }
                let Some(new_max) = self.reassign_max(s, g, y, top, st) else {
                    continue;
                };
                let ssq_gain = if new_max < cur_max - eps {
                    0.0 // not read: the step lowers the hottest load
                } else if new_max > cur_max || best.primary() {
                    continue;
                } else {
                    work.spent += self.gpus as u64;
                    let cur = *cur_ssq.get_or_insert_with(|| st.loads.iter().map(|l| l * l).sum());
                    cur - self.reassign_ssq(s, y, st)
                };
                best.offer(new_max, ssq_gain, dm, Step::Reassign(s, y));
            }
        }
    }

    /// Takes `step`, updating the loads in `st` (`touched`: scratch for the GPUs a
    /// re-assignment changes); returns the moved replicas it adds.
    fn apply(&mut self, step: Step, st: &mut State, free: bool, touched: &mut Vec<u32>) -> i64 {
        match step {
            Step::Swap(sa, sb) => {
                let (ga, gb) = (sa / self.slots, sb / self.slots);
                let (x, y) = (self.slot[sa], self.slot[sb]);
                let moves = self.cost(ga, y, free) + self.cost(gb, x, free)
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
                moves
            }
            Step::Reassign(s, y) => {
                let g = s / self.slots;
                let x = self.slot[s];
                // Every GPU holding x or y changes load (their shares change).
                touched.clear();
                touched.extend(self.holders[x].iter().chain(&self.holders[y]).copied());
                let moves = self.cost(g, y, free) - self.cost(g, x, free);
                self.take(s);
                self.put(s, y);
                for e in [x, y] {
                    st.recount(self, e);
                }
                for &h in touched.iter() {
                    let load = self.gpu_load(h as usize, &st.rep);
                    st.set_load(h as usize, load);
                }
                moves
            }
        }
    }
}

/// The work one domain's search has spent, against its budget.
struct Work {
    spent: u64,
    budget: u64,
    /// Set once `spent` passed `budget`: the search stops after the best step found so far.
    exhausted: bool,
}

impl Work {
    /// Charges `units`; false (and exhausted) once the budget is passed.
    fn charge(&mut self, units: u64) -> bool {
        self.spent += units;
        if self.spent > self.budget {
            self.exhausted = true;
        }
        !self.exhausted
    }
}

/// The experts a re-assignment may give a slot to.
struct Targets<'a> {
    /// The heaviest experts by load per replica (for a slot on the hottest GPU).
    heavy: &'a [usize],
    /// The experts on the hottest GPU (for a slot anywhere else); filled per round.
    hot_experts: &'a mut Vec<usize>,
}

/// The [`HEAVY`] experts of the `n` with the highest load per replica, heaviest first (ties
/// by index), into `heavy`.
fn rank_heavy(st: &State, n: usize, heavy: &mut Vec<usize>) {
    heavy.clear();
    heavy.extend(0..n);
    let by_rep = |a: &usize, b: &usize| st.rep[*b].total_cmp(&st.rep[*a]).then(a.cmp(b));
    if heavy.len() > HEAVY {
        heavy.select_nth_unstable_by(HEAVY - 1, by_rep);
        heavy.truncate(HEAVY);
    }
    heavy.sort_by(by_rep);
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_capped, domain};
    use super::*;

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
