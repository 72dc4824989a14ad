//! `static` (the documents' baseline): first come first served, exactly the requested devices;
//! a job that fits in a node is kept inside one node (the fullest node that still has room), a
//! larger one takes the emptiest nodes ([`place_rigid`]); the head of the queue waits until it
//! fits and nobody passes it; nothing is ever moved.

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
