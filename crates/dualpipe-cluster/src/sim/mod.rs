//! The trace-driven simulator: the pool's state, the queue, the policies and the event loop.
//!
//! Layers, each importing only from those above it in this list (no circle):
//!
//! * [`queue`] (the waiting jobs, indexed), [`state`] (who holds what, each job's progress),
//!   [`metrics`] (what a run measured) and [`bound`] (the best any rigid schedule reaches),
//!   [`assign`] (Kuhn-Munkres);
//! * [`place`]: the placement rules every policy shares;
//! * the policies, none importing another: [`first_come`] (`static`), [`elastic`], [`las`];
//! * [`policy`]: the policies by name, the one call the event loop makes;
//! * [`simulate`]: the event loop, and [`run()`], which checks a trace and runs it.

pub mod assign;
pub mod bound;
pub mod elastic;
pub mod first_come;
pub mod las;
pub mod metrics;
pub mod place;
pub mod policy;
pub mod queue;
pub mod simulate;
pub mod state;

use std::collections::BTreeMap;

use crate::cluster::Cluster;
use crate::error::ClusterError;
use crate::sim::policy::Policy;
use crate::sim::simulate::{simulate_with_progress, Outcome, Tick};
use crate::sim::state::{MoveCost, State};
use crate::throughput::{Curve, Throughput};
use crate::trace::{check_fits, Job};

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
