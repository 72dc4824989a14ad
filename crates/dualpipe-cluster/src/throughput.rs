//! How fast a job runs on a set of devices, relative to its requested shape.
//!
//! A job's work is its `duration_s`: seconds on `gpus` devices of speed 1 placed on the fewest
//! nodes. On devices `D` it progresses at `rate(D)` seconds of that work per second.
//!
//! * **With a profile** (a `dualpipe plan` cost profile): `rate(D)` is the planner's best
//!   simulated throughput on the topology of `D` (every message charged by the link it crosses)
//!   over its throughput on the requested shape. Results are cached by shape.
//! * **Without**: the scaling curve `S(k) = k / (1 + sigma (k - 1))` (a job's serial share
//!   `sigma` of its step does not shrink with more devices), a locality factor
//!   `1 / (1 + lambda x extra_nodes)` for each node spanned beyond the fewest that could hold
//!   `k` devices, and the slowest device's speed:
//!   `rate(D) = S(|D|) / S(gpus) x locality(D) x min speed(D)`.

use std::collections::BTreeMap;

use dualpipe_plan::{plan, PlanOptions, Profile};
use serde::Serialize;

use crate::cluster::Cluster;
use crate::error::ClusterError;
use crate::trace::Job;

/// The curve's parameters (documented in docs/cluster.md).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Curve {
    /// Serial share of a step, `sigma` (0: perfect scaling).
    pub serial: f64,
    /// Slowdown per node spanned beyond the fewest, `lambda`.
    pub locality: f64,
}

impl Default for Curve {
    fn default() -> Self {
        Curve {
            serial: 0.02,
            locality: 0.15,
        }
    }
}

impl Curve {
    /// `S(k)`: speed-up on `k` devices over one.
    pub fn speedup(&self, k: usize) -> f64 {
        if k == 0 {
            return 0.0;
        }
        k as f64 / (1.0 + self.serial * (k as f64 - 1.0))
    }
}

/// A shape the planner is asked about: device count, devices per node used (sorted), speed.
type ShapeKey = (usize, Vec<usize>, u64);

/// The throughput model of a trace's jobs on one cluster.
pub struct Throughput<'a> {
    cluster: &'a Cluster,
    curve: Curve,
    /// Each job's profile index into `profiles`.
    profile_of: Vec<Option<usize>>,
    profiles: Vec<Profile>,
    cache: BTreeMap<(usize, ShapeKey), f64>,
}

impl<'a> Throughput<'a> {
    /// The model for `jobs`; `profiles` maps a trace's profile names to parsed profiles.
    /// A job naming a profile that is not given is refused.
    pub fn new(
        cluster: &'a Cluster,
        curve: Curve,
        jobs: &[Job],
        profiles: &BTreeMap<String, Profile>,
    ) -> Result<Throughput<'a>, ClusterError> {
        let names: Vec<&String> = profiles.keys().collect();
        let mut profile_of = Vec::with_capacity(jobs.len());
        for job in jobs {
            profile_of.push(match &job.profile {
                None => None,
                Some(p) => Some(names.iter().position(|n| *n == p).ok_or_else(|| {
                    ClusterError::Profile(format!(
                        "job {}: profile {p} was not given; put the file beside the trace",
                        job.name
                    ))
                })?),
            });
        }
        let mut model = Throughput {
            cluster,
            curve,
            profile_of,
            profiles: profiles.values().cloned().collect(),
            cache: BTreeMap::new(),
        };
        for (j, job) in jobs.iter().enumerate() {
            if model.profile_of[j].is_some() {
                let compact = model.compact(job.gpus);
                if model.planned(j, &compact) <= 0.0 {
                    return Err(ClusterError::Profile(format!(
                        "job {}: the planner finds no plan for its profile on {} devices; ask for a count the model can be split over",
                        job.name, job.gpus
                    )));
                }
            }
        }
        Ok(model)
    }

    /// The curve in use.
    pub fn curve(&self) -> Curve {
        self.curve
    }

    /// `k` devices on the fewest nodes, from the first (a reference placement).
    pub fn compact(&self, k: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.cluster.nodes.len()).collect();
        order.sort_by_key(|&n| std::cmp::Reverse(self.cluster.nodes[n].devices));
        let mut devices = Vec::with_capacity(k);
        for n in order {
            let node = &self.cluster.nodes[n];
            for d in node.first_device..node.first_device + node.devices {
                if devices.len() < k {
                    devices.push(d);
                }
            }
        }
        devices.sort_unstable();
        devices
    }

    /// The fewest nodes that can hold `k` devices.
    pub fn fewest_nodes(&self, k: usize) -> usize {
        let mut sizes: Vec<usize> = self.cluster.nodes.iter().map(|n| n.devices).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut held = 0;
        for (i, s) in sizes.iter().enumerate() {
            if held >= k {
                return i;
            }
            held += s;
        }
        sizes.len()
    }

    fn shape(&self, devices: &[usize]) -> ShapeKey {
        let mut per_node: BTreeMap<usize, usize> = BTreeMap::new();
        for &d in devices {
            *per_node.entry(self.cluster.node_of[d]).or_default() += 1;
        }
        let mut counts: Vec<usize> = per_node.values().copied().collect();
        counts.sort_unstable();
        let speed = devices
            .iter()
            .map(|&d| self.cluster.nodes[self.cluster.node_of[d]].speed)
            .fold(f64::INFINITY, f64::min);
        (devices.len(), counts, speed.to_bits())
    }

    /// Planner throughput (micro-batches per second) of job `j`'s profile on `devices`; 0
    /// when no plan fits.
    fn planned(&mut self, j: usize, devices: &[usize]) -> f64 {
        let p = self.profile_of[j].expect("a profile job");
        let key = (p, self.shape(devices));
        if let Some(&v) = self.cache.get(&key) {
            return v;
        }
        let topology = self.cluster.topology_of(devices);
        let options = PlanOptions {
            kinds: vec![dualpipe_schedule_kind()],
            micro_batches: vec![2 * devices.len()],
            even: false,
            previous: None,
        };
        let v = match plan(&topology, &self.profiles[p], &options) {
            Ok(report) => report.plans.first().map_or(0.0, |b| b.throughput),
            Err(_) => 0.0,
        };
        self.cache.insert(key, v);
        v
    }

    /// Job `j`'s rate on `devices` (seconds of its work per second); 0 for no devices or a
    /// shape its profile has no plan for.
    pub fn rate(&mut self, j: usize, job: &Job, devices: &[usize]) -> f64 {
        if devices.is_empty() {
            return 0.0;
        }
        if self.profile_of[j].is_some() {
            let reference = self.compact(job.gpus);
            return self.planned(j, devices) / self.planned(j, &reference);
        }
        let nodes: std::collections::BTreeSet<usize> =
            devices.iter().map(|&d| self.cluster.node_of[d]).collect();
        let extra = nodes.len().saturating_sub(self.fewest_nodes(devices.len()));
        let speed = devices
            .iter()
            .map(|&d| self.cluster.nodes[self.cluster.node_of[d]].speed)
            .fold(f64::INFINITY, f64::min);
        self.curve.speedup(devices.len()) / self.curve.speedup(job.gpus) * speed
            / (1.0 + self.curve.locality * extra as f64)
    }

    /// Job `j`'s rate on `k` devices placed compactly (what a policy plans with).
    pub fn rate_at(&mut self, j: usize, job: &Job, k: usize) -> f64 {
        if self.profile_of[j].is_none() {
            return self.curve.speedup(k) / self.curve.speedup(job.gpus);
        }
        let compact = self.compact(k);
        self.rate(j, job, &compact)
    }
}

/// The schedule the throughput of a profile job is planned with (the V-shaped DualPipe: half
/// the parameter copies of DualPipe, the same bubble).
fn dualpipe_schedule_kind() -> dualpipe_schedule::ScheduleKind {
    dualpipe_schedule::ScheduleKind::DualPipeV
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::parse_trace;

    #[test]
    fn curve_is_relative_to_the_requested_shape() {
        let cluster = Cluster::uniform(4, 8).unwrap();
        let jobs = parse_trace("a,0,8,100,4,16").unwrap();
        let mut t = Throughput::new(&cluster, Curve::default(), &jobs, &BTreeMap::new()).unwrap();
        let one_node: Vec<usize> = (0..8).collect();
        assert!((t.rate(0, &jobs[0], &one_node) - 1.0).abs() < 1e-12);
        // The same 8 devices over two nodes: one extra node, slower by the locality factor.
        let split: Vec<usize> = (4..12).collect();
        assert!((t.rate(0, &jobs[0], &split) - 1.0 / 1.15).abs() < 1e-12);
        // More devices: faster, but less than linearly.
        let r16 = t.rate_at(0, &jobs[0], 16);
        assert!(r16 > 1.5 && r16 < 2.0, "{r16}");
        assert_eq!(t.fewest_nodes(9), 2);
    }

    #[test]
    fn a_profile_job_is_rated_by_the_planner() {
        let cluster = Cluster::uniform(2, 4).unwrap();
        let layer = dualpipe_plan::LayerCost {
            f: 1e-3,
            i: 1e-3,
            w: 1e-3,
            activation_bytes: 1e6,
            parameter_bytes: 1e8,
            w_bytes: None,
            recompute: None,
        };
        let mut profiles = BTreeMap::new();
        profiles.insert("p".to_string(), Profile::uniform(16, layer, 1 << 20));
        let jobs = parse_trace("a,0,2,100,2,8,p").unwrap();
        let mut t = Throughput::new(&cluster, Curve::default(), &jobs, &profiles).unwrap();
        assert!((t.rate(0, &jobs[0], &[0, 1]) - 1.0).abs() < 1e-12);
        let four = t.rate(0, &jobs[0], &[0, 1, 2, 3]);
        assert!(four > 1.2, "{four}");
        let missing = parse_trace("a,0,2,100,2,8,q").unwrap();
        let err = Throughput::new(&cluster, Curve::default(), &missing, &profiles)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("profile q was not given"), "{err}");
    }
}
