//! Where a job's devices come from: the placement rules shared by the policies (no policy
//! imports another; each builds on these and on [`crate::sim::state`]).

use crate::sim::state::State;

/// `k` free devices by the static rule: inside the fullest node with room when `k` fits in a
/// node; otherwise from the emptiest nodes. `None` when they are not free.
pub fn place_rigid(state: &State<'_>, k: usize) -> Option<Vec<usize>> {
    let nodes = state.cluster.nodes.len();
    if k <= state.cluster.largest_node() {
        let n = (0..nodes)
            .filter(|&n| state.free_per_node[n] >= k)
            .min_by_key(|&n| (state.free_per_node[n], n))?;
        return Some(state.free_devices_of(n)[..k].to_vec());
    }
    spread(state, k, &[])
}

/// `k` free devices from the emptiest nodes first, after the nodes in `prefer` (where a job
/// already runs). `None` when fewer than `k` are free.
pub fn spread(state: &State<'_>, k: usize, prefer: &[usize]) -> Option<Vec<usize>> {
    if state.free() < k {
        return None;
    }
    let mut order: Vec<usize> = (0..state.cluster.nodes.len()).collect();
    order.sort_by_key(|&n| {
        (
            !prefer.contains(&n),
            std::cmp::Reverse(state.free_per_node[n]),
            n,
        )
    });
    let mut devices = Vec::with_capacity(k);
    for n in order {
        for d in state.free_devices_of(n) {
            if devices.len() == k {
                break;
            }
            devices.push(d);
        }
    }
    devices.sort_unstable();
    Some(devices)
}
