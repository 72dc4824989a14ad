//! `las`: a least-attained-service baseline in the manner of Tiresias (discretised
//! two-dimensional LAS: a job's service is the device-seconds it has held).
//!
//! At every event (an arrival or a completion) all jobs, queued and running, are ranked:
//! first by their priority queue (queue `q` holds the jobs whose attained device-seconds lie
//! between the `q`-th and `(q+1)`-th thresholds), then by arrival. Walking that order, jobs are
//! admitted while their devices fit the pool by count (a running job counts what it holds, a
//! queued one what it requests); running jobs left out are preempted (checkpoint and stop;
//! they queue again), and admitted queued jobs start with the static policy's placement (a job
//! that fits in a node in one node). Queued jobs that still fit the free devices then start
//! too (backfill). Jobs are rigid. A preempted job pays the move cost (checkpoint transfer and
//! restart) as a pause when it resumes; each preemption counts as a migration.
//!
//! Priorities change only at events: a running job that crosses a threshold between two
//! events is re-ranked at the next one. Tiresias's promotion of starved jobs is left out.

use serde::Serialize;

use crate::sim::place::place_rigid;
use crate::sim::queue::Need;
use crate::sim::state::State;

/// The parameters of `las`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LasParams {
    /// The attained device-seconds at which a job drops to the next queue, ascending.
    pub thresholds: Vec<f64>,
}

impl Default for LasParams {
    /// Two thresholds: 1 and 10 device-hours (three queues).
    fn default() -> Self {
        LasParams {
            thresholds: vec![3600.0, 36_000.0],
        }
    }
}

/// Acts on the pool at `now` (module documentation).
///
/// The waiting jobs are ranked in the queue itself ([`crate::sim::queue::Queue::rank_by`]: a waiting
/// job's attained service, so its rank, stays put), so one pass touches the running jobs and
/// the waiting ones it admits or starts, never the whole queue: walking the ranked order, a
/// waiting job asking for more than the capacity left is passed over without effect, and
/// capacity only falls, so the index skips to the next one that fits.
pub fn schedule(params: &LasParams, state: &mut State<'_>, now: f64) {
    let progress = &state.progress;
    state
        .queue
        .rank_by(&params.thresholds, |j| progress[j].attained);
    let (kept, admitted) = admit(state);
    preempt_all_but(state, &kept, now);
    // Admitted jobs that were not running (an admitted running job is not preempted), then
    // the rest in rank order: every waiting job is queued now (it was, or its preemption
    // queued it).
    let mut free = state.free();
    for &j in &admitted {
        debug_assert!(state.queue.contains(j) && state.running.iter().all(|r| r.job != j));
        let k = state.jobs[j].gpus;
        if k > free {
            continue; // no placement of k devices exists
        }
        if let Some(devices) = place_rigid(state, k) {
            state.start(j, devices, now);
            free -= k;
        }
    }
    // The rest: only a job that a placement exists for starts (one in a node needs a node
    // with that many free, a wider one that many free in all), and free devices only fall,
    // so the jobs the index passes over would not start either.
    let mut listed = admitted;
    listed.sort_unstable();
    let mut from = 0;
    loop {
        let in_node = state
            .free_per_node
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .min(free);
        let next = [
            state.queue.next_fitting(from, Need::InNode, in_node),
            state.queue.next_fitting(from, Need::Wide, free),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some((pos, j)) = next else { break };
        from = pos + 1;
        if listed.binary_search(&j).is_ok() {
            continue; // admitted above: listed once
        }
        let k = state.jobs[j].gpus;
        let devices = place_rigid(state, k).expect("a placement exists");
        state.start(j, devices, now);
        free -= k;
    }
}

/// Preempts the running jobs not `kept` (by running index) at `now`.
fn preempt_all_but(state: &mut State<'_>, kept: &[bool], now: f64) {
    let preempt: Vec<usize> = state
        .running
        .iter()
        .zip(kept)
        .filter(|(_, &kept)| !kept)
        .map(|(r, _)| r.job)
        .collect();
    for j in preempt {
        state.preempt(j, now);
    }
}

/// Walks every job, waiting or running, in rank order (the queue by attained service, then
/// arrival), admitting each whose devices fit the pool by count (a running job counts what
/// it holds, a waiting one what it requests). Returns which running jobs (by index) are kept
/// and the waiting jobs admitted, in rank order.
fn admit(state: &State<'_>) -> (Vec<bool>, Vec<usize>) {
    let mut running: Vec<(usize, usize, usize)> = state
        .running
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let service = state.progress[r.job].attained;
            (state.queue.position_of(r.job, service), r.devices.len(), i)
        })
        .collect();
    running.sort_unstable();
    let mut capacity = state.cluster.devices();
    let mut kept = vec![false; state.running.len()];
    let mut admitted = Vec::new();
    let mut from = 0;
    let mut running = running.into_iter().peekable();
    // The first waiting job from `from` that fits `capacity`: it stays the first while the
    // capacity still covers it (the jobs before it asked for more than a larger capacity).
    let mut waiting = state.queue.next_asking_at_most(from, capacity);
    loop {
        if waiting.is_some_and(|(_, j)| state.jobs[j].gpus > capacity) {
            waiting = state.queue.next_asking_at_most(from, capacity);
        }
        let waiting_first = match (waiting, running.peek()) {
            (Some((pos, _)), Some(r)) => pos < r.0,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        if let (true, Some((pos, j))) = (waiting_first, waiting) {
            capacity -= state.jobs[j].gpus;
            admitted.push(j);
            from = pos + 1;
            waiting = state.queue.next_asking_at_most(from, capacity);
        } else if let Some((_, need, i)) = running.next() {
            if need <= capacity {
                capacity -= need;
                kept[i] = true;
            }
        }
    }
    (kept, admitted)
}

#[cfg(test)]
mod tests;
