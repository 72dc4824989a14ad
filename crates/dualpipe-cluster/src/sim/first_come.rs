//! The first-come-first-served policies: exactly the requested devices, the head of the queue
//! waits until it fits and nobody passes it (no backfill), nothing is ever moved.
//!
//! * `static` (the documents' baseline): a job that fits in a node is kept inside one node (the
//!   fullest node that still has room), a larger one takes the emptiest nodes ([`place_rigid`]).
//! * `fifo` (the baseline of Tiresias and Helios): the head takes the lowest-numbered free
//!   devices, whatever nodes they lie in (no placement rule; a job split over nodes runs at
//!   the locality factor's rate).

use crate::sim::place::place_rigid;
use crate::sim::state::State;

/// `static`: starts queued jobs from the head while the head fits (module documentation).
pub fn schedule_static(state: &mut State<'_>, now: f64) {
    while let Some(j) = state.queue.first() {
        match place_rigid(state, state.jobs[j].gpus) {
            Some(devices) => state.start(j, devices, now),
            None => break,
        }
    }
}

/// `fifo`: starts queued jobs from the head while the head's count is free (module
/// documentation).
pub fn schedule_fifo(state: &mut State<'_>, now: f64) {
    while let Some(j) = state.queue.first() {
        let k = state.jobs[j].gpus;
        if state.free() < k {
            break;
        }
        let devices: Vec<usize> = (0..state.cluster.nodes.len())
            .flat_map(|n| state.free_devices_of(n))
            .take(k)
            .collect();
        state.start(j, devices, now);
    }
}
