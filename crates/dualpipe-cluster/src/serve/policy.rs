//! The real mode's policy: the simulator's elastic policy ([`crate::sim::elastic`]), run on a
//! view of the real pool once per scheduler tick ([`plan`]). One policy, two clocks: `simulate`
//! drives it with simulated time and modelled jobs, `serve` with the wall clock and the jobs'
//! records.
//!
//! Each tick the records fill the simulator's inputs:
//!
//! * the pool: `slots` slots in nodes of `node_size` consecutive slots (a cluster of speed-1
//!   devices with the default links);
//! * each queued, running or stopping job is a job of the trace in submission order, asking for
//!   its fewest allowed ranks (`gpus = min_gpus`), elastic up to its most (`max_gpus`);
//! * a running job holds its slots since its first start, with its measured move pauses as its
//!   overhead, and as its work done (which the policy takes as its remaining work's estimate)
//!   its steps times its scraped seconds per step times its rate; a job in a pause (a move or
//!   a recovery under way), stopping, or without a process is held where it is (the policy
//!   moves only jobs that run);
//! * a move costs the job's mean measured pause, or `move_cost_s` before its first.
//!
//! The policy's decisions become actions, with two rules of the real mode: a job's rank count is
//! rounded down to the largest count its training command accepts (`allowed`), and an action
//! whose slots another job still holds (the policy freed them by a shrink or a move in the same
//! pass) waits for a later tick. While any move is in flight (from the stop request to the moved
//! job's first step) nothing is decided.

use std::collections::{BTreeMap, BTreeSet};

use super::spec::{JobRecord, PauseKind, Phase, StopReason};
use crate::cluster::{default_links, Cluster, ClusterFile, NodeGroup};
use crate::sim::elastic::ElasticParams;
use crate::sim::state::{MoveCost, State};
use crate::throughput::{Curve, Throughput};
use crate::trace::Job;

/// The policy's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyParams {
    /// Slots per node.
    pub node_size: usize,
    /// The largest share of a job's run time spent paused by moves.
    pub overhead_budget: f64,
    /// A move's expected pause before one was measured, in seconds.
    pub move_cost_s: f64,
    /// The serial share `sigma` of the scaling curve.
    pub serial: f64,
    /// Grow running elastic jobs into free slots.
    pub grow: bool,
    /// Shrink running elastic jobs to admit queued ones.
    pub shrink: bool,
    /// Migrate running jobs (the elastic policy's consolidation).
    pub migrate: bool,
}

impl Default for PolicyParams {
    fn default() -> Self {
        PolicyParams {
            node_size: usize::MAX,
            overhead_budget: 0.05,
            move_cost_s: 2.0,
            serial: 0.02,
            grow: true,
            shrink: true,
            migrate: true,
        }
    }
}

/// What the scheduler is to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start (or resume) a queued job on these slots.
    Start {
        /// The job.
        id: String,
        /// Its slots (their count is its rank count).
        slots: Vec<usize>,
    },
    /// Stop a running job and resume it on these slots: a migration when the count is the
    /// same, a resize when it differs.
    Move {
        /// The job.
        id: String,
        /// Where it resumes.
        slots: Vec<usize>,
    },
}

/// The pool of `slots` slots in nodes of `size` (the last node may be smaller).
fn pool(slots: usize, size: usize) -> Option<Cluster> {
    let full = slots / size;
    let mut nodes = Vec::new();
    let group = |name: &str, count: usize, devices: usize| NodeGroup {
        name: name.into(),
        count,
        devices,
        speed: 1.0,
        memory: 80e9,
        metrics: BTreeMap::new(),
    };
    if full > 0 {
        nodes.push(group("node", full, size));
    }
    if !slots.is_multiple_of(size) {
        nodes.push(group("last", 1, slots % size));
    }
    Cluster::new(ClusterFile {
        links: default_links(),
        nodes,
    })
    .ok()
}

/// Whether `job` runs and may be moved now.
fn movable(job: &JobRecord) -> bool {
    job.phase == Phase::Running && job.pause.is_none() && job.pid.is_some()
}

/// The decisions of one tick over `slots` slots (module documentation).
pub fn plan(jobs: &[JobRecord], slots: usize, p: &PolicyParams, now: f64) -> Vec<Action> {
    let in_flight = |j: &JobRecord| {
        (j.phase == Phase::Stopping && j.stop_reason == Some(StopReason::Move))
            || j.pause.is_some_and(|p| p.kind == PauseKind::Move)
    };
    if slots == 0 || jobs.iter().any(in_flight) {
        return Vec::new();
    }
    let mut live: Vec<&JobRecord> = jobs
        .iter()
        .filter(|j| matches!(j.phase, Phase::Queued | Phase::Running | Phase::Stopping))
        .filter(|j| !j.allowed.is_empty())
        .collect();
    live.sort_by_key(|j| j.seq);
    // Slots held twice or past the pool: a view the policy cannot take; decide nothing.
    let mut held = BTreeSet::new();
    for j in live.iter().filter(|j| j.phase != Phase::Queued) {
        if j.slots.is_empty() || !j.slots.iter().all(|&s| s < slots && held.insert(s)) {
            return Vec::new();
        }
    }
    let Some(cluster) = pool(slots, p.node_size.clamp(1, slots)) else {
        return Vec::new();
    };
    let trace: Vec<Job> = live
        .iter()
        .map(|j| Job {
            name: j.id.clone(),
            arrival_s: j.seq as f64,
            gpus: j.allowed[0],
            duration_s: 1.0, // never read by the policy
            min_gpus: j.allowed[0],
            max_gpus: *j.allowed.last().expect("not empty"),
            profile: None,
            user: None,
        })
        .collect();
    let curve = Curve {
        serial: p.serial,
        ..Curve::default()
    };
    let Ok(throughput) = Throughput::new(&cluster, curve, &trace, &BTreeMap::new()) else {
        return Vec::new();
    };
    let cost = MoveCost {
        restart_s: p.move_cost_s,
        checkpoint_bytes_per_device: 0.0,
    };
    let mut state = State::new(&cluster, &trace, throughput, cost);
    state.measured_move_s = live
        .iter()
        .map(|j| (!j.move_pauses.is_empty()).then(|| j.expected_pause(p.move_cost_s)))
        .collect();
    for (i, j) in live.iter().enumerate() {
        if j.phase == Phase::Queued {
            state.queue.push(i, 0.0);
            continue;
        }
        state.start(i, j.slots.clone(), j.started_at.unwrap_or(now).min(now));
        let r = state.running.last_mut().expect("just started");
        if !movable(j) {
            r.paused_until = f64::INFINITY;
        }
        let rate = r.rate;
        state.progress[i].overhead_s = j.move_pause_s;
        state.progress[i].done = j.step as f64 * j.step_seconds.unwrap_or(0.0) * rate;
    }
    let params = ElasticParams {
        overhead_budget: p.overhead_budget,
        grow: p.grow,
        shrink: p.shrink,
        consolidate: p.migrate,
    };
    crate::sim::elastic::schedule(&params, &mut state, now);
    let mut claimed = held.clone();
    let mut actions = Vec::new();
    for (i, j) in live.iter().enumerate() {
        let Some(r) = state.running.iter().find(|r| r.job == i) else {
            continue;
        };
        let mut own: Vec<usize> = if j.phase == Phase::Queued {
            Vec::new()
        } else {
            j.slots.clone()
        };
        own.sort_unstable();
        let Some(k) = j
            .allowed
            .iter()
            .copied()
            .filter(|&a| a <= r.devices.len())
            .max()
        else {
            continue;
        };
        // The job's own slots first, then the others the policy gave it.
        let mut to: Vec<usize> = r
            .devices
            .iter()
            .copied()
            .filter(|s| own.contains(s))
            .collect();
        to.extend(r.devices.iter().copied().filter(|s| !own.contains(s)));
        to.truncate(k);
        to.sort_unstable();
        if to == own {
            continue;
        }
        // Slots another job holds, or another action took, wait for a later tick.
        if to.iter().any(|s| !own.contains(s) && claimed.contains(s)) {
            continue;
        }
        claimed.extend(to.iter().copied());
        let id = j.id.clone();
        actions.push(if j.phase == Phase::Queued {
            Action::Start { id, slots: to }
        } else {
            Action::Move { id, slots: to }
        });
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::spec::JobRequest;

    fn job(seq: u64, min: usize, max: usize, allowed: &[usize]) -> JobRecord {
        JobRecord::new(
            format!("job-{seq}"),
            seq,
            JobRequest {
                name: None,
                args: vec![],
                min_ranks: min,
                max_ranks: max,
                request_id: None,
            },
            allowed.to_vec(),
            1000,
            0.0,
        )
    }

    fn running(mut j: JobRecord, slots: &[usize]) -> JobRecord {
        j.phase = Phase::Running;
        j.slots = slots.to_vec();
        j.pid = Some(1);
        j.started_at = Some(0.0);
        j.step = 100;
        j.step_seconds = Some(1.0);
        j
    }

    fn params(node_size: usize) -> PolicyParams {
        PolicyParams {
            node_size,
            ..Default::default()
        }
    }

    #[test]
    fn queued_jobs_start_on_their_fewest_and_share_the_rest_by_marginal_gain() {
        // Both admitted on 1 rank, then the 2 free slots go one by one to the job that gains
        // most (the curve is concave: one each).
        let jobs = vec![job(1, 1, 2, &[1, 2]), job(2, 1, 2, &[1, 2])];
        assert_eq!(
            plan(&jobs, 4, &params(4), 10.0),
            vec![
                Action::Start {
                    id: "job-1".into(),
                    slots: vec![0, 1]
                },
                Action::Start {
                    id: "job-2".into(),
                    slots: vec![2, 3]
                },
            ]
        );
        // A count the training command refuses is rounded down to one it accepts: 3 -> 2.
        let jobs = vec![job(1, 1, 4, &[1, 2, 4]), running(job(2, 1, 1, &[1]), &[3])];
        assert_eq!(
            plan(&jobs, 4, &params(4), 10.0),
            vec![Action::Start {
                id: "job-1".into(),
                slots: vec![0, 1]
            }]
        );
    }

    #[test]
    fn a_pool_whose_last_node_is_smaller_and_a_view_it_cannot_take() {
        // 3 slots in nodes of 2: nodes [0, 1] and [2]; the 2-rank job takes node 0 whole, the
        // 1-rank one the last node.
        let jobs = vec![job(1, 1, 1, &[1]), job(2, 2, 2, &[2])];
        assert_eq!(
            plan(&jobs, 3, &params(2), 10.0),
            vec![
                Action::Start {
                    id: "job-1".into(),
                    slots: vec![2]
                },
                Action::Start {
                    id: "job-2".into(),
                    slots: vec![0, 1]
                },
            ]
        );
        // A slot held twice, or past the pool: nothing is decided (never a panic).
        let twice = vec![
            running(job(1, 1, 1, &[1]), &[0]),
            running(job(2, 1, 1, &[1]), &[0]),
        ];
        assert_eq!(plan(&twice, 4, &params(2), 10.0), vec![]);
        let past = vec![running(job(1, 1, 1, &[1]), &[7]), job(2, 1, 1, &[1])];
        assert_eq!(plan(&past, 4, &params(2), 10.0), vec![]);
    }

    #[test]
    fn a_job_that_fits_in_a_node_is_placed_in_one_best_fit() {
        let jobs = vec![running(job(1, 1, 1, &[1]), &[0]), job(2, 1, 1, &[1])];
        assert_eq!(
            plan(&jobs, 4, &params(2), 10.0),
            vec![Action::Start {
                id: "job-2".into(),
                slots: vec![1]
            }]
        );
    }

    #[test]
    fn a_job_split_by_fragmentation_is_spread_and_consolidated_when_a_node_frees() {
        // Slots 1 and 2 busy (one per node); a 2-rank job fits the free slots 0 and 3 but no
        // node: it starts spread over both.
        let jobs = vec![
            running(job(1, 1, 1, &[1]), &[1]),
            running(job(2, 1, 1, &[1]), &[2]),
            job(3, 2, 2, &[2]),
        ];
        assert_eq!(
            plan(&jobs, 4, &params(2), 10.0),
            vec![Action::Start {
                id: "job-3".into(),
                slots: vec![0, 3]
            }]
        );
        // Once job-1 is done, node 0 has room: the spread job moves into it, when its budget
        // (5% of 100 s run) covers the 2 s pause.
        let jobs = vec![
            running(job(2, 1, 1, &[1]), &[2]),
            running(job(3, 2, 2, &[2]), &[0, 3]),
        ];
        assert_eq!(
            plan(&jobs, 4, &params(2), 100.0),
            vec![Action::Move {
                id: "job-3".into(),
                slots: vec![0, 1]
            }]
        );
        let p = PolicyParams {
            migrate: false,
            ..params(2)
        };
        assert_eq!(plan(&jobs, 4, &p, 100.0), vec![]);
    }

    #[test]
    fn an_elastic_job_shrinks_to_admit_the_head_and_grows_when_nobody_waits() {
        // At 100 s of run time a 2 s move is within the 5% budget.
        let jobs = vec![
            running(job(1, 1, 4, &[1, 2, 4]), &[0, 1, 2, 3]),
            job(2, 2, 2, &[2]),
        ];
        // The shrink frees slots 2 and 3; the head starts on them at a later tick, once
        // job-1 no longer holds them.
        assert_eq!(
            plan(&jobs, 4, &params(4), 100.0),
            vec![Action::Move {
                id: "job-1".into(),
                slots: vec![0, 1]
            }]
        );
        let jobs = vec![running(job(1, 1, 4, &[1, 2, 4]), &[0, 1])];
        assert_eq!(
            plan(&jobs, 4, &params(4), 100.0),
            vec![Action::Move {
                id: "job-1".into(),
                slots: vec![0, 1, 2, 3]
            }]
        );
        // Too early in its run (10 s: 0.5 s of budget), neither move is made.
        assert_eq!(plan(&jobs, 4, &params(4), 10.0), vec![]);
    }

    #[test]
    fn moves_respect_the_overhead_budget_and_wait_for_each_other() {
        // 1000 s run at 5%: 50 s of pauses allowed; the next costs its measured 2 s.
        let mut j = running(job(1, 1, 4, &[1, 2, 4]), &[0, 1]);
        j.move_pause_s = 49.0;
        j.move_pauses = vec![2.0];
        assert_eq!(plan(&[j.clone()], 4, &params(4), 1000.0), vec![]);
        j.move_pause_s = 40.0;
        assert_eq!(plan(&[j.clone()], 4, &params(4), 1000.0).len(), 1);
        let mut stopping = running(job(2, 1, 1, &[1]), &[3]);
        stopping.phase = Phase::Stopping;
        stopping.stop_reason = Some(StopReason::Move);
        j.slots = vec![0];
        assert_eq!(
            plan(&[j, stopping, job(3, 1, 1, &[1])], 4, &params(4), 1000.0),
            vec![]
        );
    }
}
