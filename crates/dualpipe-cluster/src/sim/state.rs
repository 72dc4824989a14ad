//! The scheduler's view of the pool at one instant: who holds which device, the queue, and
//! each job's progress. Policies read it and act through [`State::start`] and
//! [`State::reshape`]; every action is recorded as device segments for the invariants and the
//! picture.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cluster::Cluster;
use crate::sim::queue::Queue;
use crate::throughput::Throughput;
use crate::trace::Job;

/// One job holding a set of devices from `start_s` to `end_s`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Segment {
    /// The job's index in the trace.
    pub job: usize,
    /// The devices held.
    pub devices: Vec<usize>,
    /// When the hold began, in seconds.
    pub start_s: f64,
    /// When it ended, in seconds.
    pub end_s: f64,
}

/// A running job.
#[derive(Clone, Debug, PartialEq)]
pub struct Running {
    /// Its index in the trace.
    pub job: usize,
    /// The devices it holds.
    pub devices: Vec<usize>,
    /// Seconds of its work done per second on these devices.
    pub rate: f64,
    /// Until when it makes no progress (restarting after a move).
    pub paused_until: f64,
    /// When it took these devices.
    pub since: f64,
}

/// Per-job progress.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    /// Seconds of its work done (out of `duration_s`).
    pub done: f64,
    /// When it first started.
    pub first_start: Option<f64>,
    /// When it finished.
    pub finish: Option<f64>,
    /// Seconds spent moving (checkpoint, transfer, restart).
    pub overhead_s: f64,
    /// Moves to other devices with the same count.
    pub migrations: usize,
    /// Moves to another device count.
    pub resizes: usize,
    /// Device-seconds held so far (least attained service).
    pub attained: f64,
    /// Preempted and not restarted yet: the restart pays the move cost.
    pub preempted: bool,
}

/// What a move costs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MoveCost {
    /// Seconds to stop, restart and reload a job, besides the transfer.
    pub restart_s: f64,
    /// Checkpoint bytes per device the job holds (sent over the inter-node link).
    pub checkpoint_bytes_per_device: f64,
}

impl Default for MoveCost {
    fn default() -> Self {
        MoveCost {
            restart_s: 30.0,
            checkpoint_bytes_per_device: 20e9,
        }
    }
}

/// The pool, the queue and the jobs.
pub struct State<'a> {
    /// The cluster.
    pub cluster: &'a Cluster,
    /// The jobs of the trace.
    pub jobs: &'a [Job],
    /// Their throughput model.
    pub throughput: Throughput<'a>,
    /// What a move costs.
    pub cost: MoveCost,
    /// For each device, the job holding it.
    pub owner: Vec<Option<usize>>,
    /// Free devices per node.
    pub free_per_node: Vec<usize>,
    /// Jobs waiting, in arrival order (`las`: by attained service first; [`Queue`]).
    pub queue: Queue,
    /// Jobs running, in start order.
    pub running: Vec<Running>,
    /// Every job's progress.
    pub progress: Vec<Progress>,
    /// Every hold so far (closed ones; open ones are closed when they end).
    pub segments: Vec<Segment>,
    /// A job's measured move pause, in seconds, which replaces the modelled cost (the real
    /// mode's view; empty in the simulator).
    pub measured_move_s: Vec<Option<f64>>,
    /// Per user, the work (seconds at the requested count) of their last two finished jobs,
    /// the latest last: what the scheduler has seen, from which it predicts run times.
    pub history: BTreeMap<String, Vec<f64>>,
}

impl<'a> State<'a> {
    /// An empty pool.
    pub fn new(
        cluster: &'a Cluster,
        jobs: &'a [Job],
        throughput: Throughput<'a>,
        cost: MoveCost,
    ) -> State<'a> {
        State {
            cluster,
            jobs,
            throughput,
            cost,
            owner: vec![None; cluster.devices()],
            free_per_node: cluster.nodes.iter().map(|n| n.devices).collect(),
            queue: Queue::new(jobs, cluster.devices(), cluster.largest_node()),
            running: Vec::new(),
            progress: vec![Progress::default(); jobs.len()],
            segments: Vec::new(),
            measured_move_s: Vec::new(),
            history: BTreeMap::new(),
        }
    }

    /// Free devices in all.
    pub fn free(&self) -> usize {
        self.free_per_node.iter().sum()
    }

    /// The free devices of node `n`, lowest first.
    pub fn free_devices_of(&self, n: usize) -> Vec<usize> {
        let node = &self.cluster.nodes[n];
        (node.first_device..node.first_device + node.devices)
            .filter(|&d| self.owner[d].is_none())
            .collect()
    }

    /// Seconds a move of job `j` onto `k` devices costs: checkpoint bytes over the inter-node
    /// link plus the restart (or its measured pause, [`State::measured_move_s`]).
    pub fn move_cost(&self, j: usize, k: usize) -> f64 {
        if let Some(&Some(measured)) = self.measured_move_s.get(j) {
            return measured;
        }
        let held = self
            .running
            .iter()
            .find(|r| r.job == j)
            .map_or(k, |r| r.devices.len());
        let link = self.cluster.links.inter_node;
        self.cost.restart_s
            + link.latency
            + held.max(k) as f64 * self.cost.checkpoint_bytes_per_device / link.bandwidth
    }

    /// The policies' estimate of job `j`'s remaining work (seconds at its requested count),
    /// from what a scheduler can know, never from its `duration_s`: the mean of its user's
    /// last two finished jobs (EASY++'s predictor) minus the work it has done, while that is
    /// positive; otherwise (no user, no history, or the job has outlived the prediction) the
    /// work it has done (the least-attained-service prior: a job that has run long tends to
    /// run long).
    pub fn remaining_estimate(&self, j: usize) -> f64 {
        let done = self.progress[j].done;
        let predicted = self.jobs[j]
            .user
            .as_ref()
            .and_then(|u| self.history.get(u))
            .filter(|h| !h.is_empty())
            .map(|h| h.iter().sum::<f64>() / h.len() as f64);
        match predicted {
            Some(p) if p > done => p - done,
            _ => done,
        }
    }

    /// Seconds job `j` has been running since it first started.
    pub fn run_time(&self, j: usize, now: f64) -> f64 {
        self.progress[j].first_start.map_or(0.0, |s| now - s)
    }

    fn take(&mut self, j: usize, devices: &[usize]) {
        for &d in devices {
            assert!(self.owner[d].is_none(), "device {d} is already held");
            self.owner[d] = Some(j);
            self.free_per_node[self.cluster.node_of[d]] -= 1;
        }
    }

    fn release(&mut self, devices: &[usize]) {
        for &d in devices {
            self.owner[d] = None;
            self.free_per_node[self.cluster.node_of[d]] += 1;
        }
    }

    /// Starts queued job `j` on free `devices` at `now`.
    pub fn start(&mut self, j: usize, devices: Vec<usize>, now: f64) {
        self.take(j, &devices);
        self.queue.remove(j);
        let rate = self.throughput.rate(j, &self.jobs[j], &devices);
        self.progress[j].first_start.get_or_insert(now);
        let mut paused_until = now;
        if std::mem::take(&mut self.progress[j].preempted) {
            let cost = self.move_cost(j, devices.len());
            paused_until += cost;
            self.progress[j].overhead_s += cost;
            self.progress[j].migrations += 1;
        }
        self.running.push(Running {
            job: j,
            devices,
            rate,
            paused_until,
            since: now,
        });
    }

    /// Stops running job `j` at `now` (checkpoint and stop) and queues it again; its restart
    /// pays the move cost.
    pub fn preempt(&mut self, j: usize, now: f64) {
        self.stop(j, now);
        self.progress[j].preempted = true;
        self.queue.push(j, self.progress[j].attained);
    }

    /// Moves running job `j` onto `devices` (free, or its own) at `now`: it pays the move's
    /// cost as a pause. A different count is a resize, the same count a migration.
    pub fn reshape(&mut self, j: usize, devices: Vec<usize>, now: f64) {
        let i = self
            .running
            .iter()
            .position(|r| r.job == j)
            .expect("a running job");
        let cost = self.move_cost(j, devices.len());
        let old = std::mem::take(&mut self.running[i].devices);
        self.segments.push(Segment {
            job: j,
            devices: old.clone(),
            start_s: self.running[i].since,
            end_s: now,
        });
        if old.len() == devices.len() {
            self.progress[j].migrations += 1;
        } else {
            self.progress[j].resizes += 1;
        }
        self.release(&old);
        self.take(j, &devices);
        let rate = self.throughput.rate(j, &self.jobs[j], &devices);
        let r = &mut self.running[i];
        r.devices = devices;
        r.rate = rate;
        r.paused_until = now + cost;
        r.since = now;
        self.progress[j].overhead_s += cost;
    }

    /// Takes running job `j` off its devices at `now`, closing its hold.
    fn stop(&mut self, j: usize, now: f64) {
        let i = self
            .running
            .iter()
            .position(|r| r.job == j)
            .expect("a running job");
        let r = self.running.remove(i);
        self.release(&r.devices);
        self.segments.push(Segment {
            job: j,
            devices: r.devices,
            start_s: r.since,
            end_s: now,
        });
    }

    /// Ends running job `j` at `now`.
    pub(crate) fn finish(&mut self, j: usize, now: f64) {
        self.stop(j, now);
        self.progress[j].finish = Some(now);
        self.progress[j].done = self.jobs[j].duration_s;
        if let Some(user) = &self.jobs[j].user {
            let seen = self.history.entry(user.clone()).or_default();
            seen.push(self.jobs[j].duration_s);
            if seen.len() > 2 {
                seen.remove(0);
            }
        }
    }
}
