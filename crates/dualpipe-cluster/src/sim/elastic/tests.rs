//! The elastic policy's helpers, and its admission against the plain walk it replaced.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::sim::state::MoveCost;
use crate::throughput::{Curve, Throughput};
use crate::trace::Job;

#[test]
fn nodes_spanned_counts_distinct_nodes_sorted_or_not() {
    let cluster = Cluster::uniform(4, 8).unwrap();
    assert_eq!(nodes_spanned(&cluster, &[3]), 1);
    assert_eq!(nodes_spanned(&cluster, &[0, 7, 8, 30]), 3);
    assert_eq!(nodes_spanned(&cluster, &[30, 0, 8, 7, 9]), 3);
    assert_eq!(
        nodes_spanned(&cluster, &[8, 9, 10, 11, 12, 13, 14, 15, 16]),
        2
    );
}

/// The admission as it was: every waiting job in queue order, shrinking where that admits it.
fn admit_plain(params: &ElasticParams, state: &State<'_>, now: f64) -> Admission {
    let devices = state.cluster.devices();
    let mut free = state.free();
    let mut admitted: Vec<(usize, usize)> = Vec::new();
    let mut shrinks: Vec<(usize, usize)> = Vec::new();
    let mut waiting = false;
    let mut candidates: Option<Vec<(usize, usize)>> = None;
    for j in state.queue.iter() {
        let need = state.jobs[j].min_gpus.min(devices);
        if need > free && params.shrink {
            let candidates = candidates.get_or_insert_with(|| shrinkable(params, state, now));
            free += shrink_for(candidates, state, need - free, &mut shrinks);
        }
        if need <= free {
            admitted.push((j, need));
            free -= need;
        } else {
            waiting = true;
        }
    }
    Admission {
        admitted,
        shrinks,
        free,
        waiting,
    }
}

proptest! {
    /// Random elastic and rigid jobs on 3 nodes of 4 devices: some run (at random counts
    /// between their least and most, where they fit), with work done and run time enough for
    /// the budget to allow some shrinks; the others wait.
    #[test]
    fn admits_as_the_walk_over_every_waiting_job(
        shapes in proptest::collection::vec((0u8..6, 1usize..10, 1usize..10, 0usize..10, any::<bool>()), 1..30),
        shrink in any::<bool>(),
        budget in 0.0f64..0.2,
    ) {
        let cluster = Cluster::uniform(3, 4).unwrap();
        let jobs: Vec<Job> = shapes
            .iter()
            .enumerate()
            .map(|(row, &(arrival, a, b, _, _))| Job {
                name: format!("j{row}"),
                arrival_s: f64::from(arrival),
                gpus: a.max(b),
                duration_s: 1000.0,
                min_gpus: a.min(b),
                max_gpus: a.max(b),
                profile: None,
                user: None,
            })
            .collect();
        let throughput = Throughput::new(&cluster, Curve::default(), &jobs, &BTreeMap::new()).unwrap();
        let mut state = State::new(&cluster, &jobs, throughput, MoveCost::default());
        for (j, &(_, _, _, extra, runs)) in shapes.iter().enumerate() {
            state.queue.push(j, 0.0);
            let k = (jobs[j].min_gpus + extra).min(jobs[j].max_gpus);
            if runs {
                if let Some(devices) = spread(&state, k, &[]) {
                    state.start(j, devices, 0.0);
                }
            }
        }
        let params = ElasticParams { overhead_budget: budget, shrink, ..ElasticParams::default() };
        prop_assert_eq!(admit(&params, &state, 3000.0), admit_plain(&params, &state, 3000.0));
    }
}
