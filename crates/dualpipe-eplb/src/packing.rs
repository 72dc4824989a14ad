//! Placement inside one domain (a node, or every GPU for the global policy): duplicate-free
//! packing of replicas onto GPUs and the bounded local search that improves it.
//!
//! A domain owns `gpus` consecutive GPUs with `slots` slots each and a fixed set of logical
//! experts; every one of those experts gets at least one replica in the domain and no replica of
//! another expert lands there. Each replica of expert `e` serves `load[e] / count[e]` tokens, and a
//! GPU's load is the sum over its slots.
//!
//! Duplicate-free means: a GPU holds at most `ceil(count[e] / gpus)` replicas of `e`, which is one
//! unless the expert has more replicas than the domain has GPUs.

use std::collections::BTreeSet;

/// Whether a value is exactly "no expert" in a slot being filled.
const EMPTY: usize = usize::MAX;

/// Tuning of the local search; see [`crate::improved::PlannerOptions`] for the public knobs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SearchLimits {
    /// Stop once the domain's hottest GPU is at or below this load.
    pub target: f64,
    /// Give up before the number of moved replicas (slots whose expert was not on that GPU
    /// before) would exceed this.
    pub max_moves: usize,
    /// At most this many accepted steps.
    pub max_steps: usize,
    /// When true, moving a replica costs nothing (planning from scratch).
    pub free_moves: bool,
}

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
    /// Replicas of expert `e` on GPU `g`, at `g * experts + e`.
    on: Vec<u32>,
    /// The same counts by expert, at `e * gpus + g` (one expert's GPUs read in a row).
    on_by_expert: Vec<u32>,
    /// Whether expert `e` was on GPU `g` before this rebalance, at `g * experts + e`.
    orig: Vec<bool>,
    /// Slack (absolute load) within which a GPU that held the expert before wins a packing tie.
    prefer_slack: f64,
    /// Whether any expert was on any GPU before (else no packing tie goes to a previous GPU).
    any_orig: bool,
    /// Empty slots of each GPU.
    free: Vec<usize>,
    /// Per GPU, a slot index at or below its first empty slot (every slot before it is full).
    first_empty: Vec<usize>,
}

/// The local search's work floor per domain (2^20), in units of one candidate evaluated per GPU
/// it touches (see [`Domain::improve`]). The plans of DeepSeek-V3's shapes (58 x 256 experts
/// on 32 GPUs in 4 nodes, 61 x 1024 on 128 GPUs in 8 nodes) never reach it and are unchanged;
/// single-node domains of 64 or more GPUs do, and are bounded by it.
const WORK_FLOOR: u64 = 1 << 20;

/// The local search's work allowance per slot and expert of a domain above the floor.
const WORK_PER_ITEM: u64 = 64;

/// An `f64` ordered by [`f64::total_cmp`], for heaps.
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
        let any_orig = orig.contains(&true);
        Self::with_orig(gpus, slots, load, orig, any_orig, near_equal)
    }

    /// An empty domain without a previous placement (no expert was on any GPU before). Its
    /// tables are allocated zeroed and only touched where used, so a huge fresh domain costs
    /// little before it is filled.
    pub fn fresh(gpus: usize, slots: usize, load: Vec<f64>, near_equal: f64) -> Self {
        let orig = vec![false; gpus * load.len()];
        Self::with_orig(gpus, slots, load, orig, false, near_equal)
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
        debug_assert_eq!(orig.len(), gpus * experts);
        let total: f64 = load.iter().sum();
        Domain {
            gpus,
            slots,
            count: vec![0; experts],
            on: vec![0; gpus * experts],
            on_by_expert: vec![0; gpus * experts],
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
        let n = self.experts();
        self.slot[s] = e;
        self.count[e] += 1;
        self.on[g * n + e] += 1;
        self.on_by_expert[e * self.gpus + g] += 1;
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
        let n = self.experts();
        self.slot[s] = EMPTY;
        self.count[e] -= 1;
        self.on[g * n + e] -= 1;
        self.on_by_expert[e * self.gpus + g] -= 1;
        self.free[g] += 1;
        self.first_empty[g] = self.first_empty[g].min(s);
        e
    }

    /// Replicas of `e` on GPU `g`.
    pub fn on(&self, g: usize, e: usize) -> u32 {
        self.on[g * self.experts() + e]
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
        let n = self.experts();
        self.slot
            .iter()
            .enumerate()
            .filter(|&(s, &e)| e != EMPTY && !self.orig[(s / self.slots) * n + e])
            .count()
    }

    /// Move cost of having `e` on GPU `g`.
    fn cost(&self, g: usize, e: usize, free: bool) -> i64 {
        i64::from(!free && !self.orig[g * self.experts() + e])
    }

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
    pub fn trim_to_fair_counts(&mut self) {
        let n = self.experts();
        let mut fair = vec![0usize; n];
        for _ in 0..self.slot.len() {
            let e = (0..n)
                .max_by(|&a, &b| {
                    let key = |e: usize| {
                        if fair[e] == 0 {
                            (1u8, self.load[e])
                        } else {
                            (0u8, self.load[e] / fair[e] as f64)
                        }
                    };
                    let (ka, kb) = (key(a), key(b));
                    ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1)).then(b.cmp(&a))
                })
                .expect("a domain has at least one expert");
            fair[e] += 1;
        }
        for (e, &keep) in fair.iter().enumerate() {
            while self.count[e] > keep {
                let loads = self.gpu_loads();
                let s = (0..self.slot.len())
                    .filter(|&s| self.slot[s] == e)
                    .max_by(|&a, &b| {
                        loads[a / self.slots]
                            .total_cmp(&loads[b / self.slots])
                            .then(b.cmp(&a))
                    })
                    .expect("the expert has replicas");
                self.take(s);
            }
        }
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
        // Decide the replica counts: each extra slot to the expert with the highest load per
        // replica (an expert without one first; ties to the lower index).
        let mut final_count = self.count.clone();
        let mut extra = Vec::with_capacity(free);
        let key = |e: usize, count: usize, load: &[f64]| {
            if count == 0 {
                (1u8, Total(load[e]), std::cmp::Reverse(e))
            } else {
                (0u8, Total(load[e] / count as f64), std::cmp::Reverse(e))
            }
        };
        let mut heap: std::collections::BinaryHeap<_> = (0..self.experts())
            .map(|e| key(e, final_count[e], &self.load))
            .collect();
        for _ in 0..free {
            let (_, _, std::cmp::Reverse(e)) =
                heap.pop().expect("a domain has at least one expert");
            final_count[e] += 1;
            extra.push(e);
            heap.push(key(e, final_count[e], &self.load));
        }
        // Heaviest replicas first (longest-processing-time order).
        extra.sort_by(|&a, &b| {
            let la = self.share(a, final_count[a]);
            let lb = self.share(b, final_count[b]);
            lb.total_cmp(&la).then(a.cmp(&b))
        });
        // Loads as they will be once every replica is in: kept replicas already count at their
        // final share.
        let mut loads = vec![0.0; self.gpus];
        for (s, &e) in self.slot.iter().enumerate() {
            if e != EMPTY {
                loads[s / self.slots] += self.share(e, final_count[e]);
            }
        }
        // GPUs with room, by (load, index): the least-loaded one that may take a replica is
        // found without scanning every GPU.
        let rebuild = |d: &Domain, loads: &[f64]| -> BTreeSet<(Total, usize)> {
            (0..d.gpus)
                .filter(|&g| d.has_room(g))
                .map(|g| (Total(loads[g]), g))
                .collect()
        };
        let mut ready = rebuild(self, &loads);
        for e in extra {
            let cap = self.cap(final_count[e]);
            let share = self.share(e, final_count[e]);
            let g = self.pick_gpu(e, cap, &loads, &ready);
            let s = match g {
                Some(g) => self.first_free(g).expect("picked GPU has room"),
                None => self.swap_in(e, cap, &final_count, &mut loads),
            };
            self.put(s, e);
            let h = s / self.slots;
            if g.is_some() {
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
    fn pick_gpu(
        &self,
        e: usize,
        cap: u32,
        loads: &[f64],
        ready: &BTreeSet<(Total, usize)>,
    ) -> Option<usize> {
        let ok = |g: usize| self.has_room(g) && self.on(g, e) < cap;
        let best = ready
            .iter()
            .map(|&(_, g)| g)
            .find(|&g| self.on(g, e) < cap)?;
        if !self.any_orig {
            return Some(best);
        }
        let n = self.experts();
        let preferred = (0..self.gpus)
            .filter(|&g| {
                ok(g) && self.orig[g * n + e] && loads[g] <= loads[best] + self.prefer_slack
            })
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

    /// Improves the placement by exchanging replicas between GPUs and re-assigning surplus
    /// replicas to other experts, always lowering (hottest load, sum of squared loads). Picks the
    /// step with the most gain per moved replica. Returns whether the target was reached.
    ///
    /// Bounded by `limits.max_steps` accepted steps and by work: every candidate evaluated
    /// costs one unit per GPU its evaluation reads (one for an exchange, all of them for a
    /// re-assignment), every step a unit per slot, and the search stops (after the best step
    /// found so far) once it has spent `max(WORK_FLOOR, WORK_PER_ITEM x (slots + experts))`.
    pub fn improve(&mut self, limits: &SearchLimits) -> bool {
        let eps = 1e-12 * self.load.iter().sum::<f64>().max(1e-300);
        let items = (self.slot.len() + self.experts()) as u64;
        let work_budget = WORK_FLOOR.max(WORK_PER_ITEM.saturating_mul(items));
        let mut work: u64 = 0;
        let mut exhausted = false;
        let mut moves = if limits.free_moves {
            0
        } else {
            self.moves() as i64
        };
        for _ in 0..limits.max_steps {
            if exhausted {
                break;
            }
            work += (self.slot.len() + self.gpus) as u64;
            let loads = self.gpu_loads();
            let mut order: Vec<usize> = (0..self.gpus).collect();
            order.sort_by(|&a, &b| loads[b].total_cmp(&loads[a]).then(a.cmp(&b)));
            let hot = order[0];
            let cur_max = loads[hot];
            if cur_max <= limits.target + eps {
                return true;
            }
            let cur_ssq: f64 = loads.iter().map(|l| l * l).sum();
            let budget = i64::try_from(limits.max_moves).unwrap_or(i64::MAX) - moves;
            let mut best: Option<(bool, f64, Step)> = None;
            let mut consider = |new_max: f64, ssq_gain: f64, dmoves: i64, step: Step| {
                if dmoves > budget {
                    return;
                }
                let primary = new_max < cur_max - eps;
                if !(primary || new_max <= cur_max && ssq_gain > eps) {
                    return;
                }
                let gain = if primary { cur_max - new_max } else { ssq_gain };
                let score = gain / (dmoves.max(0) as f64 + 0.25);
                let better = match &best {
                    None => true,
                    Some((p, s, _)) => (primary, score) > (*p, *s),
                };
                if better {
                    best = Some((primary, score, step));
                }
            };
            let max_excluding = |a: usize, b: usize| -> f64 {
                order
                    .iter()
                    .find(|&&g| g != a && g != b)
                    .map_or(0.0, |&g| loads[g])
            };
            let n = self.experts();
            // Exchanges between the hottest GPU and any other.
            'swaps: for sa in hot * self.slots..(hot + 1) * self.slots {
                let x = self.slot[sa];
                let rx = self.share(x, self.count[x]);
                for b in (0..self.gpus).filter(|&b| b != hot) {
                    work += self.slots as u64;
                    if work > work_budget {
                        exhausted = true;
                        break 'swaps;
                    }
                    let rest = max_excluding(hot, b);
                    for sb in b * self.slots..(b + 1) * self.slots {
                        let y = self.slot[sb];
                        if y == x
                            || self.on(hot, y) >= self.cap(self.count[y])
                            || self.on(b, x) >= self.cap(self.count[x])
                        {
                            continue;
                        }
                        let ry = self.share(y, self.count[y]);
                        let la = loads[hot] - rx + ry;
                        let lb = loads[b] - ry + rx;
                        let new_max = la.max(lb).max(rest);
                        let ssq_gain =
                            loads[hot] * loads[hot] + loads[b] * loads[b] - la * la - lb * lb;
                        let free = limits.free_moves;
                        let dm = self.cost(hot, y, free) + self.cost(b, x, free)
                            - self.cost(hot, x, free)
                            - self.cost(b, y, free);
                        consider(new_max, ssq_gain, dm, Step::Swap(sa, sb));
                    }
                }
            }
            // Re-assign a surplus replica: one on the hottest GPU to a heavy expert, or one
            // anywhere to an expert on the hottest GPU.
            let mut heavy: Vec<usize> = (0..n).collect();
            heavy.sort_by(|&a, &b| {
                let ra = self.share(a, self.count[a]);
                let rb = self.share(b, self.count[b]);
                rb.total_cmp(&ra).then(a.cmp(&b))
            });
            heavy.truncate(16);
            let on_hot: Vec<usize> = (hot * self.slots..(hot + 1) * self.slots)
                .map(|s| self.slot[s])
                .collect();
            'reassign: for s in 0..self.slot.len() {
                if exhausted {
                    break;
                }
                let x = self.slot[s];
                if self.count[x] < 2 {
                    continue;
                }
                let targets: &[usize] = if s / self.slots == hot {
                    &heavy
                } else {
                    &on_hot
                };
                for &y in targets {
                    if y == x {
                        continue;
                    }
                    work += self.gpus as u64;
                    if work > work_budget {
                        exhausted = true;
                        break 'reassign;
                    }
                    if let Some((new_max, ssq)) = self.eval_reassign(s, y, &loads) {
                        let g = s / self.slots;
                        let free = limits.free_moves;
                        let dm = self.cost(g, y, free) - self.cost(g, x, free);
                        consider(new_max, cur_ssq - ssq, dm, Step::Reassign(s, y));
                    }
                }
            }
            let Some((_, _, step)) = best else {
                return false;
            };
            let free = limits.free_moves;
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
                }
                Step::Reassign(s, y) => {
                    let g = s / self.slots;
                    let x = self.take(s);
                    moves += self.cost(g, y, free) - self.cost(g, x, free);
                    self.put(s, y);
                }
            }
        }
        self.max_load() <= limits.target + eps
    }

    /// Lowers the number of moved replicas by exchanging replicas between GPUs, each exchange
    /// bringing a moved replica back to a GPU that held its expert before, while no GPU goes
    /// above `cap_load` and no expert above its per-GPU cap. First-improvement sweeps, at most
    /// `max_sweeps`. Returns the number of exchanges made.
    pub fn reduce_moves(&mut self, cap_load: f64, max_sweeps: usize) -> usize {
        let n = self.experts();
        let mut loads = self.gpu_loads();
        let mut done = 0;
        for _ in 0..max_sweeps {
            let mut changed = false;
            for a in 0..self.slot.len() {
                let ga = a / self.slots;
                let x = self.slot[a];
                if self.orig[ga * n + x] {
                    continue;
                }
                let rx = self.share(x, self.count[x]);
                let mut best: Option<(i64, f64, usize)> = None;
                for h in (0..self.gpus).filter(|&h| h != ga && self.orig[h * n + x]) {
                    if self.on(h, x) >= self.cap(self.count[x]) {
                        continue;
                    }
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
        done
    }

    /// Loads after slot `s` switches to expert `y`: (hottest load, sum of squares), or `None`
    /// when a cap would be broken.
    fn eval_reassign(&self, s: usize, y: usize, loads: &[f64]) -> Option<(f64, f64)> {
        let g0 = s / self.slots;
        let x = self.slot[s];
        let (cx, cy) = (self.count[x], self.count[y]);
        let cap_x = self.cap(cx - 1);
        let cap_y = self.cap(cy + 1);
        if self.on(g0, y) + 1 > cap_y {
            return None;
        }
        let (rx_old, rx_new) = (self.share(x, cx), self.share(x, cx - 1));
        let (ry_old, ry_new) = (self.share(y, cy), self.share(y, cy + 1));
        let mut max = 0.0f64;
        let mut ssq = 0.0;
        let on_x = &self.on_by_expert[x * self.gpus..(x + 1) * self.gpus];
        let on_y = &self.on_by_expert[y * self.gpus..(y + 1) * self.gpus];
        for (g, &l) in loads.iter().enumerate() {
            let mut nx = on_x[g];
            let mut ny = on_y[g];
            let mut l = l - f64::from(nx) * rx_old - f64::from(ny) * ry_old;
            if g == g0 {
                nx -= 1;
                ny += 1;
            }
            if nx > cap_x {
                return None;
            }
            l += f64::from(nx) * rx_new + f64::from(ny) * ry_new;
            max = max.max(l);
            ssq += l * l;
        }
        Some((max, ssq))
    }
}

/// One local-search step.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Exchange the experts of two slots on different GPUs.
    Swap(usize, usize),
    /// Give a slot (holding a surplus replica) to another expert.
    Reassign(usize, usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain(loads: &[f64], gpus: usize, slots: usize) -> Domain {
        Domain::new(
            gpus,
            slots,
            loads.to_vec(),
            vec![false; gpus * loads.len()],
            0.0,
        )
    }

    fn assert_capped(d: &Domain) {
        for g in 0..d.gpus {
            for e in 0..d.experts() {
                assert!(d.on(g, e) <= d.cap(d.count[e]), "gpu {g} expert {e}");
            }
        }
    }

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

    #[test]
    fn search_never_worsens_and_keeps_caps() {
        let loads: Vec<f64> = (0..24).map(|i| 1.0 + ((i * 7919) % 13) as f64).collect();
        let mut d = domain(&loads, 4, 7);
        d.fill();
        let before = d.max_load();
        d.improve(&SearchLimits {
            target: 0.0,
            max_moves: usize::MAX,
            max_steps: 200,
            free_moves: true,
        });
        assert!(d.max_load() <= before + 1e-9);
        assert_capped(&d);
        assert!(d.count.iter().all(|&c| c >= 1));
    }

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
            max_moves: 2,
            max_steps: 100,
            free_moves: false,
        });
        assert!(d.moves() <= 2);
    }
}
