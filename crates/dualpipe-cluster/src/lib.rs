//! EPLB for the cluster: many training jobs on one shared pool of devices.
//!
//! * [`Cluster`]: nodes of devices with speed and memory, the planner's link classes, each
//!   node's monitored metrics (JSON, docs/cluster.md).
//! * [`Job`]s from a trace CSV ([`parse_trace`]) or the seeded generator ([`synth_trace`]).
//! * [`Throughput`]: a job's rate on a set of devices: the planner's simulation for a job with
//!   a cost profile, otherwise a documented scaling curve with a locality factor.
//! * [`Policy`]: `static` (first come first served, rigid, never moved) and `elastic` (Kuhn-Munkres
//!   placement on a job x node reward, grow and shrink by marginal gain, migration when it pays,
//!   at most 5% of a job's run time spent moving).
//! * [`simulate()`]: the trace-driven discrete-event simulator and its [`Metrics`].
//! * [`serve`]: the real mode, a scheduler of real training processes on local slots.
//!
//! ```
//! use dualpipe_cluster::{run, Cluster, Policy, SimOptions, synth_trace, SynthOptions};
//!
//! let cluster = Cluster::uniform(4, 8).unwrap();
//! let jobs = synth_trace(&SynthOptions { jobs: 50, seed: 3, devices: 32, ..Default::default() }).unwrap();
//! let outcome = run(&cluster, &jobs, &Default::default(), Policy::Static, &SimOptions::default()).unwrap();
//! assert_eq!(outcome.jobs.len(), 50);
//! assert!(outcome.metrics.utilization > 0.0 && outcome.metrics.utilization <= 1.0);
//! ```

#![warn(missing_docs)]

pub mod assign;
pub mod cluster;
pub mod elastic;
pub mod error;
pub mod k8s;
pub mod las;
pub mod metrics;
pub mod names;
pub mod policy;
pub mod queue;
pub mod serve;
pub mod simulate;
pub mod state;
pub mod svg;
pub mod synth;
pub mod throughput;
pub mod trace;

use std::collections::BTreeMap;

pub use cluster::Cluster;
pub use elastic::ElasticParams;
pub use error::ClusterError;
pub use metrics::Metrics;
pub use policy::Policy;
pub use simulate::{simulate, simulate_with_progress, JobOutcome, Outcome, Tick};
pub use state::{MoveCost, State};
pub use synth::{synth_trace, SynthOptions};
pub use throughput::{Curve, Throughput};
pub use trace::{check_fits, offered_load, parse_trace, write_trace, Job};

/// The model's parameters of one simulation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimOptions {
    /// The scaling curve of jobs without a profile.
    pub curve: Curve,
    /// What a move costs.
    pub cost: MoveCost,
}

/// Checks `jobs` against `cluster` and simulates them under `policy`; `profiles` maps the
/// trace's profile names to cost profiles.
pub fn run(
    cluster: &Cluster,
    jobs: &[Job],
    profiles: &BTreeMap<String, dualpipe_plan::Profile>,
    policy: Policy,
    options: &SimOptions,
) -> Result<Outcome, ClusterError> {
    run_with_progress(cluster, jobs, profiles, policy, options, &mut |_| {})
}

/// [`run()`], telling `progress` how far it has got each time jobs finish (a million jobs
/// take tens of seconds).
pub fn run_with_progress(
    cluster: &Cluster,
    jobs: &[Job],
    profiles: &BTreeMap<String, dualpipe_plan::Profile>,
    mut policy: Policy,
    options: &SimOptions,
    progress: &mut dyn FnMut(Tick),
) -> Result<Outcome, ClusterError> {
    check_fits(jobs, cluster)?;
    let throughput = Throughput::new(cluster, options.curve, jobs, profiles)?;
    let state = State::new(cluster, jobs, throughput, options.cost);
    simulate_with_progress(state, &mut policy, progress)
}
