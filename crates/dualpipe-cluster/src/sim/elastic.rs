//! The elastic policy (EPLB for the cluster). At every event:
//!
//! 1. **Admit** queued jobs in arrival order at their `min_gpus` while devices are free; a job
//!    that does not fit may take devices from running elastic jobs shrunk toward their
//!    `min_gpus`, when their move budget allows; a job that still does not fit waits, and later
//!    jobs that fit pass it (backfilling).
//! 2. **Size** the admitted jobs: first up to their requested `gpus` in arrival order, then, when
//!    nobody waits, every free device goes by marginal gain (the rate one more device adds, from
//!    the throughput model) to admitted and running elastic jobs up to `max_gpus`. A running
//!    job is grown only when the move pays (below) and its budget allows.
//! 3. **Place** the admitted jobs that fit in a node by Kuhn-Munkres on a job x node reward
//!    (placed first, then the tightest fit: the fewest devices left free in the node), in
//!    rounds of one job per node; the others take the emptiest nodes.
//! 4. **Migrate** a running job spread over more nodes than it needs into one node with room,
//!    or a job larger than a node onto the fewest nodes with room, when the move pays and its
//!    budget allows.
//!
//! A move pays when the time it saves exceeds its cost. The scheduler does not know a job's
//! remaining work (no policy reads `duration_s`); it estimates it from what it has seen
//! ([`State::remaining_estimate`]: the mean of the same user's last two finished jobs less the
//! work done, or else the work done so far, the least-attained-service prior):
//! saved = estimate x (1 / old rate - 1 / new rate).
//! The budget: a job's pauses for moves, this one included, stay at most `overhead_budget` of
//! its run time so far, so at most that share of its whole run time.

use serde::Serialize;

use crate::cluster::Cluster;
use crate::sim::assign::assign;
use crate::sim::place::spread;
use crate::sim::queue::Need;
use crate::sim::state::State;

/// The elastic policy's parameters (documented in docs/cluster.md).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ElasticParams {
    /// Largest share of a job's run time it may spend paused by moves.
    pub overhead_budget: f64,
    /// Grow jobs beyond their requested `gpus` when nobody waits.
    pub grow: bool,
    /// Shrink running jobs to admit waiting ones.
    pub shrink: bool,
    /// Migrate spread jobs into one node.
    pub consolidate: bool,
}

impl Default for ElasticParams {
    fn default() -> Self {
        ElasticParams {
            overhead_budget: 0.05,
            grow: true,
            shrink: true,
            consolidate: true,
        }
    }
}

/// Whether job `j` may pause `cost` more seconds within its budget.
fn within_budget(params: &ElasticParams, state: &State<'_>, j: usize, cost: f64, now: f64) -> bool {
    state.progress[j].overhead_s + cost <= params.overhead_budget * state.run_time(j, now)
}

/// Seconds a move from `old_rate` to `new_rate` saves on the estimated remaining work
/// ([`State::remaining_estimate`]).
fn saving(state: &State<'_>, j: usize, old_rate: f64, new_rate: f64) -> f64 {
    if old_rate <= 0.0 || new_rate <= 0.0 {
        return 0.0;
    }
    state.remaining_estimate(j) * (1.0 / old_rate - 1.0 / new_rate)
}

/// One elastic scheduling pass at `now`.
pub fn schedule(params: &ElasticParams, state: &mut State<'_>, now: f64) {
    let devices = state.cluster.devices();
    // 1. Admit.
    let Admission {
        mut admitted,
        shrinks,
        mut free,
        waiting,
    } = admit(params, state, now);
    for &(i, k) in &shrinks {
        let r = &state.running[i];
        let keep = keep_devices(state, &r.devices, k);
        let j = r.job;
        state.reshape(j, keep, now);
    }
    // 2. Size: up to the requested count in arrival order, then by marginal gain.
    for (j, k) in admitted.iter_mut() {
        let add = (state.jobs[*j].gpus.min(devices) - *k).min(free);
        *k += add;
        free -= add;
    }
    let mut grow_running: Vec<(usize, usize)> = Vec::new(); // (job, new count)
    if params.grow && !waiting && free > 0 {
        grow(
            params,
            state,
            &mut admitted,
            &mut grow_running,
            &mut free,
            now,
        );
    }
    // 3. Place the admitted jobs.
    place(state, admitted, now);
    for (j, k) in grow_running {
        let Some(r) = state.running.iter().find(|r| r.job == j) else {
            continue;
        };
        let own = r.devices.clone();
        let old_rate = r.rate;
        let prefer: Vec<usize> = own.iter().map(|&d| state.cluster.node_of[d]).collect();
        if let Some(extra) = spread(state, k - own.len(), &prefer) {
            let mut all = own;
            all.extend(extra);
            all.sort_unstable();
            // The sizing step rated the count placed compactly; the free devices may lie on
            // many nodes. Grow only if the job is faster on the devices it actually gets, by
            // more than the move costs.
            let job = &state.jobs[j];
            let new_rate = state.throughput.rate(j, job, &all);
            if saving(state, j, old_rate, new_rate) > state.move_cost(j, all.len()) {
                state.reshape(j, all, now);
            }
        }
    }
    // 4. Consolidate.
    if params.consolidate {
        consolidate(params, state, now);
    }
}

/// What the admission step decided.
#[derive(Debug, PartialEq)]
struct Admission {
    /// The admitted jobs with their `min_gpus`, in queue order.
    admitted: Vec<(usize, usize)>,
    /// The planned shrinks: (running index, new count).
    shrinks: Vec<(usize, usize)>,
    /// The devices left free after both.
    free: usize,
    /// Whether a job is left waiting.
    waiting: bool,
}

/// Admits each waiting job that fits the free devices, or the free devices and what shrinking
/// the candidates frees, in queue order (later jobs that fit pass one that does not). A job
/// that does not fit changes nothing, and what fits only falls, so the queue's index skips
/// straight to the next job that fits.
fn admit(params: &ElasticParams, state: &State<'_>, now: f64) -> Admission {
    let devices = state.cluster.devices();
    let mut free = state.free();
    let mut admitted = Vec::new();
    let mut shrinks = Vec::new();
    let mut candidates = if params.shrink && !state.queue.is_empty() {
        shrinkable(params, state, now)
    } else {
        Vec::new()
    };
    let mut surplus: usize = candidates.iter().map(|c| c.1).sum();
    let mut from = 0;
    while let Some((pos, j)) = state.queue.next_fitting(from, Need::Least, free + surplus) {
        let need = state.jobs[j].min_gpus.min(devices);
        if need > free {
            free += shrink_for(&mut candidates, state, need - free, &mut shrinks);
            surplus = candidates.iter().map(|c| c.1).sum();
        }
        admitted.push((j, need));
        free -= need;
        from = pos + 1;
    }
    Admission {
        waiting: admitted.len() < state.queue.len(),
        admitted,
        shrinks,
        free,
    }
}

/// The running elastic jobs that may be shrunk in this pass: (running index, surplus over
/// `min_gpus`), most surplus first. A job planned for a shrink leaves the list, so each is
/// shrunk at most once per pass.
fn shrinkable(params: &ElasticParams, state: &State<'_>, now: f64) -> Vec<(usize, usize)> {
    let mut candidates: Vec<(usize, usize)> = Vec::new();
    for (i, r) in state.running.iter().enumerate() {
        if r.paused_until > now {
            continue;
        }
        let min = state.jobs[r.job].min_gpus;
        let held = r.devices.len();
        if held > min && within_budget(params, state, r.job, state.move_cost(r.job, held), now) {
            candidates.push((i, held - min));
        }
    }
    candidates.sort_by_key(|&(i, s)| (std::cmp::Reverse(s), i));
    candidates
}

/// Plans shrinks of `candidates` (from [`shrinkable`]) freeing `need` devices; returns how many
/// it frees (all of `need`, or 0 when that many cannot be freed).
fn shrink_for(
    candidates: &mut Vec<(usize, usize)>,
    state: &State<'_>,
    need: usize,
    shrinks: &mut Vec<(usize, usize)>,
) -> usize {
    if candidates.iter().map(|c| c.1).sum::<usize>() < need {
        return 0;
    }
    let mut left = need;
    let mut used = 0;
    for &(i, surplus) in candidates.iter() {
        if left == 0 {
            break;
        }
        let take = surplus.min(left);
        shrinks.push((i, state.running[i].devices.len() - take));
        left -= take;
        used += 1;
    }
    candidates.drain(..used);
    need
}

/// The `k` of `devices` to keep: those on the nodes holding most of them.
fn keep_devices(state: &State<'_>, devices: &[usize], k: usize) -> Vec<usize> {
    let mut sorted = devices.to_vec();
    let count = |d: usize| {
        devices
            .iter()
            .filter(|&&e| state.cluster.node_of[e] == state.cluster.node_of[d])
            .count()
    };
    sorted.sort_by_key(|&d| (std::cmp::Reverse(count(d)), d));
    let mut keep = sorted[..k].to_vec();
    keep.sort_unstable();
    keep
}

/// Hands the free devices out one by one by marginal gain to admitted jobs (free) and running
/// elastic jobs (a move: kept only when it pays and fits the budget).
fn grow(
    params: &ElasticParams,
    state: &mut State<'_>,
    admitted: &mut [(usize, usize)],
    grow_running: &mut Vec<(usize, usize)>,
    free: &mut usize,
    now: f64,
) {
    // Candidates: (job, current count, target count, running?).
    let mut cands: Vec<(usize, usize, usize, bool)> =
        admitted.iter().map(|&(j, k)| (j, k, k, false)).collect();
    for r in &state.running {
        if r.paused_until <= now {
            let k = r.devices.len();
            cands.push((r.job, k, k, true));
        }
    }
    let devices = state.cluster.devices();
    while *free > 0 {
        let mut best: Option<(f64, usize)> = None;
        for (c, &(j, _, k, _)) in cands.iter().enumerate() {
            if k >= state.jobs[j].max_gpus.min(devices) {
                continue;
            }
            let job = &state.jobs[j];
            let gain =
                state.throughput.rate_at(j, job, k + 1) - state.throughput.rate_at(j, job, k);
            if gain > 0.0 && best.is_none_or(|(g, _)| gain > g) {
                best = Some((gain, c));
            }
        }
        let Some((_, c)) = best else { break };
        cands[c].2 += 1;
        *free -= 1;
    }
    for (j, k0, k, running) in cands {
        if k == k0 {
            continue;
        }
        if !running {
            if let Some(a) = admitted.iter_mut().find(|a| a.0 == j) {
                a.1 = k;
            }
            continue;
        }
        let job = &state.jobs[j];
        let old = state.throughput.rate_at(j, job, k0);
        let new = state.throughput.rate_at(j, job, k);
        let cost = state.move_cost(j, k);
        if saving(state, j, old, new) > cost && within_budget(params, state, j, cost, now) {
            grow_running.push((j, k));
        } else {
            *free += k - k0;
        }
    }
}

/// Places admitted `(job, count)` pairs: node-sized ones by Kuhn-Munkres rounds, the rest
/// spread over the emptiest nodes.
fn place(state: &mut State<'_>, mut pending: Vec<(usize, usize)>, now: f64) {
    let largest = state.cluster.largest_node();
    // Larger jobs first: multi-node ones take the emptiest nodes before small ones split them.
    pending.sort_by_key(|&(j, k)| (std::cmp::Reverse(k), j));
    let (mut small, big): (Vec<_>, Vec<_>) = pending.into_iter().partition(|&(_, k)| k <= largest);
    for (j, k) in big {
        let devices = spread(state, k, &[]).expect("admitted within the free devices");
        state.start(j, devices, now);
    }
    let nodes = state.cluster.nodes.len();
    while !small.is_empty() {
        let rows = small.len().min(nodes);
        let reward: Vec<Vec<Option<i64>>> = small[..rows]
            .iter()
            .map(|&(_, k)| {
                (0..nodes)
                    .map(|n| {
                        let f = state.free_per_node[n];
                        (f >= k).then(|| 1_000_000 - 1000 * (f - k) as i64 + k as i64)
                    })
                    .collect()
            })
            .collect();
        let answer = assign(&reward);
        if answer.iter().all(Option::is_none) {
            break;
        }
        let mut placed = Vec::new();
        for (row, slot) in answer.iter().enumerate() {
            if let Some(n) = *slot {
                let (j, k) = small[row];
                let devices = state.free_devices_of(n)[..k].to_vec();
                state.start(j, devices, now);
                placed.push(row);
            }
        }
        for row in placed.into_iter().rev() {
            small.remove(row);
        }
    }
    // No node has room for these: spread them (consolidated later when a node frees up).
    for (j, k) in small {
        let devices = spread(state, k, &[]).expect("admitted within the free devices");
        state.start(j, devices, now);
    }
}

/// Moves running jobs spread over more nodes than they need into the tightest node with room.
fn consolidate(params: &ElasticParams, state: &mut State<'_>, now: f64) {
    let largest = state.cluster.largest_node();
    // Indices into `state.running`, which a reshape keeps in place.
    let candidates: Vec<usize> = state
        .running
        .iter()
        .enumerate()
        .filter(|(_, r)| r.paused_until <= now)
        .filter(|(_, r)| {
            let first = state.cluster.node_of[r.devices[0]];
            r.devices.iter().any(|&d| state.cluster.node_of[d] != first)
        })
        .map(|(i, _)| i)
        .collect();
    // The most free devices on one node: a node the job does not use needs k of them.
    let mut max_free = state.free_per_node.iter().copied().max().unwrap_or(0);
    for i in candidates {
        let r = &state.running[i];
        let j = r.job;
        if r.devices.len() > largest {
            consolidate_wide(params, state, i, largest, now);
            max_free = state.free_per_node.iter().copied().max().unwrap_or(0);
            continue;
        }
        let k = r.devices.len();
        let node_of = |d: usize| state.cluster.node_of[d];
        let own_room = |n: usize| {
            state.free_per_node[n] + r.devices.iter().filter(|&&d| node_of(d) == n).count()
        };
        if max_free < k && r.devices.iter().all(|&d| own_room(node_of(d)) < k) {
            continue; // no node has room for the whole job
        }
        let own = r.devices.clone();
        let old_rate = r.rate;
        let mine = own_per_node(state, &own);
        let room = |n: usize| state.free_per_node[n] + mine[n];
        let Some(n) = (0..state.cluster.nodes.len())
            .filter(|&n| room(n) >= k)
            .min_by_key(|&n| (room(n), n))
        else {
            continue;
        };
        let mut devices: Vec<usize> = own
            .iter()
            .copied()
            .filter(|&d| state.cluster.node_of[d] == n)
            .collect();
        for d in state.free_devices_of(n) {
            if devices.len() < k {
                devices.push(d);
            }
        }
        devices.sort_unstable();
        let new_rate = state.throughput.rate(j, &state.jobs[j], &devices);
        let cost = state.move_cost(j, k);
        if saving(state, j, old_rate, new_rate) > cost && within_budget(params, state, j, cost, now)
        {
            state.reshape(j, devices, now);
            max_free = state.free_per_node.iter().copied().max().unwrap_or(0);
        }
    }
}

/// How many nodes `devices` lie on (devices are numbered node after node, so a sorted list
/// changes node where it crosses one).
fn nodes_spanned(cluster: &Cluster, devices: &[usize]) -> usize {
    let node_of = |d: usize| cluster.node_of[d];
    if devices.is_sorted() {
        1 + devices
            .windows(2)
            .filter(|w| node_of(w[0]) != node_of(w[1]))
            .count()
    } else {
        let mut nodes: Vec<usize> = devices.iter().map(|&d| node_of(d)).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes.len()
    }
}

/// How many of `devices` lie on each node.
fn own_per_node(state: &State<'_>, devices: &[usize]) -> Vec<usize> {
    let mut per_node = vec![0; state.cluster.nodes.len()];
    for &d in devices {
        per_node[state.cluster.node_of[d]] += 1;
    }
    per_node
}

/// Moves the running job at index `i` of `state.running`, larger than a node (the largest has
/// `largest` devices), onto fewer nodes (those with the most room, its own devices counted as
/// room) when it spans more than it needs and the move pays.
fn consolidate_wide(
    params: &ElasticParams,
    state: &mut State<'_>,
    i: usize,
    largest: usize,
    now: f64,
) {
    let r = &state.running[i];
    let (j, k) = (r.job, r.devices.len());
    let node_of = |d: usize| state.cluster.node_of[d];
    let spanned = nodes_spanned(state.cluster, &r.devices);
    // No placement of k devices uses fewer nodes than k over the largest node's size: a job on
    // that few already is as gathered as it can be (the search below would find no fewer).
    if spanned <= k.div_ceil(largest) {
        return;
    }
    let own = r.devices.clone();
    let old_rate = r.rate;
    let mine = own_per_node(state, &own);
    let room = |n: usize| state.free_per_node[n] + mine[n];
    // How many nodes the gathering below takes (most room first), counted from how many nodes
    // have each room (at most a node's size) without sorting them: most passes end here.
    let mut by_room = vec![0usize; largest + 1];
    for n in 0..state.cluster.nodes.len() {
        by_room[room(n)] += 1;
    }
    let (mut left, mut needed) = (k, 0);
    for (size, &count) in by_room.iter().enumerate().skip(1).rev() {
        let take = left.div_ceil(size).min(count);
        needed += take;
        left = left.saturating_sub(take * size);
        if left == 0 {
            break;
        }
    }
    if needed >= spanned {
        return;
    }
    let mut order: Vec<usize> = (0..state.cluster.nodes.len()).collect();
    order.sort_unstable_by_key(|&n| (std::cmp::Reverse(room(n)), n));
    // The gathering takes `needed` nodes (counted above), fewer than the job spans.
    let mut devices = Vec::with_capacity(k);
    for n in order {
        if devices.len() == k {
            break;
        }
        let mine = own.iter().copied().filter(|&d| node_of(d) == n);
        for d in mine.chain(state.free_devices_of(n)) {
            if devices.len() < k {
                devices.push(d);
            }
        }
    }
    devices.sort_unstable();
    let new_rate = state.throughput.rate(j, &state.jobs[j], &devices);
    let cost = state.move_cost(j, k);
    if saving(state, j, old_rate, new_rate) > cost && within_budget(params, state, j, cost, now) {
        state.reshape(j, devices, now);
    }
}

#[cfg(test)]
mod tests;
