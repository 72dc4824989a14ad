//! The queue of waiting jobs, indexed so that a policy finds the next job that fits without
//! walking the whole queue (an overloaded trace queues most of its jobs: a walk per event makes
//! a run quadratic in jobs).
//!
//! Jobs are ordered by `(class, arrival)`: the class is 0 unless a policy ranks by attained
//! service (`las` sets its thresholds with [`Queue::rank_by`]: a job's class is the number of
//! thresholds its attained device-seconds reach when it joins, which stays its class while it
//! waits, since a waiting job attains nothing), and arrival is the trace's order (arrival time,
//! then row). A policy that never preempts queues jobs as they arrive, so for it this is the
//! order they joined in.
//!
//! Each position holds the job's devices in three minimum trees, so that "the first job at or
//! after position `p` asking for at most `cap` devices" takes O(log n): by its `min_gpus`
//! ([`Need::Least`]), and by its `gpus`, split between jobs that fit in the largest node
//! ([`Need::InNode`]) and larger ones ([`Need::Wide`]).

use crate::trace::Job;

/// Which of a job's device counts a search compares with its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// `min_gpus` (capped at the cluster's devices): what an elastic job starts on.
    Least,
    /// `gpus`, of jobs whose `gpus` fit in the largest node (others never match).
    InNode,
    /// `gpus`, of jobs whose `gpus` exceed the largest node (others never match).
    Wide,
}

/// No job here (a tree's empty leaf).
const EMPTY: u32 = u32::MAX;

/// A minimum tree over positions with "first position at or after `p` whose value is at most
/// `cap`" in O(log n).
#[derive(Clone, Debug)]
struct MinTree {
    /// Leaves start at `width`; node `i`'s children are `2i` and `2i + 1`.
    min: Vec<u32>,
    width: usize,
}

impl MinTree {
    fn new(positions: usize) -> MinTree {
        let width = positions.max(1).next_power_of_two();
        MinTree {
            min: vec![EMPTY; 2 * width],
            width,
        }
    }

    fn set(&mut self, pos: usize, value: u32) {
        let mut i = pos + self.width;
        self.min[i] = value;
        // Up to the first node whose minimum stays: those above it stay too.
        while i > 1 {
            i /= 2;
            let min = self.min[2 * i].min(self.min[2 * i + 1]);
            if self.min[i] == min {
                break;
            }
            self.min[i] = min;
        }
    }

    /// The first position `>= from` holding a value `<= cap`.
    fn first_at_most(&self, from: usize, cap: u32) -> Option<usize> {
        if from >= self.width || cap == EMPTY {
            return None;
        }
        // Walk up from the leaf: at each left child, try its right sibling's subtree.
        let mut i = from + self.width;
        if self.min[i] <= cap {
            return Some(from);
        }
        loop {
            while i % 2 == 1 {
                i /= 2; // a right child: its parent's right subtree is done
                if i <= 1 {
                    return None;
                }
            }
            i += 1; // the right sibling
            if self.min[i] <= cap {
                break;
            }
        }
        // Down to the leftmost leaf within cap.
        while i < self.width {
            i = if self.min[2 * i] <= cap {
                2 * i
            } else {
                2 * i + 1
            };
        }
        Some(i - self.width)
    }
}

/// The jobs' indices in arrival order: by arrival time, then row.
pub fn arrival_order(jobs: &[Job]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| {
        jobs[a]
            .arrival_s
            .total_cmp(&jobs[b].arrival_s)
            .then(a.cmp(&b))
    });
    order
}

/// The waiting jobs (module documentation).
#[derive(Clone, Debug)]
pub struct Queue {
    /// Each job's rank in arrival order (time, then row).
    rank: Vec<usize>,
    /// The job of each rank.
    by_rank: Vec<usize>,
    /// Each job's `min_gpus` capped at the cluster's devices, and `gpus`.
    least: Vec<u32>,
    gpus: Vec<u32>,
    /// The largest node's devices.
    largest: usize,
    /// `las`'s thresholds (none: one class).
    thresholds: Vec<f64>,
    /// Each waiting job's position; `None` for the others.
    position: Vec<Option<usize>>,
    trees: [MinTree; 3],
    len: usize,
}

impl Queue {
    /// An empty queue for `jobs` on a cluster of `devices` devices whose largest node has
    /// `largest`.
    pub fn new(jobs: &[Job], devices: usize, largest: usize) -> Queue {
        let by_rank = arrival_order(jobs);
        let mut rank = vec![0; jobs.len()];
        for (r, &j) in by_rank.iter().enumerate() {
            rank[j] = r;
        }
        let count = |k: usize| u32::try_from(k).unwrap_or(EMPTY - 1).min(EMPTY - 1);
        Queue {
            rank,
            by_rank,
            least: jobs
                .iter()
                .map(|j| count(j.min_gpus.min(devices)))
                .collect(),
            gpus: jobs.iter().map(|j| count(j.gpus)).collect(),
            largest,
            thresholds: Vec::new(),
            position: vec![None; jobs.len()],
            trees: std::array::from_fn(|_| MinTree::new(jobs.len())),
            len: 0,
        }
    }

    /// The class of a job that attained `service` device-seconds: how many thresholds it
    /// reaches.
    pub fn class_of(&self, service: f64) -> usize {
        self.thresholds.iter().filter(|&&t| service >= t).count()
    }

    /// Orders the queue by attained service over `thresholds` first (`las`); `attained` gives a
    /// waiting job's device-seconds. A no-op when they are the thresholds already in use.
    pub fn rank_by(&mut self, thresholds: &[f64], attained: impl Fn(usize) -> f64) {
        if self.thresholds == thresholds {
            return;
        }
        let waiting: Vec<usize> = self.iter().collect();
        for &j in &waiting {
            self.remove(j);
        }
        self.thresholds = thresholds.to_vec();
        let positions = (self.thresholds.len() + 1) * self.rank.len();
        self.trees = std::array::from_fn(|_| MinTree::new(positions));
        for j in waiting {
            self.push(j, attained(j));
        }
    }

    /// The position job `j` takes with `service` attained: its class, then its arrival rank.
    pub fn position_of(&self, j: usize, service: f64) -> usize {
        self.class_of(service) * self.rank.len() + self.rank[j]
    }

    /// Queues job `j`, which attained `service` device-seconds (it must not be waiting).
    pub fn push(&mut self, j: usize, service: f64) {
        assert!(self.position[j].is_none(), "job {j} is already waiting");
        let pos = self.position_of(j, service);
        self.position[j] = Some(pos);
        let (least, gpus) = (self.least[j], self.gpus[j]);
        let in_node = gpus as usize <= self.largest;
        self.trees[0].set(pos, least);
        self.trees[1].set(pos, if in_node { gpus } else { EMPTY });
        self.trees[2].set(pos, if in_node { EMPTY } else { gpus });
        self.len += 1;
    }

    /// Takes job `j` out of the queue; `false` when it was not waiting.
    pub fn remove(&mut self, j: usize) -> bool {
        let Some(pos) = self.position[j].take() else {
            return false;
        };
        for tree in &mut self.trees {
            tree.set(pos, EMPTY);
        }
        self.len -= 1;
        true
    }

    /// Whether job `j` waits.
    pub fn contains(&self, j: usize) -> bool {
        self.position[j].is_some()
    }

    /// How many jobs wait.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The job at position `pos`.
    fn job_at(&self, pos: usize) -> usize {
        self.by_rank[pos % self.rank.len()]
    }

    /// The first waiting job at or after position `from` whose `need` is at most `cap`, with
    /// its position.
    pub fn next_fitting(&self, from: usize, need: Need, cap: usize) -> Option<(usize, usize)> {
        let cap = u32::try_from(cap).unwrap_or(EMPTY - 1).min(EMPTY - 1);
        let tree = &self.trees[need as usize];
        tree.first_at_most(from, cap)
            .map(|pos| (pos, self.job_at(pos)))
    }

    /// The first waiting job at or after position `from` asking for at most `cap` devices
    /// (`gpus`), with its position.
    pub fn next_asking_at_most(&self, from: usize, cap: usize) -> Option<(usize, usize)> {
        let in_node = self.next_fitting(from, Need::InNode, cap);
        let wide = self.next_fitting(from, Need::Wide, cap);
        match (in_node, wide) {
            (Some(a), Some(b)) => Some(if a.0 < b.0 { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// The first waiting job.
    pub fn first(&self) -> Option<usize> {
        self.next_fitting(0, Need::Least, usize::MAX)
            .map(|(_, j)| j)
    }

    /// The waiting jobs in order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let mut from = 0;
        std::iter::from_fn(move || {
            let (pos, j) = self.next_fitting(from, Need::Least, usize::MAX)?;
            from = pos + 1;
            Some(j)
        })
    }
}

#[cfg(test)]
mod tests;
