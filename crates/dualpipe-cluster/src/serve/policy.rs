//! The real mode's policy: one pure decision per scheduler tick from the jobs' records and
//! their scrapes ([`plan`]).
//!
//! Slots are numbered `0..slots` and grouped into nodes of `node_size` consecutive slots.
//! Each tick, in this order:
//!
//! 1. **Admission**, first come first served with backfill. A queued job starts on the most
//!    ranks it allows that fit when it is the last in the queue, otherwise on its fewest
//!    (room for the others). A job that fits in one node is placed in one node (best fit:
//!    the node with the fewest free slots that hold it).
//! 2. **Defragmentation (migration).** When the head of the queue fits in the free slots but
//!    in no single node, the smallest running job whose move to another node's free slots
//!    empties enough of its own node is migrated there (same rank count); the head waits.
//!    With no such move, the head is spread over nodes.
//! 3. **Shrinking (resize).** When the head does not fit at all, elastic running jobs are
//!    shrunk to smaller allowed rank counts (the job with the most ranks above its minimum
//!    first) when that frees enough; the head waits.
//! 4. **Growing (resize).** With nobody queued, free slots go to running elastic jobs, the
//!    one with the fewest ranks first (the largest marginal gain under the scaling curve
//!    `S(k) = k / (1 + sigma (k - 1))`), one allowed step at a time, when the time the
//!    remaining steps save exceeds the expected pause.
//!
//! A job is moved only while it runs (not in a pause), and only if its pauses, with this
//! move's expected one, stay within `overhead_budget` of its expected run time (elapsed
//! plus remaining at the scraped rate). While any move is in flight (from the stop request to
//! the moved job's first step) nothing else is decided.

use std::collections::BTreeSet;

use super::spec::{JobRecord, PauseKind, Phase, StopReason};

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
    /// Migrate running jobs to empty a node for a queued one.
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

/// The scaling curve's speed-up on `k` ranks.
fn speedup(serial: f64, k: usize) -> f64 {
    k as f64 / (1.0 + serial * (k as f64 - 1.0))
}

/// The free slots of node `n`.
fn node_free(free: &BTreeSet<usize>, n: usize, size: usize) -> Vec<usize> {
    free.iter().copied().filter(|s| s / size == n).collect()
}

/// `k` slots inside one node, best fit (the node with the fewest free slots that hold `k`).
fn in_one_node(free: &BTreeSet<usize>, k: usize, nodes: usize, size: usize) -> Option<Vec<usize>> {
    (0..nodes)
        .map(|n| node_free(free, n, size))
        .filter(|f| f.len() >= k)
        .min_by_key(|f| f.len())
        .map(|f| f[..k].to_vec())
}

/// `k` free slots over the fewest nodes (the nodes with the most free slots first).
fn spread(free: &BTreeSet<usize>, k: usize, nodes: usize, size: usize) -> Option<Vec<usize>> {
    if free.len() < k {
        return None;
    }
    let mut by_node: Vec<Vec<usize>> = (0..nodes).map(|n| node_free(free, n, size)).collect();
    by_node.sort_by_key(|f| std::cmp::Reverse(f.len()));
    let mut slots: Vec<usize> = by_node.into_iter().flatten().take(k).collect();
    slots.sort_unstable();
    Some(slots)
}

/// Whether `job` may be moved now at an expected pause of `expected` seconds.
fn movable(job: &JobRecord, p: &PolicyParams, now: f64) -> bool {
    if job.phase != Phase::Running || job.pause.is_some() || job.pid.is_none() {
        return false;
    }
    let Some(remaining) = job.remaining_s() else {
        return false;
    };
    let expected = job.expected_pause(p.move_cost_s);
    let elapsed = job.started_at.map_or(0.0, |t| (now - t).max(0.0));
    job.move_pause_s + expected <= p.overhead_budget * (elapsed + remaining)
}

/// The decisions of one tick over `slots` slots (module documentation).
pub fn plan(jobs: &[JobRecord], slots: usize, p: &PolicyParams, now: f64) -> Vec<Action> {
    let size = p.node_size.clamp(1, slots.max(1));
    let nodes = slots.div_ceil(size);
    let in_flight = |j: &JobRecord| {
        (j.phase == Phase::Stopping && j.stop_reason == Some(StopReason::Move))
            || j.pause.is_some_and(|p| p.kind == PauseKind::Move)
    };
    if jobs.iter().any(in_flight) {
        return Vec::new();
    }
    let mut free: BTreeSet<usize> = (0..slots).collect();
    for j in jobs
        .iter()
        .filter(|j| matches!(j.phase, Phase::Running | Phase::Stopping))
    {
        for s in j.held() {
            free.remove(&s);
        }
    }
    let mut queued: Vec<&JobRecord> = jobs.iter().filter(|j| j.phase == Phase::Queued).collect();
    queued.sort_by_key(|j| j.seq);
    let mut actions = Vec::new();
    let mut waiting = 0;
    for (i, job) in queued.iter().enumerate() {
        let last = i + 1 == queued.len();
        let fitting: Vec<usize> = job
            .allowed
            .iter()
            .copied()
            .filter(|&k| k <= free.len())
            .collect();
        let Some(&k) = (if last {
            fitting.last()
        } else {
            fitting.first()
        }) else {
            waiting += 1;
            if i == 0 && p.shrink {
                let shrinks = shrink_for(job, jobs, &free, p, now);
                if !shrinks.is_empty() {
                    actions.extend(shrinks);
                    return actions;
                }
            }
            continue;
        };
        let place = match in_one_node(&free, k, nodes, size) {
            Some(s) => s,
            None => {
                if i == 0 && p.migrate {
                    if let Some(m) = defragment(k, jobs, &free, nodes, size, p, now) {
                        actions.push(m);
                        return actions;
                    }
                }
                spread(&free, k, nodes, size).expect("k fits the free slots")
            }
        };
        for s in &place {
            free.remove(s);
        }
        actions.push(Action::Start {
            id: job.id.clone(),
            slots: place,
        });
    }
    if waiting == 0 && p.grow {
        actions.extend(grow(jobs, &mut free, nodes, size, p, now));
    }
    actions
}

/// Shrinks that free enough slots for `head` (empty when they cannot).
fn shrink_for(
    head: &JobRecord,
    jobs: &[JobRecord],
    free: &BTreeSet<usize>,
    p: &PolicyParams,
    now: f64,
) -> Vec<Action> {
    let need = head.allowed.first().copied().unwrap_or(usize::MAX);
    let mut candidates: Vec<(&JobRecord, usize)> = jobs
        .iter()
        .filter(|j| movable(j, p, now))
        .filter_map(|j| {
            let k = j.slots.len();
            let smaller = j.allowed.iter().copied().filter(|&a| a < k).max()?;
            Some((j, smaller))
        })
        .collect();
    candidates.sort_by_key(|(j, _)| (std::cmp::Reverse(j.slots.len() - j.min_ranks), j.seq));
    let mut freed = free.len();
    let mut actions = Vec::new();
    for (j, smaller) in candidates {
        if freed >= need {
            break;
        }
        freed += j.slots.len() - smaller;
        actions.push(Action::Move {
            id: j.id.clone(),
            slots: j.slots[..smaller].to_vec(),
        });
    }
    if freed >= need {
        actions
    } else {
        Vec::new()
    }
}

/// A migration that empties enough of one node for a job of `k` ranks, if one pays.
fn defragment(
    k: usize,
    jobs: &[JobRecord],
    free: &BTreeSet<usize>,
    nodes: usize,
    size: usize,
    p: &PolicyParams,
    now: f64,
) -> Option<Action> {
    let mut best: Option<(usize, u64, Action)> = None;
    for n in 0..nodes {
        let here = node_free(free, n, size).len();
        let node_slots = (n * size..((n + 1) * size)).count();
        if node_slots < k {
            continue;
        }
        for j in jobs.iter().filter(|j| movable(j, p, now)) {
            let m = j.slots.len();
            if !j.slots.iter().all(|s| s / size == n) || here + m < k {
                continue;
            }
            let mut others = free.clone();
            for s in node_free(free, n, size) {
                others.remove(&s);
            }
            let Some(to) = in_one_node(&others, m, nodes, size) else {
                continue;
            };
            if best
                .as_ref()
                .is_none_or(|(bm, bseq, _)| (m, j.seq) < (*bm, *bseq))
            {
                best = Some((
                    m,
                    j.seq,
                    Action::Move {
                        id: j.id.clone(),
                        slots: to,
                    },
                ));
            }
        }
    }
    best.map(|(_, _, a)| a)
}

/// Grows running elastic jobs into `free` (nobody is queued).
fn grow(
    jobs: &[JobRecord],
    free: &mut BTreeSet<usize>,
    nodes: usize,
    size: usize,
    p: &PolicyParams,
    now: f64,
) -> Vec<Action> {
    let mut running: Vec<&JobRecord> = jobs.iter().filter(|j| movable(j, p, now)).collect();
    running.sort_by_key(|j| (j.slots.len(), j.seq));
    let mut actions = Vec::new();
    for j in running {
        let k = j.slots.len();
        let Some(bigger) = j
            .allowed
            .iter()
            .copied()
            .find(|&a| a > k && a - k <= free.len())
        else {
            continue;
        };
        let remaining = j.remaining_s().unwrap_or(0.0);
        let saved = remaining * (1.0 - speedup(p.serial, k) / speedup(p.serial, bigger));
        if saved <= j.expected_pause(p.move_cost_s) {
            continue;
        }
        let node = j.slots[0] / size;
        let own_node = j.slots.iter().all(|s| s / size == node);
        let extra = node_free(free, node, size);
        let target = if own_node && extra.len() >= bigger - k {
            let mut t = j.slots.clone();
            t.extend_from_slice(&extra[..bigger - k]);
            t
        } else if let Some(t) = {
            let mut with_own = free.clone();
            with_own.extend(j.slots.iter().copied());
            in_one_node(&with_own, bigger, nodes, size)
        } {
            t
        } else {
            let mut t = j.slots.clone();
            t.extend(spread(free, bigger - k, nodes, size).unwrap_or_default());
            t
        };
        for s in &target {
            free.remove(s);
        }
        let mut target = target;
        target.sort_unstable();
        actions.push(Action::Move {
            id: j.id.clone(),
            slots: target,
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
    fn a_lone_job_starts_on_its_most_ranks_and_others_on_their_fewest() {
        let jobs = vec![job(1, 1, 2, &[1, 2]), job(2, 1, 2, &[1, 2])];
        let a = plan(&jobs, 4, &params(4), 10.0);
        assert_eq!(
            a,
            vec![
                Action::Start {
                    id: "job-1".into(),
                    slots: vec![0]
                },
                Action::Start {
                    id: "job-2".into(),
                    slots: vec![1, 2]
                },
            ]
        );
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
    fn a_job_split_by_fragmentation_migrates_another_to_free_a_node() {
        // Slots 1 and 2 busy (one per node); a 2-rank job fits the free slots 0 and 3 but no node.
        let jobs = vec![
            running(job(1, 1, 1, &[1]), &[1]),
            running(job(2, 1, 1, &[1]), &[2]),
            job(3, 2, 2, &[2]),
        ];
        let a = plan(&jobs, 4, &params(2), 10.0);
        assert_eq!(
            a,
            vec![Action::Move {
                id: "job-1".into(),
                slots: vec![3]
            }]
        );
        // Without migration it is spread over the two nodes.
        let p = PolicyParams {
            migrate: false,
            ..params(2)
        };
        assert_eq!(
            plan(&jobs, 4, &p, 10.0),
            vec![Action::Start {
                id: "job-3".into(),
                slots: vec![0, 3]
            }]
        );
    }

    #[test]
    fn an_elastic_job_shrinks_to_admit_the_head_and_grows_when_nobody_waits() {
        let jobs = vec![
            running(job(1, 1, 4, &[1, 2, 4]), &[0, 1, 2, 3]),
            job(2, 2, 2, &[2]),
        ];
        assert_eq!(
            plan(&jobs, 4, &params(4), 10.0),
            vec![Action::Move {
                id: "job-1".into(),
                slots: vec![0, 1]
            }]
        );
        let jobs = vec![running(job(1, 1, 4, &[1, 2, 4]), &[0, 1])];
        assert_eq!(
            plan(&jobs, 4, &params(4), 10.0),
            vec![Action::Move {
                id: "job-1".into(),
                slots: vec![0, 1, 2, 3]
            }]
        );
    }

    #[test]
    fn moves_respect_the_overhead_budget_and_wait_for_each_other() {
        // 900 s left at 5%: 45 s of pauses allowed; 44 already spent, the next costs 2.
        let mut j = running(job(1, 1, 4, &[1, 2, 4]), &[0, 1]);
        j.move_pause_s = 44.0;
        j.move_pauses = vec![2.0];
        assert_eq!(plan(&[j.clone()], 4, &params(4), 0.0), vec![]);
        j.move_pause_s = 40.0;
        assert_eq!(plan(&[j.clone()], 4, &params(4), 0.0).len(), 1);
        let mut stopping = running(job(2, 1, 1, &[1]), &[3]);
        stopping.phase = Phase::Stopping;
        stopping.stop_reason = Some(StopReason::Move);
        j.slots = vec![0];
        assert_eq!(
            plan(&[j, stopping, job(3, 1, 1, &[1])], 4, &params(4), 0.0),
            vec![]
        );
    }
}
