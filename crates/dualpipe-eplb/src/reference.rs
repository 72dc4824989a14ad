//! The reference's algorithm, one layer at a time, in `f32` like the reference.
//!
//! Per layer (the global policy is the same with one group and one node):
//! 1. sum the loads of each expert group and pack the groups onto nodes with
//!    [`balanced_packing`], which renumbers the experts node by node ("mlog" order);
//! 2. within each node, [`replicate`] hands the extra slots one at a time to the expert
//!    whose load per replica is highest;
//! 3. pack each node's replicas (each carrying its expert's load divided by its replica
//!    count) onto the node's GPUs with [`balanced_packing`].
//!
//! Every step works in preallocated buffers of a [`Workspace`]; no allocation per layer.

use std::collections::BinaryHeap;

use rayon::prelude::*;

use crate::introsort::sort_keys_like_libstdcxx;
use crate::layout::Layout;
use crate::matrix::{LoadMatrix, Matrix};
use crate::plan::{new_log2phy, ExpertPlan, Policy};
use crate::EplbError;

/// Above this many physical slots in total (layers x replicas), layers run in parallel.
const PARALLEL_MIN_SLOTS: usize = 40_000;

/// The sizes the algorithm runs with: the layout's, with one group and one node for the global
/// policy.
#[derive(Clone, Copy, Debug)]
struct RunSizes {
    experts: usize,
    replicas: usize,
    gpus: usize,
    groups: usize,
    nodes: usize,
}

/// Plans every layer of a validated `loads` and `layout` with the resolved `policy`
/// (hierarchical or global) and assembles the reference's three outputs.
pub(crate) fn plan(
    loads: &LoadMatrix,
    layout: &Layout,
    policy: Policy,
) -> Result<ExpertPlan, EplbError> {
    let (groups, nodes) = match policy {
        Policy::Hierarchical => (layout.groups, layout.nodes),
        _ => (1, 1),
    };
    let shape = &RunSizes {
        experts: layout.experts,
        replicas: layout.replicas,
        gpus: layout.gpus,
        groups,
        nodes,
    };
    let layers = loads.rows();
    let (e, p) = (shape.experts, shape.replicas);
    let mut phy2log = vec![0i64; layers * p];
    let mut phyrank = vec![0i64; layers * p];
    let mut logcnt = vec![0i64; layers * e];

    let parallel =
        layers > 1 && layers * p >= PARALLEL_MIN_SLOTS && rayon::current_num_threads() > 1;
    if parallel {
        phy2log
            .par_chunks_mut(p)
            .zip(phyrank.par_chunks_mut(p))
            .zip(logcnt.par_chunks_mut(e))
            .enumerate()
            .for_each_init(
                || Workspace::new(shape),
                |ws, (layer, ((out_log, out_rank), out_cnt))| {
                    ws.layer(loads.row(layer), out_log, out_rank, out_cnt);
                },
            );
    } else {
        let mut ws = Workspace::new(shape);
        for layer in 0..layers {
            ws.layer(
                loads.row(layer),
                &mut phy2log[layer * p..(layer + 1) * p],
                &mut phyrank[layer * p..(layer + 1) * p],
                &mut logcnt[layer * e..(layer + 1) * e],
            );
        }
    }

    let width = logcnt.iter().copied().max().unwrap_or(1).max(1) as usize;
    let mut log2phy = new_log2phy(layers, e, width)?;
    {
        let out = log2phy.as_mut_slice();
        for layer in 0..layers {
            let base = layer * e * width;
            for slot in 0..p {
                let log = phy2log[layer * p + slot] as usize;
                let rank = phyrank[layer * p + slot] as usize;
                out[base + log * width + rank] = slot as i64;
            }
        }
    }

    // The shapes were built above from non-zero sizes, so these cannot fail.
    let to_matrix = |cols: usize, data: Vec<i64>| {
        Matrix::from_flat(layers, cols, data).expect("plan buffers have the planned shape")
    };
    Ok(ExpertPlan {
        policy,
        num_groups: layout.groups,
        num_nodes: layout.nodes,
        num_gpus: layout.gpus,
        phy2log: to_matrix(p, phy2log),
        phyrank: to_matrix(p, phyrank),
        log2phy,
        logcnt: to_matrix(e, logcnt),
    })
}

/// Scratch buffers for planning one layer, reused across layers.
struct Workspace {
    groups: usize,
    nodes: usize,
    group_size: usize,
    experts_per_node: usize,
    replicas_per_node: usize,
    gpus_per_node: usize,
    /// f32 loads of the layer (the reference's `weight.float()`).
    w: Vec<f32>,
    group_load: Vec<f32>,
    sort_buf: SortBuffers,
    pack_load: Vec<f32>,
    pack_items: Vec<u32>,
    pack_tree: Vec<u64>,
    item_pack: Vec<u32>,
    item_rank: Vec<u32>,
    /// Logical expert -> position in node-major order, and back.
    log2mlog: Vec<u32>,
    mlog2log: Vec<u32>,
    /// Replica counts in node-major order.
    mlogcnt: Vec<u32>,
    node_load: Vec<f32>,
    phy2mlog: Vec<u32>,
    phy_rank: Vec<u32>,
    phy_load: Vec<f32>,
    slot2phy: Vec<u32>,
    replica_heap: BinaryHeap<u64>,
    /// Per-replica load keys of the experts for the AVX2 scan in [`replicate`].
    replica_keys: Vec<u32>,
}

impl Workspace {
    fn new(shape: &RunSizes) -> Self {
        let e = shape.experts;
        let experts_per_node = e / shape.nodes;
        let replicas_per_node = shape.replicas / shape.nodes;
        let gpus_per_node = shape.gpus / shape.nodes;
        let most_items = replicas_per_node.max(shape.groups);
        Self {
            groups: shape.groups,
            nodes: shape.nodes,
            group_size: e / shape.groups,
            experts_per_node,
            replicas_per_node,
            gpus_per_node,
            w: vec![0.0; e],
            group_load: vec![0.0; shape.groups],
            sort_buf: SortBuffers::with_capacity(most_items),
            pack_load: Vec::with_capacity(gpus_per_node.max(shape.nodes)),
            pack_items: Vec::with_capacity(gpus_per_node.max(shape.nodes)),
            pack_tree: Vec::with_capacity(2 * gpus_per_node.max(shape.nodes).next_power_of_two()),
            item_pack: vec![0; most_items],
            item_rank: vec![0; most_items],
            log2mlog: vec![0; e],
            mlog2log: vec![0; e],
            mlogcnt: vec![0; e],
            node_load: vec![0.0; experts_per_node],
            phy2mlog: vec![0; replicas_per_node],
            phy_rank: vec![0; replicas_per_node],
            phy_load: vec![0.0; replicas_per_node],
            slot2phy: vec![0; replicas_per_node],
            replica_heap: BinaryHeap::with_capacity(experts_per_node),
            replica_keys: Vec::with_capacity(experts_per_node.next_multiple_of(8)),
        }
    }

    /// Plans one layer into its output rows.
    fn layer(
        &mut self,
        loads: &[f64],
        out_log: &mut [i64],
        out_rank: &mut [i64],
        out_cnt: &mut [i64],
    ) {
        // `+ 0.0` turns -0.0 into 0.0, so bit patterns order like the values.
        for (dst, &src) in self.w.iter_mut().zip(loads) {
            *dst = src as f32 + 0.0;
        }

        // Step 1: groups to nodes.
        let gs = self.group_size;
        let groups_per_node = self.groups / self.nodes;
        if groups_per_node == 1 {
            // One group per node: the reference keeps the groups in order.
            for (i, v) in self.log2mlog.iter_mut().enumerate() {
                *v = i as u32;
            }
        } else {
            for (g, load) in self.group_load.iter_mut().enumerate() {
                *load = group_sum(&self.w[g * gs..(g + 1) * gs]);
            }
            balanced_packing(
                &self.group_load,
                self.nodes,
                &mut self.sort_buf,
                &mut self.pack_load,
                &mut self.pack_items,
                &mut self.pack_tree,
                &mut self.item_pack[..self.groups],
                &mut self.item_rank[..self.groups],
            );
            for g in 0..self.groups {
                let first = (self.item_pack[g] as usize * groups_per_node
                    + self.item_rank[g] as usize)
                    * gs;
                for k in 0..gs {
                    self.log2mlog[g * gs + k] = (first + k) as u32;
                }
            }
        }
        for (log, &mlog) in self.log2mlog.iter().enumerate() {
            self.mlog2log[mlog as usize] = log as u32;
        }

        // Steps 2 and 3, node by node.
        let epn = self.experts_per_node;
        let ppn = self.replicas_per_node;
        let per_gpu = ppn / self.gpus_per_node;
        for node in 0..self.nodes {
            let mlog_base = node * epn;
            for (k, load) in self.node_load.iter_mut().enumerate() {
                *load = self.w[self.mlog2log[mlog_base + k] as usize];
            }
            let cnt = &mut self.mlogcnt[mlog_base..mlog_base + epn];
            replicate(
                &self.node_load,
                cnt,
                &mut self.phy2mlog,
                &mut self.phy_rank,
                &mut self.replica_heap,
                &mut self.replica_keys,
            );
            for (load, &m) in self.phy_load.iter_mut().zip(&self.phy2mlog) {
                *load = self.node_load[m as usize] / cnt[m as usize] as f32;
            }
            balanced_packing(
                &self.phy_load,
                self.gpus_per_node,
                &mut self.sort_buf,
                &mut self.pack_load,
                &mut self.pack_items,
                &mut self.pack_tree,
                &mut self.item_pack[..ppn],
                &mut self.item_rank[..ppn],
            );
            for phy in 0..ppn {
                let slot = self.item_pack[phy] as usize * per_gpu + self.item_rank[phy] as usize;
                self.slot2phy[slot] = phy as u32;
            }
            let out_base = node * ppn;
            for (slot, &phy) in self.slot2phy.iter().enumerate() {
                let mlog = mlog_base + self.phy2mlog[phy as usize] as usize;
                out_log[out_base + slot] = i64::from(self.mlog2log[mlog]);
                out_rank[out_base + slot] = i64::from(self.phy_rank[phy as usize]);
            }
        }
        for (cnt, &mlog) in out_cnt.iter_mut().zip(&self.log2mlog) {
            *cnt = i64::from(self.mlogcnt[mlog as usize]);
        }
    }
}

/// The load of one expert group, summed in `f32` as the reference does (see `docs/eplb.md`
/// on rounding).
fn group_sum(loads: &[f32]) -> f32 {
    let total: f64 = loads.iter().map(|&v| f64::from(v)).sum();
    total as f32
}

/// Heap key of expert `i` with load per replica `w`: larger loads first, then lower indices.
/// (Non-negative `f32` values order like their bit patterns.)
#[inline]
fn replica_key(w: f32, i: u32) -> u64 {
    (u64::from(w.to_bits()) << 32) | u64::from(u32::MAX - i)
}

/// Hands `phy2mlog.len() - weights.len()` extra replicas, one at a time, to the expert with
/// the highest load per replica (the first such expert on ties), like the reference's
/// `replicate_experts`. Fills `cnt` with replica counts, `phy2mlog` with the expert of each
/// replica (experts first, then extras in order of assignment) and `rank` with its replica rank.
fn replicate(
    weights: &[f32],
    cnt: &mut [u32],
    phy2mlog: &mut [u32],
    rank: &mut [u32],
    heap: &mut BinaryHeap<u64>,
    scan_keys: &mut Vec<u32>,
) {
    let n = weights.len();
    for i in 0..n {
        phy2mlog[i] = i as u32;
        rank[i] = 0;
        cnt[i] = 1;
    }
    if phy2mlog.len() == n {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { replicate_scan_avx2(weights, cnt, phy2mlog, rank, scan_keys) };
        return;
    }
    let _ = scan_keys;
    replicate_heap(weights, cnt, phy2mlog, rank, heap);
}

/// The extra replicas of [`replicate`] (after the first replica of every expert) from a
/// binary heap of keys [`replica_key`].
fn replicate_heap(
    weights: &[f32],
    cnt: &mut [u32],
    phy2mlog: &mut [u32],
    rank: &mut [u32],
    heap: &mut BinaryHeap<u64>,
) {
    let n = weights.len();
    // Rebuild in place (O(n) heapify), keeping the allocation.
    let mut keys = std::mem::take(heap).into_vec();
    keys.clear();
    keys.extend(
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| replica_key(w, i as u32)),
    );
    *heap = BinaryHeap::from(keys);
    for slot in n..phy2mlog.len() {
        let mut top = heap.peek_mut().expect("heap holds every expert");
        let best = u32::MAX - (*top as u32);
        let b = best as usize;
        phy2mlog[slot] = best;
        rank[slot] = cnt[b];
        cnt[b] += 1;
        *top = replica_key(weights[b] / cnt[b] as f32, best);
        // Dropping `top` sifts the lowered key down.
    }
}

/// The extra replicas of [`replicate`] by scanning every expert with AVX2: each expert's key
/// is the complement of its per-replica load's bits (so the smallest key is the highest
/// load), the minimum comes from a vector reduction and the first expert holding it (the
/// lowest index on ties) from the lanes' compare masks.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn replicate_scan_avx2(
    weights: &[f32],
    cnt: &mut [u32],
    phy2mlog: &mut [u32],
    rank: &mut [u32],
    keys: &mut Vec<u32>,
) {
    use std::arch::x86_64::{
        __m256i, _mm256_castsi256_ps, _mm256_cmpeq_epi32, _mm256_loadu_si256, _mm256_min_epu32,
        _mm256_movemask_ps, _mm256_permute2x128_si256, _mm256_set1_epi32, _mm256_shuffle_epi32,
    };
    let n = weights.len();
    keys.clear();
    keys.extend(weights.iter().map(|w| !w.to_bits()));
    // Padding keys are all ones: a real key has its top bit set but is never all ones (a
    // non-negative finite or infinite f32 has bits at most 0x7F80_0000).
    keys.resize(n.next_multiple_of(8), u32::MAX);
    let vectors = keys.len() / 8;
    for slot in n..phy2mlog.len() {
        let ptr = keys.as_ptr().cast::<__m256i>();
        // SAFETY: `keys` holds `8 * vectors` u32, so every load reads inside it; unaligned
        // loads are allowed.
        let best = unsafe {
            // Four running minima, so the reduction is not one long dependency chain.
            let ones = _mm256_set1_epi32(-1);
            let (mut a, mut b, mut c, mut d) = (ones, ones, ones, ones);
            let mut v = 0;
            while v + 4 <= vectors {
                a = _mm256_min_epu32(a, _mm256_loadu_si256(ptr.add(v)));
                b = _mm256_min_epu32(b, _mm256_loadu_si256(ptr.add(v + 1)));
                c = _mm256_min_epu32(c, _mm256_loadu_si256(ptr.add(v + 2)));
                d = _mm256_min_epu32(d, _mm256_loadu_si256(ptr.add(v + 3)));
                v += 4;
            }
            while v < vectors {
                a = _mm256_min_epu32(a, _mm256_loadu_si256(ptr.add(v)));
                v += 1;
            }
            let mut min = _mm256_min_epu32(_mm256_min_epu32(a, b), _mm256_min_epu32(c, d));
            min = _mm256_min_epu32(min, _mm256_permute2x128_si256::<1>(min, min));
            min = _mm256_min_epu32(min, _mm256_shuffle_epi32::<0b0100_1110>(min));
            min = _mm256_min_epu32(min, _mm256_shuffle_epi32::<0b1011_0001>(min));
            let mut best = 0;
            for v in 0..vectors {
                let eq = _mm256_cmpeq_epi32(_mm256_loadu_si256(ptr.add(v)), min);
                let mask = _mm256_movemask_ps(_mm256_castsi256_ps(eq));
                if mask != 0 {
                    best = 8 * v + mask.trailing_zeros() as usize;
                    break;
                }
            }
            best
        };
        phy2mlog[slot] = best as u32;
        rank[slot] = cnt[best];
        cnt[best] += 1;
        keys[best] = !(weights[best] / cnt[best] as f32).to_bits();
    }
}

/// Scratch space for sorting items by descending weight.
struct SortBuffers {
    /// Sort keys `!weight_bits << 32 | item`: ascending keys are descending weights.
    keys: Vec<u64>,
}

impl SortBuffers {
    fn with_capacity(n: usize) -> Self {
        Self {
            keys: Vec::with_capacity(n),
        }
    }

    /// Fills `keys` with the items by descending weight, in the order the reference's
    /// `torch.sort(descending=True)` gives: libstdc++'s `std::sort` replayed. (Replicas of one
    /// expert carry equal loads, so ties are the rule here, not the exception.) Weights are
    /// non-negative and never -0.0, so their bit patterns order like the values.
    fn sort_descending(&mut self, weights: &[f32]) {
        self.keys.clear();
        self.keys.extend(
            weights
                .iter()
                .enumerate()
                .map(|(i, &w)| (u64::from(!w.to_bits()) << 32) | i as u64),
        );
        sort_keys_like_libstdcxx(&mut self.keys);
    }
}

/// Packs `weights.len()` items into `num_packs` packs of equal item count, like the
/// reference's `balanced_packing`: items in descending order of weight (the reference's
/// unstable sort, reproduced) each go to the lightest pack that still has room (the lowest
/// numbered on ties). With one item per pack, item `i` goes to pack `i`.
#[allow(clippy::too_many_arguments)]
fn balanced_packing(
    weights: &[f32],
    num_packs: usize,
    sort: &mut SortBuffers,
    pack_load: &mut Vec<f32>,
    pack_items: &mut Vec<u32>,
    tree: &mut Vec<u64>,
    item_pack: &mut [u32],
    item_rank: &mut [u32],
) {
    let n = weights.len();
    let per_pack = n / num_packs;
    if per_pack == 1 {
        for i in 0..n {
            item_pack[i] = i as u32;
            item_rank[i] = 0;
        }
        return;
    }
    sort.sort_descending(weights);
    pack_load.clear();
    pack_load.resize(num_packs, 0.0);
    pack_items.clear();
    pack_items.resize(num_packs, 0);
    let mut out = PreviousPlacement {
        load: pack_load,
        items: pack_items,
        full: per_pack as u32,
        item_pack,
        item_rank,
    };
    if num_packs <= SCAN_MAX_PACKS {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            unsafe { pack_scan_avx2(&sort.keys, &mut out) };
            return;
        }
        pack_scan(&sort.keys, &mut out);
    } else {
        pack_tree(&sort.keys, &mut out, tree);
    }
}

/// Up to this many packs, [`balanced_packing`] finds the lightest pack by scanning every
/// pack (the width of the scan's bit mask); from 65 on, with a tournament tree.
const SCAN_MAX_PACKS: usize = 64;

/// The packing state and its outputs.
struct PreviousPlacement<'a> {
    /// Load of each pack.
    load: &'a mut [f32],
    /// Items in each pack.
    items: &'a mut [u32],
    /// Items per pack when full.
    full: u32,
    item_pack: &'a mut [u32],
    item_rank: &'a mut [u32],
}

impl PreviousPlacement<'_> {
    /// Puts the item of sort key `key` (see [`SortBuffers`]) into `pack`; returns the pack's
    /// new load bits, or `u32::MAX` once the pack is full. (Non-negative `f32` loads order
    /// like their bits, and never reach `u32::MAX`.)
    #[inline(always)]
    fn assign(&mut self, key: u64, pack: usize) -> u32 {
        let item = key as u32 as usize;
        let weight = f32::from_bits(!((key >> 32) as u32));
        let rank = self.items[pack];
        self.item_pack[item] = pack as u32;
        self.item_rank[item] = rank;
        self.items[pack] = rank + 1;
        let load = self.load[pack] + weight;
        self.load[pack] = load;
        if rank + 1 == self.full {
            u32::MAX
        } else {
            load.to_bits()
        }
    }
}

/// Greedy packing with a scan over at most 64 packs, without a branch per pack: the
/// smallest load key, then the first pack holding it through a bit mask.
fn pack_scan(keys: &[u64], out: &mut PreviousPlacement<'_>) {
    let mut pack_keys = [u32::MAX; SCAN_MAX_PACKS];
    let packs = &mut pack_keys[..out.load.len()];
    packs.fill(0);
    for &key in keys {
        let min = packs.iter().copied().fold(u32::MAX, u32::min);
        let mut mask = 0u64;
        for (p, &k) in packs.iter().enumerate() {
            mask |= u64::from(k == min) << p;
        }
        let best = mask.trailing_zeros() as usize;
        packs[best] = out.assign(key, best);
    }
}

/// [`pack_scan`] with AVX2 for at most 64 packs: dispatches on the number of 8-pack vectors.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pack_scan_avx2(keys: &[u64], out: &mut PreviousPlacement<'_>) {
    // SAFETY (all four): the caller guarantees AVX2.
    match out.load.len().div_ceil(8) {
        1 => unsafe { pack_scan_avx2_n::<1>(keys, out) },
        2 => unsafe { pack_scan_avx2_n::<2>(keys, out) },
        3 | 4 => unsafe { pack_scan_avx2_n::<4>(keys, out) },
        _ => unsafe { pack_scan_avx2_n::<8>(keys, out) },
    }
}

/// [`pack_scan`] with the packs in `V` AVX2 registers of eight packs each (`8 * V` at least
/// the number of packs): per lane the load (`f32`), the item count and the key (the load's
/// bits, or all ones when the pack is full). The minimum key comes from a vector reduction,
/// the first pack holding it from the lanes' compare masks; the chosen lane then adds the
/// item's weight (the same `f32` addition as the reference's) and counts it.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pack_scan_avx2_n<const V: usize>(keys: &[u64], out: &mut PreviousPlacement<'_>) {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_and_ps, _mm256_andnot_si256, _mm256_castps_si256,
        _mm256_castsi256_ps, _mm256_cmpeq_epi32, _mm256_cmpgt_epi32, _mm256_min_epu32,
        _mm256_movemask_ps, _mm256_or_si256, _mm256_permute2x128_si256, _mm256_set1_epi32,
        _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_ps, _mm256_shuffle_epi32,
        _mm256_sub_epi32,
    };
    let packs = out.load.len();
    debug_assert!(packs <= 8 * V);
    let full = _mm256_set1_epi32(out.full as i32);
    let mut load = [_mm256_setzero_ps(); V];
    let mut count = [full; V];
    let mut key = [_mm256_set1_epi32(-1); V];
    let mut lane = [_mm256_set1_epi32(0); V];
    for v in 0..V {
        let first = 8 * v as i32;
        lane[v] = _mm256_setr_epi32(
            first,
            first + 1,
            first + 2,
            first + 3,
            first + 4,
            first + 5,
            first + 6,
            first + 7,
        );
        // Packs that exist start empty (count 0, key 0); lanes past the last pack stay
        // full, so their key is all ones and never the minimum while an item is left.
        let real = _mm256_cmpgt_epi32(_mm256_set1_epi32(packs as i32), lane[v]);
        count[v] = _mm256_andnot_si256(real, full);
        key[v] = _mm256_or_si256(
            _mm256_castps_si256(load[v]),
            _mm256_cmpeq_epi32(count[v], full),
        );
    }
    for &item in keys {
        let mut min = key[0];
        for k in key.iter().skip(1) {
            min = _mm256_min_epu32(min, *k);
        }
        // Every lane gets the minimum of all eight.
        min = _mm256_min_epu32(min, _mm256_permute2x128_si256::<1>(min, min));
        min = _mm256_min_epu32(min, _mm256_shuffle_epi32::<0b0100_1110>(min));
        min = _mm256_min_epu32(min, _mm256_shuffle_epi32::<0b1011_0001>(min));
        let mut mask = 0u64;
        for (v, k) in key.iter().enumerate() {
            let eq = _mm256_cmpeq_epi32(*k, min);
            mask |= u64::from(_mm256_movemask_ps(_mm256_castsi256_ps(eq)) as u8) << (8 * v);
        }
        let best = mask.trailing_zeros() as usize;
        let weight = _mm256_set1_ps(f32::from_bits(!((item >> 32) as u32)));
        let at = _mm256_set1_epi32(best as i32);
        for v in 0..V {
            let hit = _mm256_cmpeq_epi32(lane[v], at);
            load[v] = _mm256_add_ps(load[v], _mm256_and_ps(weight, _mm256_castsi256_ps(hit)));
            count[v] = _mm256_sub_epi32(count[v], hit);
            key[v] = _mm256_or_si256(
                _mm256_castps_si256(load[v]),
                _mm256_cmpeq_epi32(count[v], full),
            );
        }
        let i = item as u32 as usize;
        out.item_pack[i] = best as u32;
        out.item_rank[i] = out.items[best];
        out.items[best] += 1;
    }
}

/// Greedy packing with a tournament tree over the pack keys `load bits << 32 | pack` (each
/// inner node holds the smaller key of its two children, so the root is the first lightest
/// pack); a full pack's key is `u64::MAX`.
fn pack_tree(keys: &[u64], out: &mut PreviousPlacement<'_>, tree: &mut Vec<u64>) {
    let packs = out.load.len();
    let leaves = packs.next_power_of_two();
    tree.clear();
    tree.resize(2 * leaves, u64::MAX);
    for p in 0..packs {
        tree[leaves + p] = p as u64;
    }
    for node in (1..leaves).rev() {
        tree[node] = tree[2 * node].min(tree[2 * node + 1]);
    }
    for &key in keys {
        let best = (tree[1] & 0xFFFF_FFFF) as usize;
        let bits = out.assign(key, best);
        let mut node = leaves + best;
        tree[node] = if bits == u32::MAX {
            u64::MAX
        } else {
            (u64::from(bits) << 32) | best as u64
        };
        while node > 1 {
            node /= 2;
            tree[node] = tree[2 * node].min(tree[2 * node + 1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(weights: &[f32], packs: usize) -> (Vec<u32>, Vec<u32>) {
        let n = weights.len();
        let (mut p, mut r) = (vec![0; n], vec![0; n]);
        balanced_packing(
            weights,
            packs,
            &mut SortBuffers::with_capacity(n),
            &mut Vec::new(),
            &mut Vec::new(),
            &mut Vec::new(),
            &mut p,
            &mut r,
        );
        (p, r)
    }

    #[test]
    fn packing_is_greedy_lightest_first() {
        let (p, r) = pack(&[5.0, 1.0, 4.0, 2.0], 2);
        // 5 -> pack 0, 4 -> pack 1, 2 -> pack 1 (4 < 5), 1 -> pack 0.
        assert_eq!(p, vec![0, 0, 1, 1]);
        assert_eq!(r, vec![0, 1, 0, 1]);
    }

    /// The reference's rule, written plainly: items by the replayed sort, each to the first
    /// lightest pack with room.
    fn naive_packing(weights: &[f32], packs: usize) -> (Vec<u32>, Vec<u32>) {
        let per_pack = weights.len() / packs;
        let mut order: Vec<(f32, u32)> = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| (w, i as u32))
            .collect();
        crate::introsort::sort_unstable_like_libstdcxx(&mut order, |a, b| a.0 > b.0);
        let mut load = vec![0f32; packs];
        let mut items = vec![0u32; packs];
        let (mut p, mut r) = (vec![0; weights.len()], vec![0; weights.len()]);
        for &(w, i) in &order {
            let best = (0..packs)
                .filter(|&p| (items[p] as usize) < per_pack)
                .min_by(|&a, &b| load[a].partial_cmp(&load[b]).unwrap().then(a.cmp(&b)))
                .unwrap();
            p[i as usize] = best as u32;
            r[i as usize] = items[best];
            load[best] += w;
            items[best] += 1;
        }
        (p, r)
    }

    /// Runs one of the packing loops directly.
    fn pack_with(
        weights: &[f32],
        packs: usize,
        run: impl FnOnce(&[u64], &mut PreviousPlacement<'_>),
    ) -> (Vec<u32>, Vec<u32>) {
        let n = weights.len();
        let mut sort = SortBuffers::with_capacity(n);
        sort.sort_descending(weights);
        let (mut load, mut items) = (vec![0.0; packs], vec![0; packs]);
        let (mut p, mut r) = (vec![0; n], vec![0; n]);
        let mut out = PreviousPlacement {
            load: &mut load,
            items: &mut items,
            full: (n / packs) as u32,
            item_pack: &mut p,
            item_rank: &mut r,
        };
        run(&sort.keys, &mut out);
        (p, r)
    }

    #[test]
    fn every_packing_loop_follows_the_reference_rule() {
        // Few distinct weights (many ties, zeros included) and every pack count up to 70.
        for packs in 2..=70usize {
            for per_pack in [2usize, 3, 5] {
                let weights: Vec<f32> = (0..packs * per_pack)
                    .map(|i| ((i * 37 + packs) % 7) as f32 * 0.5)
                    .collect();
                let want = naive_packing(&weights, packs);
                assert_eq!(pack(&weights, packs), want, "{packs} packs");
                assert_eq!(
                    pack_with(&weights, packs, |k, o| pack_tree(k, o, &mut Vec::new())),
                    want
                );
                if packs <= SCAN_MAX_PACKS {
                    assert_eq!(pack_with(&weights, packs, pack_scan), want);
                    #[cfg(target_arch = "x86_64")]
                    if std::arch::is_x86_feature_detected!("avx2") {
                        // SAFETY: AVX2 is available (checked just above).
                        let avx =
                            pack_with(&weights, packs, |k, o| unsafe { pack_scan_avx2(k, o) });
                        assert_eq!(avx, want, "{packs} packs, AVX2");
                    }
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn packing_matches_the_plain_rule(
            raw in proptest::collection::vec(0u8..5, 1..40),
            packs in 1usize..80,
        ) {
            let per_pack = raw.len().div_ceil(8).max(2);
            let weights: Vec<f32> =
                (0..packs * per_pack).map(|i| f32::from(raw[i % raw.len()]) / 3.0).collect();
            proptest::prop_assert_eq!(pack(&weights, packs), naive_packing(&weights, packs));
        }
    }

    #[test]
    fn replicate_scan_and_heap_agree() {
        for n in [1usize, 3, 8, 13, 64, 100, 256] {
            for extra in [1usize, 7, 64, 300] {
                // Few distinct loads (ties everywhere) including zeros.
                let w: Vec<f32> = (0..n).map(|i| ((i * 29 + n) % 5) as f32 * 1.5).collect();
                let run = |scan: bool| {
                    let (mut cnt, mut p2m, mut rank) =
                        (vec![0; n], vec![0; n + extra], vec![0; n + extra]);
                    replicate(
                        &w,
                        &mut cnt,
                        &mut p2m,
                        &mut rank,
                        &mut BinaryHeap::new(),
                        &mut Vec::new(),
                    );
                    if !scan {
                        // Redo the extras with the heap only.
                        let (mut c2, mut p2, mut r2) = (vec![1; n], p2m.clone(), rank.clone());
                        replicate_heap(&w, &mut c2, &mut p2, &mut r2, &mut BinaryHeap::new());
                        return (c2, p2, r2);
                    }
                    (cnt, p2m, rank)
                };
                assert_eq!(run(true), run(false), "{n} experts, {extra} extras");
            }
        }
    }

    #[test]
    fn replicate_gives_extras_to_the_hottest_per_replica() {
        let w = [6.0f32, 1.0, 3.0];
        let (mut cnt, mut p2m, mut rank) = (vec![0; 3], vec![0; 6], vec![0; 6]);
        replicate(
            &w,
            &mut cnt,
            &mut p2m,
            &mut rank,
            &mut BinaryHeap::new(),
            &mut Vec::new(),
        );
        // 6 -> (3) -> 3 ties with expert 2: first index wins, then 3 -> 2 vs 3: expert 2.
        assert_eq!(p2m, vec![0, 1, 2, 0, 0, 2]);
        assert_eq!(rank, vec![0, 0, 0, 1, 2, 1]);
        assert_eq!(cnt, vec![3, 1, 2]);
    }
}
