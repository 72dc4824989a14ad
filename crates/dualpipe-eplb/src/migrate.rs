//! Keeping a new placement close to the previous one: relabelling nodes and GPUs with an
//! assignment solver (Kuhn-Munkres) so that as many replicas as possible stay where they are, and
//! slot preservation inside a GPU.
//!
//! Placements here are one layer's `phy2log` rows: slot `s` of GPU `g` is physical expert
//! `g * slots_per_gpu + s`.

use pathfinding::kuhn_munkres::kuhn_munkres;
use pathfinding::matrix::Matrix;

/// The most work the matchings of one call may take, counted as `n^3` for an `n x n`
/// matching (the Hungarian method's bound): 2^27, well under a second. Larger problems are not
/// matched: [`relabel`] keeps the GPUs as they are, and the improved policy keeps its fresh
/// packing of groups onto nodes, so the migration-aware path stays bounded on any shape (the
/// plan is as balanced, and may move more replicas).
pub const MATCHING_MAX_WORK: u128 = 1 << 27;

/// The work of one `n x n` matching, `n^3`.
pub fn matching_work(n: usize) -> u128 {
    (n as u128).pow(3)
}

/// Maximum-weight perfect matching of a square profit matrix: `result[row] = column`.
pub fn assign_max(profit: &[Vec<i64>]) -> Vec<usize> {
    if profit.is_empty() {
        return Vec::new();
    }
    let matrix = Matrix::from_rows(profit.iter().cloned()).expect("square profit matrix");
    kuhn_munkres(&matrix).1
}

/// Experts of one GPU, sorted.
fn gpu_experts(layer: &[usize], gpu: usize, slots: usize) -> Vec<usize> {
    let mut v = layer[gpu * slots..(gpu + 1) * slots].to_vec();
    v.sort_unstable();
    v
}

/// Replicas of `new` (one GPU's experts) whose expert is among `old` (sorted): the replicas
/// that do not move if `new` takes `old`'s place.
fn common(new: &[usize], old: &[usize]) -> i64 {
    new.iter().filter(|e| old.binary_search(e).is_ok()).count() as i64
}

/// Renames the GPUs of `new` (one layer) so that it keeps as many of `old`'s replicas in place as
/// possible, moving whole nodes together: first the best GPU matching inside every pair of (new
/// node, old node), then the best matching of nodes. Loads are unchanged since GPUs of a
/// placement are interchangeable (and nodes with them). Slots are then arranged with
/// [`preserve_slots`].
///
/// When the matchings would take more than [`MATCHING_MAX_WORK`], the GPUs keep their names
/// (only the slots are arranged).
pub fn relabel(new: &[usize], old: &[usize], num_gpus: usize, num_nodes: usize) -> Vec<usize> {
    let slots = new.len() / num_gpus;
    let gpn = num_gpus / num_nodes;
    let nodes = num_nodes as u128;
    if nodes * nodes * matching_work(gpn) + matching_work(num_nodes) > MATCHING_MAX_WORK {
        return preserve_slots(new, old, num_gpus);
    }
    let new_sets: Vec<Vec<usize>> = (0..num_gpus).map(|g| gpu_experts(new, g, slots)).collect();
    let old_sets: Vec<Vec<usize>> = (0..num_gpus).map(|g| gpu_experts(old, g, slots)).collect();
    // gpu_of[new gpu] = old (physical) gpu it becomes.
    let mut node_profit = vec![vec![0i64; num_nodes]; num_nodes];
    let mut inner: Vec<Vec<Vec<usize>>> = vec![vec![Vec::new(); num_nodes]; num_nodes];
    for a in 0..num_nodes {
        for b in 0..num_nodes {
            let profit: Vec<Vec<i64>> = (0..gpn)
                .map(|i| {
                    (0..gpn)
                        .map(|j| common(&new_sets[a * gpn + i], &old_sets[b * gpn + j]))
                        .collect()
                })
                .collect();
            let m = assign_max(&profit);
            node_profit[a][b] = m.iter().enumerate().map(|(i, &j)| profit[i][j]).sum();
            inner[a][b] = m;
        }
    }
    let node_of = assign_max(&node_profit);
    let mut out = vec![0; new.len()];
    for a in 0..num_nodes {
        let b = node_of[a];
        for (i, &j) in inner[a][b].iter().enumerate() {
            let from = a * gpn + i;
            let to = b * gpn + j;
            out[to * slots..(to + 1) * slots]
                .copy_from_slice(&new[from * slots..(from + 1) * slots]);
        }
    }
    preserve_slots(&out, old, num_gpus)
}

/// Rearranges the slots of every GPU of `new` so that an expert that was already on that GPU in
/// `old` keeps its slot; the other experts fill the remaining slots in ascending order. The
/// multiset of experts per GPU is unchanged.
pub fn preserve_slots(new: &[usize], old: &[usize], num_gpus: usize) -> Vec<usize> {
    let slots = new.len() / num_gpus;
    let mut out = vec![usize::MAX; new.len()];
    for g in 0..num_gpus {
        let range = g * slots..(g + 1) * slots;
        let mut pending = gpu_experts(new, g, slots);
        for s in range.clone() {
            if let Some(pos) = pending.iter().position(|&e| e == old[s]) {
                out[s] = pending.remove(pos);
            }
        }
        let mut rest = pending.into_iter();
        for s in range {
            if out[s] == usize::MAX {
                out[s] = rest.next().expect("as many experts as slots");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignment_maximises_profit() {
        let p = vec![vec![1, 9, 0], vec![8, 1, 0], vec![0, 0, 5]];
        assert_eq!(assign_max(&p), vec![1, 0, 2]);
    }

    #[test]
    fn relabel_undoes_a_permutation_of_gpus_and_nodes() {
        // 4 GPUs on 2 nodes, 2 slots each.
        let old = vec![0, 1, 2, 3, 4, 5, 6, 7];
        // Nodes swapped, GPUs inside the first new node swapped, slots swapped.
        let new = vec![7, 6, 4, 5, 2, 3, 1, 0];
        assert_eq!(relabel(&new, &old, 4, 2), old);
    }

    #[test]
    fn relabel_keeps_nodes_whole() {
        let old = vec![0, 1, 2, 3, 4, 5, 6, 7];
        // GPU {0,1} is best matched to old GPU 0 (node 0) and {4,5} to old GPU 2 (node 1), but
        // they sit on the same new node and must stay together.
        let new = vec![0, 1, 4, 5, 2, 3, 6, 7];
        let out = relabel(&new, &old, 4, 2);
        let node = |e: usize| out.iter().position(|&x| x == e).unwrap() / 4;
        assert_eq!(node(0), node(4));
        assert_eq!(node(2), node(6));
    }

    #[test]
    fn a_matching_too_large_keeps_the_gpus() {
        // 1,024 GPUs in one node: 2^30 steps of matching, over the bound.
        let gpus = 1024;
        assert!(matching_work(gpus) > MATCHING_MAX_WORK);
        let old: Vec<usize> = (0..2 * gpus).map(|s| s % gpus).collect();
        let new: Vec<usize> = (0..2 * gpus).map(|s| (s + 2) % gpus).collect();
        assert_eq!(
            relabel(&new, &old, gpus, 1),
            preserve_slots(&new, &old, gpus)
        );
        // Under the bound the same kind of shift is undone.
        let (old, new) = (
            &old[..64],
            &new[..64].iter().map(|&e| e % 32).collect::<Vec<_>>(),
        );
        let old: Vec<usize> = old.iter().map(|&e| e % 32).collect();
        let out = relabel(new, &old, 32, 1);
        assert_eq!(crate::improved::moved_replicas(&old, &out, 32), 0);
    }

    #[test]
    fn preserved_slots_keep_the_multiset() {
        let old = vec![1, 2, 3, 4];
        let new = vec![5, 1, 4, 3];
        let out = preserve_slots(&new, &old, 2);
        assert_eq!(out, vec![1, 5, 3, 4]);
    }
}
