//! The trace-driven discrete-event simulator.
//!
//! Events are arrivals and completions. Between two events every running job progresses at its
//! rate (none while it pauses for a move); at each event finished jobs release their devices,
//! arrivals join the queue, and the policy acts. The result is the metrics of docs/cluster.md
//! and every device hold, in a fixed order, so the same trace and seed give the same bytes.

use serde::Serialize;

use crate::error::ClusterError;
use crate::sim::metrics::{metrics, Metrics, Waiting};
use crate::sim::policy::Policy;
use crate::sim::state::{Segment, State};

/// What one simulation produced.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The metrics.
    pub metrics: Metrics,
    /// Every device hold, in the order they ended.
    pub segments: Vec<Segment>,
    /// Per job (trace order): first start, finish, overhead seconds.
    pub jobs: Vec<JobOutcome>,
}

impl Outcome {
    /// The first hold's start and the last hold's end, in seconds ((0, 0) for no holds).
    pub fn held_span(&self) -> (f64, f64) {
        let end = self.segments.iter().map(|s| s.end_s).fold(0.0f64, f64::max);
        let start = self.segments.iter().map(|s| s.start_s).fold(end, f64::min);
        (start, end)
    }
}

/// One job's result.
#[derive(Clone, Debug, Serialize)]
pub struct JobOutcome {
    /// Its name.
    pub job: String,
    /// Submitted at.
    pub arrival_s: f64,
    /// First started at.
    pub start_s: f64,
    /// Finished at.
    pub finish_s: f64,
    /// Seconds paused by moves.
    pub overhead_s: f64,
    /// Moves with the same device count.
    pub migrations: usize,
    /// Moves to another device count.
    pub resizes: usize,
}

/// How far a run has got, told each time jobs finish.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tick {
    /// Jobs finished so far.
    pub finished: usize,
    /// Jobs in the trace.
    pub jobs: usize,
    /// Simulated seconds since the first arrival.
    pub sim_s: f64,
}

/// Relative slack within which a job counts as finished (floating-point progress).
const DONE_SLACK: f64 = 1e-9;

/// Runs the trace in `state` under `policy` to the last completion.
pub fn simulate(state: State<'_>, policy: &mut Policy) -> Result<Outcome, ClusterError> {
    simulate_with_progress(state, policy, &mut |_| {})
}

/// [`simulate()`], telling `progress` how far it has got each time jobs finish.
pub fn simulate_with_progress(
    mut state: State<'_>,
    policy: &mut Policy,
    progress: &mut dyn FnMut(Tick),
) -> Result<Outcome, ClusterError> {
    let jobs = state.jobs;
    let order = crate::sim::queue::arrival_order(jobs);
    let mut next_arrival = 0;
    let mut now = jobs[order[0]].arrival_s;
    let start = now;
    let mut waiting = Waiting::default();
    let mut done = 0;
    loop {
        // Arrivals at `now`, then the policy.
        while next_arrival < order.len() && jobs[order[next_arrival]].arrival_s <= now {
            let j = order[next_arrival];
            state.queue.push(j, state.progress[j].attained);
            next_arrival += 1;
        }
        policy.schedule(&mut state, now);
        // The next event.
        let mut next = f64::INFINITY;
        if next_arrival < order.len() {
            next = jobs[order[next_arrival]].arrival_s;
        }
        for r in &state.running {
            next = next.min(finish_time(&state, r, now));
            // The end of a move's pause is an event too: the policy may act on the job again
            // (grow it back, for one) without waiting for the next arrival or completion.
            if r.paused_until > now {
                next = next.min(r.paused_until);
            }
        }
        if !next.is_finite() {
            if state.queue.is_empty() && state.running.is_empty() {
                break;
            }
            let j = state
                .queue
                .first()
                .or(state.running.first().map(|r| r.job))
                .expect("a job is left");
            return Err(ClusterError::Trace(format!(
                "job {} can never finish: the policy found no devices it runs on",
                jobs[j].name
            )));
        }
        // Advance to it.
        let dt = next - now;
        if !state.queue.is_empty() {
            waiting.free_device_s += dt * state.free() as f64;
            waiting.queue_len_s += dt * state.queue.len() as f64;
            waiting.some_waiting_s += dt;
        }
        let mut finished = Vec::new();
        for i in 0..state.running.len() {
            let r = &state.running[i];
            let done_at = finish_time(&state, r, now);
            let j = r.job;
            let active = (next - now.max(r.paused_until)).max(0.0);
            let held = r.devices.len() as f64 * dt;
            let rate = r.rate;
            state.progress[j].attained += held;
            state.progress[j].done += rate * active;
            if done_at <= next + DONE_SLACK * next.abs().max(1.0) {
                finished.push(j);
            }
        }
        now = next;
        if !finished.is_empty() {
            done += finished.len();
            progress(Tick {
                finished: done,
                jobs: jobs.len(),
                sim_s: now - start,
            });
        }
        for j in finished {
            state.finish(j, now);
        }
    }
    let makespan = now - start;
    let m = metrics(&state, makespan, waiting);
    let outcomes = jobs
        .iter()
        .zip(&state.progress)
        .map(|(job, p)| JobOutcome {
            job: job.name.clone(),
            arrival_s: job.arrival_s,
            start_s: p.first_start.unwrap_or(f64::NAN),
            finish_s: p.finish.unwrap_or(f64::NAN),
            overhead_s: p.overhead_s,
            migrations: p.migrations,
            resizes: p.resizes,
        })
        .collect();
    Ok(Outcome {
        metrics: m,
        segments: state.segments,
        jobs: outcomes,
    })
}

/// When running job `r` will finish if nothing changes.
fn finish_time(state: &State<'_>, r: &crate::sim::state::Running, now: f64) -> f64 {
    let left = (state.jobs[r.job].duration_s - state.progress[r.job].done).max(0.0);
    if r.rate <= 0.0 {
        return f64::INFINITY;
    }
    now.max(r.paused_until) + left / r.rate
}
