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
    let mut order: Vec<usize> = state
        .queue
        .iter()
        .copied()
        .chain(state.running.iter().map(|r| r.job))
        .collect();
    order.sort_by(|&a, &b| {
        let qa = queue_of(params, state.progress[a].attained);
        let qb = queue_of(params, state.progress[b].attained);
        qa.cmp(&qb)
            .then(state.jobs[a].arrival_s.total_cmp(&state.jobs[b].arrival_s))
            .then(a.cmp(&b))
    });
    let held = |state: &State<'_>, j: usize| {
        state
            .running
            .iter()
            .find(|r| r.job == j)
            .map(|r| r.devices.len())
    };
    let mut capacity = state.cluster.devices();
    let mut admitted = Vec::new();
    for &j in &order {
        let need = held(state, j).unwrap_or(state.jobs[j].gpus);
        if need <= capacity {
            capacity -= need;
            admitted.push(j);
        }
    }
    let preempt: Vec<usize> = state
        .running
        .iter()
        .map(|r| r.job)
        .filter(|j| !admitted.contains(j))
        .collect();
    for j in preempt {
        state.preempt(j, now);
    }
    let waiting: Vec<usize> = admitted
        .iter()
        .copied()
        .filter(|&j| held(state, j).is_none())
        .chain(order.iter().copied().filter(|j| !admitted.contains(j)))
        .collect();
    for j in waiting {
        if held(state, j).is_some() || !state.queue.contains(&j) {
            continue;
        }
        if let Some(devices) = place_rigid(state, state.jobs[j].gpus) {
            state.start(j, devices, now);
        }
    }
}
