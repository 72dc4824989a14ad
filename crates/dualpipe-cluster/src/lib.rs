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
//! * [`simulate()`]: the trace-driven discrete-event simulator and its [`Metrics`]; the
//!   simulator's files are the folder [`sim`].
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

pub mod cluster;
pub mod error;
pub mod k8s;
pub mod names;
pub mod serve;
pub mod sim;
pub mod svg;
pub mod synth;
pub mod throughput;
pub mod trace;

pub use cluster::Cluster;
pub use error::ClusterError;
pub use sim::elastic::ElasticParams;
pub use sim::las::LasParams;
pub use sim::metrics::Metrics;
pub use sim::policy::Policy;
pub use sim::simulate::{simulate, simulate_with_progress, JobOutcome, Outcome, Tick};
pub use sim::state::{MoveCost, State};
pub use sim::{run, run_with_progress, SimOptions};
pub use synth::{synth_trace, SynthOptions};
pub use throughput::{Curve, Throughput};
pub use trace::{check_fits, offered_load, parse_trace, write_trace, Job};
