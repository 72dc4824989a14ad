//! The indexed pass against the plain one it replaced (every job ranked and walked at every
//! event), on random pools: the same preemptions, starts and placements.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::cluster::Cluster;
use crate::sim::state::MoveCost;
use crate::throughput::{Curve, Throughput};
use crate::trace::Job;

/// The pass as it was: rank every job, walk them all.
fn schedule_plain(params: &LasParams, state: &mut State<'_>, now: f64) {
    let queue_of = |service: f64| params.thresholds.iter().filter(|&&t| service >= t).count();
    let entry = |j: usize, need: usize, running: Option<usize>| {
        let queue = queue_of(state.progress[j].attained);
        (queue, state.jobs[j].arrival_s.to_bits(), j, need, running)
    };
    let mut order: Vec<(usize, u64, usize, usize, Option<usize>)> = state
        .queue
        .iter()
        .map(|j| entry(j, state.jobs[j].gpus, None))
        .chain(
            state
                .running
                .iter()
                .enumerate()
                .map(|(i, r)| entry(r.job, r.devices.len(), Some(i))),
        )
        .collect();
    order.sort_unstable();
    let mut capacity = state.cluster.devices();
    let mut admitted = vec![false; order.len()];
    let mut running_admitted = vec![false; state.running.len()];
    for (&(_, _, _, need, running), admit) in order.iter().zip(admitted.iter_mut()) {
        if need <= capacity {
            capacity -= need;
            *admit = true;
            if let Some(i) = running {
                running_admitted[i] = true;
            }
        }
    }
    preempt_all_but(state, &running_admitted, now);
    let listed = || order.iter().zip(&admitted);
    let waiting: Vec<usize> = listed()
        .filter(|(o, &a)| a && o.4.is_none())
        .chain(listed().filter(|(_, &a)| !a))
        .map(|(o, _)| o.2)
        .collect();
    let mut free = state.free();
    for j in waiting {
        let k = state.jobs[j].gpus;
        if k > free {
            continue;
        }
        if let Some(devices) = place_rigid(state, k) {
            state.start(j, devices, now);
            free -= k;
        }
    }
}

/// `jobs` on `cluster`: each attained its service; those marked run (started in turn where
/// they fit), the others wait. The queue ranks by `thresholds`.
fn pool<'a>(
    cluster: &'a Cluster,
    jobs: &'a [Job],
    shapes: &[(u8, usize, u16, bool)],
    thresholds: &[f64],
) -> State<'a> {
    let throughput = Throughput::new(cluster, Curve::default(), jobs, &BTreeMap::new()).unwrap();
    let mut state = State::new(cluster, jobs, throughput, MoveCost::default());
    state.queue.rank_by(thresholds, |_| 0.0);
    for (j, &(_, gpus, service, runs)) in shapes.iter().enumerate() {
        state.progress[j].attained = f64::from(service);
        state.queue.push(j, state.progress[j].attained);
        if runs {
            if let Some(devices) = place_rigid(&state, gpus) {
                state.start(j, devices, 0.0);
            }
        }
    }
    state
}

proptest! {
    /// Random jobs (1 to 12 devices, arrivals that tie, services across the thresholds) on 3
    /// nodes of 4 devices.
    #[test]
    fn decides_as_the_walk_over_every_job(
        shapes in proptest::collection::vec((0u8..6, 1usize..13, 0u16..300, any::<bool>()), 1..30),
        thresholds in proptest::collection::vec(1u16..300, 0..3),
    ) {
        let cluster = Cluster::uniform(3, 4).unwrap();
        let jobs: Vec<Job> = shapes
            .iter()
            .enumerate()
            .map(|(row, &(arrival, gpus, _, _))| Job {
                name: format!("j{row}"),
                arrival_s: f64::from(arrival),
                gpus,
                duration_s: 100.0,
                min_gpus: gpus,
                max_gpus: gpus,
                profile: None,
                user: None,
            })
            .collect();
        let mut thresholds: Vec<f64> = thresholds.into_iter().map(f64::from).collect();
        thresholds.sort_by(f64::total_cmp);
        let params = LasParams { thresholds };
        let mut indexed = pool(&cluster, &jobs, &shapes, &params.thresholds);
        let mut plain = pool(&cluster, &jobs, &shapes, &params.thresholds);
        schedule(&params, &mut indexed, 10.0);
        schedule_plain(&params, &mut plain, 10.0);
        prop_assert_eq!(&indexed.running, &plain.running);
        prop_assert_eq!(&indexed.segments, &plain.segments);
        prop_assert_eq!(&indexed.progress, &plain.progress);
        prop_assert_eq!(&indexed.owner, &plain.owner);
        let waiting: Vec<usize> = indexed.queue.iter().collect();
        prop_assert_eq!(waiting, plain.queue.iter().collect::<Vec<_>>());
    }
}
