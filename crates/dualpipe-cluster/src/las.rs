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

use crate::policy::place_rigid;
use crate::state::State;

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

/// The priority queue of a job that attained `service` device-seconds.
fn queue_of(params: &LasParams, service: f64) -> usize {
    params.thresholds.iter().filter(|&&t| service >= t).count()
}

/// Acts on the pool at `now` (module documentation).
pub fn schedule(params: &LasParams, state: &mut State<'_>, now: f64) {
    // Every job, queued or running, as (its queue, its arrival, its index, the devices it
    // counts, its index among the running ones), ranked by the first three (the index makes
    // the order total, so an unstable sort gives the one order); keys computed once. Arrivals
    // are finite and >= 0 (the trace refuses others), where an f64's bits order as its value.
    let entry = |j: usize, need: usize, running: Option<usize>| {
        let arrival = state.jobs[j].arrival_s;
        debug_assert!(arrival.is_finite() && arrival >= 0.0);
        let queue = queue_of(params, state.progress[j].attained);
        (queue, arrival.to_bits(), j, need, running)
    };
    let mut order: Vec<(usize, u64, usize, usize, Option<usize>)> = state
        .queue
        .iter()
        .map(|&j| entry(j, state.jobs[j].gpus, None))
        .chain(
            state
                .running
                .iter()
                .enumerate()
                .map(|(i, r)| entry(r.job, r.devices.len(), Some(i))),
        )
        .collect();
    order.sort_unstable();
    let mut capacity = state.cluster.devices();
    let mut admitted = vec![false; order.len()];
    let mut running_admitted = vec![false; state.running.len()];
    for (&(_, _, _, need, running), admit) in order.iter().zip(admitted.iter_mut()) {
        if need <= capacity {
            capacity -= need;
            *admit = true;
            if let Some(i) = running {
                running_admitted[i] = true;
            }
        }
    }
    let preempt: Vec<usize> = state
        .running
        .iter()
        .zip(&running_admitted)
        .filter(|(_, &kept)| !kept)
        .map(|(r, _)| r.job)
        .collect();
    for j in preempt {
        state.preempt(j, now);
    }
    // Admitted jobs that were not running (an admitted running job is not preempted), then
    // the rest in rank order.
    let listed = || order.iter().zip(&admitted);
    let waiting: Vec<usize> = listed()
        .filter(|(o, &a)| a && o.4.is_none())
        .chain(listed().filter(|(_, &a)| !a))
        .map(|(o, _)| o.2)
        .collect();
    // Every waiting job is queued now (it was, or its preemption queued it) and each is
    // listed once, so none has started before its turn.
    let mut free = state.free();
    for j in waiting {
        debug_assert!(state.queue.contains(&j) && state.running.iter().all(|r| r.job != j));
        let k = state.jobs[j].gpus;
        if k > free {
            continue; // no placement of k devices exists
        }
        if let Some(devices) = place_rigid(state, k) {
            state.start(j, devices, now);
            free -= k;
        }
    }
}
