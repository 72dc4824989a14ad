//! The metrics of a simulated (or real) run, defined once (docs/cluster.md repeats them).
//!
//! Time runs from the first arrival to the last completion (`makespan_s`).
//!
//! * `offered_load`: the trace's requested device-seconds over `devices` x its arrival window
//!   ([`crate::offered_load`]): what the cluster is asked to carry, whatever the policy.
//! * `utilization`: device-seconds held by jobs (including pauses for moves) over
//!   `devices x makespan_s`.
//! * `window_utilization`: the same, counted only from the first arrival to the last: the
//!   cluster while the trace still offers it work. A trace cut from a running cluster ends with a
//!   drain (after the last arrival only the longest jobs run, on a mostly idle cluster) that
//!   caps `utilization` whatever the policy; this share leaves that drain out.
//! * `useful_utilization`: the trace's requested device-seconds (each job's `gpus x
//!   duration_s`, its work at the count it asked for) over `devices x makespan_s`. It does not
//!   count what a job holds beyond its work's worth (grown past its request, spread over more
//!   nodes than it needs, paused by a move), so set beside `utilization` it shows what those
//!   cost; it is the same work for every policy, so between policies it differs only by the
//!   makespan. Not capped at `utilization`: a job shrunk below its request does more work per
//!   device, and devices faster than speed 1 do more too.
//! * `mean_jct_s`, `p95_jct_s`: job completion time, finish minus arrival; the 95th percentile
//!   by nearest rank.
//! * `mean_queue_s`: first start minus arrival, averaged over jobs.
//! * `fragmentation`: device-seconds that were free while at least one job waited, over
//!   `devices x makespan_s`: capacity stranded by the placement rules or the queue order.
//! * `migrations`, `resizes`: moves to other devices with the same count, and to another count.
//! * `migration_overhead`: seconds jobs were paused by moves over the jobs' summed run time
//!   (first start to finish); `max_job_overhead` is the largest such share of one job.
//! * `makespan_bound_s`: the rigid clairvoyant bound ([`crate::sim::bound`]); `bound_share` is
//!   it over `makespan_s`, the share of the most any rigid schedule reaches (above 1 only when
//!   jobs ran grown past their request or on devices faster than speed 1).
//! * `waiting_fragmentation`: device-seconds that were free while at least one job waited,
//!   over `devices x` the seconds at least one job waited (0 when nobody waited): the share of
//!   the pool stranded while it was needed, which a long idle stretch does not dilute.
//! * `middle_mean_queue_s`: `mean_queue_s` over the jobs of the middle half by arrival (the
//!   `n/4`-th to the `3n/4`-th): Gavel's way of leaving out a stream's warm-up and drain.

use serde::Serialize;

use crate::sim::state::State;

/// The figures of one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Metrics {
    /// Jobs run.
    pub jobs: usize,
    /// Devices of the cluster.
    pub devices: usize,
    /// The trace's requested device-seconds over devices x its arrival window.
    pub offered_load: f64,
    /// Busy device-seconds over total, in [0, 1].
    pub utilization: f64,
    /// Busy device-seconds from the first arrival to the last, over devices x that window, in
    /// [0, 1] (equal to `utilization` when all jobs arrive at once: then it is the whole run).
    pub window_utilization: f64,
    /// The trace's requested device-seconds over devices x the makespan (0 for an empty run).
    pub useful_utilization: f64,
    /// Mean job completion time, seconds.
    pub mean_jct_s: f64,
    /// 95th percentile of job completion time, seconds.
    pub p95_jct_s: f64,
    /// Mean queueing delay, seconds.
    pub mean_queue_s: f64,
    /// Mean number of waiting jobs over the run.
    pub mean_queue_length: f64,
    /// Free device-seconds while a job waits, over total, in [0, 1].
    pub fragmentation: f64,
    /// Moves to other devices with the same count.
    pub migrations: usize,
    /// Moves to another device count.
    pub resizes: usize,
    /// Seconds paused by moves over summed run time, in [0, 1].
    pub migration_overhead: f64,
    /// The largest share of one job's run time paused by moves, in [0, 1].
    pub max_job_overhead: f64,
    /// First arrival to last completion, seconds.
    pub makespan_s: f64,
    /// The rigid clairvoyant bound on the makespan, seconds ([`crate::sim::bound`]).
    pub makespan_bound_s: f64,
    /// `makespan_bound_s` over `makespan_s` (0 for an empty run).
    pub bound_share: f64,
    /// Free device-seconds while a job waits, over devices x the seconds some job waits, in
    /// [0, 1] (0 when nobody waits).
    pub waiting_fragmentation: f64,
    /// Mean queueing delay of the middle half of the jobs by arrival, seconds.
    pub middle_mean_queue_s: f64,
}

/// What the event loop measured of the queue over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Waiting {
    /// Device-seconds free while at least one job waited.
    pub free_device_s: f64,
    /// The queue's length integrated over time (job-seconds).
    pub queue_len_s: f64,
    /// Seconds during which at least one job waited.
    pub some_waiting_s: f64,
}

/// The metrics of a finished run held in `state`.
pub(crate) fn metrics(state: &State<'_>, makespan_s: f64, waiting: Waiting) -> Metrics {
    let devices = state.cluster.devices();
    let total = devices as f64 * makespan_s;
    let busy: f64 = state
        .segments
        .iter()
        .map(|s| s.devices.len() as f64 * (s.end_s - s.start_s))
        .sum();
    let (first, last) = crate::trace::arrival_window(state.jobs);
    let window_busy: f64 = state
        .segments
        .iter()
        .map(|s| s.devices.len() as f64 * (s.end_s.min(last) - s.start_s.max(first)).max(0.0))
        .sum();
    let mut jct = Vec::with_capacity(state.jobs.len());
    let mut queued = Vec::with_capacity(state.jobs.len());
    let (mut paused, mut run) = (0.0, 0.0);
    let mut max_job_overhead = 0.0f64;
    let (mut migrations, mut resizes) = (0, 0);
    for (job, p) in state.jobs.iter().zip(&state.progress) {
        let (start, finish) = (
            p.first_start.expect("every job started"),
            p.finish.expect("every job finished"),
        );
        jct.push(finish - job.arrival_s);
        queued.push(start - job.arrival_s);
        paused += p.overhead_s;
        run += finish - start;
        if finish > start {
            max_job_overhead = max_job_overhead.max(p.overhead_s / (finish - start));
        }
        migrations += p.migrations;
        resizes += p.resizes;
    }
    let n = jct.len() as f64;
    let mean_jct_s = jct.iter().sum::<f64>() / n;
    jct.sort_by(f64::total_cmp);
    let rank = ((0.95 * n).ceil() as usize).clamp(1, jct.len());
    let order = crate::sim::queue::arrival_order(state.jobs);
    let middle = &order[order.len() / 4..order.len() - order.len() / 4];
    let middle_queue = middle.iter().map(|&j| queued[j]).sum::<f64>() / middle.len() as f64;
    let bound = crate::sim::bound::makespan_bound(state.jobs, devices);
    let share = |a: f64, b: f64| {
        if b > 0.0 {
            (a / b).clamp(0.0, 1.0)
        } else {
            0.0
        }
    };
    Metrics {
        jobs: state.jobs.len(),
        devices,
        offered_load: crate::offered_load(state.jobs, devices),
        utilization: share(busy, total),
        window_utilization: if last > first {
            share(window_busy, devices as f64 * (last - first))
        } else {
            share(busy, total)
        },
        useful_utilization: if total > 0.0 {
            crate::trace::requested_work(state.jobs) / total
        } else {
            0.0
        },
        mean_jct_s,
        p95_jct_s: jct[rank - 1],
        mean_queue_s: queued.iter().sum::<f64>() / n,
        mean_queue_length: if makespan_s > 0.0 {
            waiting.queue_len_s / makespan_s
        } else {
            0.0
        },
        fragmentation: share(waiting.free_device_s, total),
        migrations,
        resizes,
        migration_overhead: share(paused, run),
        max_job_overhead: max_job_overhead.min(1.0),
        makespan_s,
        makespan_bound_s: bound,
        bound_share: if makespan_s > 0.0 {
            bound / makespan_s
        } else {
            0.0
        },
        waiting_fragmentation: share(
            waiting.free_device_s,
            devices as f64 * waiting.some_waiting_s,
        ),
        middle_mean_queue_s: middle_queue,
    }
}
