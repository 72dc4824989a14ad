//! The move plan that turns one placement into another: which replica travels from which GPU to
//! which slot, scheduled in rounds where each GPU sends at most one and receives at most one
//! expert, and the bytes each round puts on intra- and inter-node links.
//!
//! A replica needs a transfer when its logical expert was not on its GPU in the old placement.
//! The source is a GPU that held the expert in the old placement, taken from the destination's
//! node whenever a copy exists there, and otherwise the holder that sends least so far.

use serde::Serialize;

/// One expert transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Move {
    /// MoE layer.
    pub layer: usize,
    /// Logical expert whose weights travel.
    pub expert: usize,
    /// GPU that sends (it held the expert in the old placement).
    pub src_gpu: usize,
    /// Slot on the sending GPU that held the expert.
    pub src_slot: usize,
    /// GPU that receives.
    pub dst_gpu: usize,
    /// Slot on the receiving GPU (physical expert `dst_gpu * slots_per_gpu + dst_slot`).
    pub dst_slot: usize,
    /// Whether the transfer crosses nodes.
    pub inter_node: bool,
}

/// One round of transfers: every GPU sends at most one and receives at most one expert.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Round {
    /// Indices into [`MovePlan::moves`].
    pub moves: Vec<usize>,
    /// Transfers inside a node.
    pub intra_node: usize,
    /// Transfers between nodes.
    pub inter_node: usize,
    /// Bytes over intra-node links (`intra_node * expert_bytes`).
    pub intra_node_bytes: u64,
    /// Bytes over inter-node links (`inter_node * expert_bytes`).
    pub inter_node_bytes: u64,
}

/// Every transfer and its schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MovePlan {
    /// The transfers, by layer, destination GPU and destination slot.
    pub moves: Vec<Move>,
    /// The rounds; their number is the largest number of transfers any one GPU sends or
    /// receives, the least possible for the chosen sources.
    pub rounds: Vec<Round>,
    /// Bytes of one expert's weights (0 when not given).
    pub expert_bytes: u64,
}

impl MovePlan {
    /// Transfers inside a node.
    pub fn intra_node(&self) -> usize {
        self.moves.iter().filter(|m| !m.inter_node).count()
    }

    /// Transfers between nodes.
    pub fn inter_node(&self) -> usize {
        self.moves.iter().filter(|m| m.inter_node).count()
    }

    /// Bytes moved in all.
    pub fn total_bytes(&self) -> u64 {
        (self.moves.len() as u64).saturating_mul(self.expert_bytes)
    }
}

/// The transfers that turn `old` into `new` (both `[layers][replicas]`, same shape, `gpus` GPUs
/// on `nodes` nodes). Each replica whose expert its GPU did not hold is sent by a GPU that held
/// it, on the same node when one did, the one that has sent least so far (ties to the lower
/// GPU), from its first slot of the expert. Linear in the replicas plus, per transfer, the GPUs
/// that held its expert.
pub fn plan_moves(old: &[Vec<usize>], new: &[Vec<usize>], gpus: usize, nodes: usize) -> Vec<Move> {
    let gpn = (gpus / nodes.max(1)).max(1);
    let mut sent = vec![0usize; gpus];
    let mut moves = Vec::new();
    for (layer, (before, after)) in old.iter().zip(new).enumerate() {
        let slots = after.len() / gpus;
        let experts = before
            .iter()
            .chain(after)
            .copied()
            .max()
            .map_or(0, |e| e + 1);
        // The GPUs that held each expert, ascending, with the first slot of it on each.
        let mut holders: Vec<Vec<(usize, usize)>> = vec![Vec::new(); experts];
        for (s, &e) in before.iter().enumerate() {
            let g = s / slots;
            if holders[e].last().is_none_or(|&(h, _)| h != g) {
                holders[e].push((g, s - g * slots));
            }
        }
        // Whether `dst` held the expert: stamped with `dst + 1`.
        let mut held = vec![0usize; experts];
        for dst in 0..gpus {
            for &e in &before[dst * slots..(dst + 1) * slots] {
                held[e] = dst + 1;
            }
            for dst_slot in 0..slots {
                let expert = after[dst * slots + dst_slot];
                if held[expert] == dst + 1 {
                    continue;
                }
                let all = &holders[expert];
                let near = all.iter().filter(|&&(g, _)| g / gpn == dst / gpn);
                let pick = |pool: &mut dyn Iterator<Item = &(usize, usize)>| {
                    pool.min_by_key(|&&(g, _)| (sent[g], g)).copied()
                };
                let Some((src, src_slot)) =
                    pick(&mut near.clone()).or_else(|| pick(&mut all.iter()))
                else {
                    // The old placement had no replica of this expert; nothing can send it.
                    continue;
                };
                sent[src] += 1;
                moves.push(Move {
                    layer,
                    expert,
                    src_gpu: src,
                    src_slot,
                    dst_gpu: dst,
                    dst_slot,
                    inter_node: src / gpn != dst / gpn,
                });
            }
        }
    }
    moves
}

/// Round of every transfer such that no GPU sends twice or receives twice in a round, using as
/// many rounds as the busiest GPU has transfers (bipartite edge colouring by alternating paths).
pub fn schedule_rounds(moves: &[Move], gpus: usize) -> Vec<usize> {
    const NONE: usize = usize::MAX;
    let mut deg_send = vec![0usize; gpus];
    let mut deg_recv = vec![0usize; gpus];
    for m in moves {
        deg_send[m.src_gpu] += 1;
        deg_recv[m.dst_gpu] += 1;
    }
    let colours = deg_send.iter().chain(&deg_recv).copied().max().unwrap_or(0);
    let mut send = vec![NONE; gpus * colours];
    let mut recv = vec![NONE; gpus * colours];
    let mut send_used = UsedColours::new(gpus, colours);
    let mut recv_used = UsedColours::new(gpus, colours);
    let mut colour = vec![NONE; moves.len()];
    for (i, m) in moves.iter().enumerate() {
        let (u, v) = (m.src_gpu, m.dst_gpu);
        let a = send_used.first_free(u).expect("degree bound");
        let b = recv_used.first_free(v).expect("degree bound");
        let c = if recv[v * colours + a] == NONE {
            a
        } else if send[u * colours + b] == NONE {
            b
        } else {
            // Swap colours a and b along the path that leaves v by colour a; afterwards a is
            // free at v, and the path cannot reach u, which has no edge of colour a.
            let mut path = Vec::new();
            let mut at_recv = v;
            loop {
                let e = recv[at_recv * colours + a];
                if e == NONE {
                    break;
                }
                path.push(e);
                let s = moves[e].src_gpu;
                let f = send[s * colours + b];
                if f == NONE {
                    break;
                }
                path.push(f);
                at_recv = moves[f].dst_gpu;
            }
            for &e in &path {
                let (s, d) = (moves[e].src_gpu, moves[e].dst_gpu);
                send[s * colours + colour[e]] = NONE;
                recv[d * colours + colour[e]] = NONE;
                send_used.release(s, colour[e]);
                recv_used.release(d, colour[e]);
            }
            for &e in &path {
                let (s, d) = (moves[e].src_gpu, moves[e].dst_gpu);
                colour[e] = if colour[e] == a { b } else { a };
                send[s * colours + colour[e]] = e;
                recv[d * colours + colour[e]] = e;
                send_used.take(s, colour[e]);
                recv_used.take(d, colour[e]);
            }
            a
        };
        colour[i] = c;
        send[u * colours + c] = i;
        recv[v * colours + c] = i;
        send_used.take(u, c);
        recv_used.take(v, c);
    }
    colour
}

/// The colours in use at every GPU, one bit each, with a hint per GPU below which every word
/// is full: the lowest free colour is found a word at a time from the hint, not a colour at a
/// time from zero (a GPU with thousands of transfers made the schedule quadratic).
struct UsedColours {
    words: usize,
    colours: usize,
    bits: Vec<u64>,
    hint: Vec<usize>,
}

impl UsedColours {
    fn new(gpus: usize, colours: usize) -> Self {
        let words = colours.div_ceil(64);
        UsedColours {
            words,
            colours,
            bits: vec![0; gpus * words],
            hint: vec![0; gpus],
        }
    }

    /// The lowest colour not in use at `g`.
    fn first_free(&mut self, g: usize) -> Option<usize> {
        let row = &self.bits[g * self.words..(g + 1) * self.words];
        while self.hint[g] < self.words && row[self.hint[g]] == u64::MAX {
            self.hint[g] += 1;
        }
        let w = self.hint[g];
        let c = w * 64 + row.get(w)?.trailing_ones() as usize;
        (c < self.colours).then_some(c)
    }

    fn take(&mut self, g: usize, c: usize) {
        self.bits[g * self.words + c / 64] |= 1 << (c % 64);
    }

    fn release(&mut self, g: usize, c: usize) {
        self.bits[g * self.words + c / 64] &= !(1 << (c % 64));
        self.hint[g] = self.hint[g].min(c / 64);
    }
}

/// The full move plan from `old` to `new`, rounds included. `expert_bytes` (0 if unknown)
/// turns transfer counts into bytes.
pub fn move_plan(
    old: &[Vec<usize>],
    new: &[Vec<usize>],
    gpus: usize,
    nodes: usize,
    expert_bytes: u64,
) -> MovePlan {
    let moves = plan_moves(old, new, gpus, nodes);
    let colour = schedule_rounds(&moves, gpus);
    let count = colour.iter().map(|&c| c + 1).max().unwrap_or(0);
    let mut rounds = vec![
        Round {
            moves: Vec::new(),
            intra_node: 0,
            inter_node: 0,
            intra_node_bytes: 0,
            inter_node_bytes: 0,
        };
        count
    ];
    for (i, (&c, m)) in colour.iter().zip(&moves).enumerate() {
        let r = &mut rounds[c];
        r.moves.push(i);
        if m.inter_node {
            r.inter_node += 1;
            r.inter_node_bytes = r.inter_node_bytes.saturating_add(expert_bytes);
        } else {
            r.intra_node += 1;
            r.intra_node_bytes = r.intra_node_bytes.saturating_add(expert_bytes);
        }
    }
    MovePlan {
        moves,
        rounds,
        expert_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_prefer_the_destination_node() {
        // 4 GPUs on 2 nodes, 1 slot each; expert 0 on GPUs 0 and 2.
        let old = vec![vec![0, 1, 0, 2]];
        let new = vec![vec![0, 0, 0, 0]];
        let moves = plan_moves(&old, &new, 4, 2);
        assert_eq!(moves.len(), 2);
        assert_eq!(
            (moves[0].src_gpu, moves[0].dst_gpu, moves[0].inter_node),
            (0, 1, false)
        );
        assert_eq!(
            (moves[1].src_gpu, moves[1].dst_gpu, moves[1].inter_node),
            (2, 3, false)
        );
    }

    #[test]
    fn rounds_reach_the_degree_bound() {
        // A 3-regular bipartite multigraph on 3 GPUs needs exactly 3 rounds.
        let mut moves = Vec::new();
        for s in 0..3 {
            for k in 0..3 {
                let d = (s + k) % 3;
                moves.push(Move {
                    layer: k,
                    expert: 0,
                    src_gpu: s,
                    src_slot: 0,
                    dst_gpu: d,
                    dst_slot: 0,
                    inter_node: false,
                });
            }
        }
        let colour = schedule_rounds(&moves, 3);
        assert_eq!(colour.iter().max(), Some(&2));
        for c in 0..3 {
            for g in 0..3 {
                let sends = moves
                    .iter()
                    .zip(&colour)
                    .filter(|(m, &k)| k == c && m.src_gpu == g);
                let recvs = moves
                    .iter()
                    .zip(&colour)
                    .filter(|(m, &k)| k == c && m.dst_gpu == g);
                assert!(sends.count() <= 1);
                assert!(recvs.count() <= 1);
            }
        }
    }

    /// The move plan and rounds as first written (a scan of every GPU per transfer, the lowest
    /// free colour found a colour at a time): the oracle of the indexed versions.
    fn direct_plan_moves(
        old: &[Vec<usize>],
        new: &[Vec<usize>],
        gpus: usize,
        nodes: usize,
    ) -> Vec<Move> {
        let gpn = (gpus / nodes.max(1)).max(1);
        let mut sent = vec![0usize; gpus];
        let mut moves = Vec::new();
        for (layer, (before, after)) in old.iter().zip(new).enumerate() {
            let slots = after.len() / gpus;
            for dst in 0..gpus {
                let held = &before[dst * slots..(dst + 1) * slots];
                for dst_slot in 0..slots {
                    let expert = after[dst * slots + dst_slot];
                    if held.contains(&expert) {
                        continue;
                    }
                    let holders: Vec<usize> = (0..gpus)
                        .filter(|&g| before[g * slots..(g + 1) * slots].contains(&expert))
                        .collect();
                    let near: Vec<usize> = holders
                        .iter()
                        .copied()
                        .filter(|&g| g / gpn == dst / gpn)
                        .collect();
                    let pool = if near.is_empty() { &holders } else { &near };
                    let Some(&src) = pool.iter().min_by_key(|&&g| (sent[g], g)) else {
                        // The old placement had no replica of this expert; nothing can send it.
                        continue;
                    };
                    sent[src] += 1;
                    let src_slot = before[src * slots..(src + 1) * slots]
                        .iter()
                        .position(|&e| e == expert)
                        .expect("holder holds the expert");
                    moves.push(Move {
                        layer,
                        expert,
                        src_gpu: src,
                        src_slot,
                        dst_gpu: dst,
                        dst_slot,
                        inter_node: src / gpn != dst / gpn,
                    });
                }
            }
        }
        moves
    }

    fn direct_schedule_rounds(moves: &[Move], gpus: usize) -> Vec<usize> {
        const NONE: usize = usize::MAX;
        let mut deg_send = vec![0usize; gpus];
        let mut deg_recv = vec![0usize; gpus];
        for m in moves {
            deg_send[m.src_gpu] += 1;
            deg_recv[m.dst_gpu] += 1;
        }
        let colours = deg_send.iter().chain(&deg_recv).copied().max().unwrap_or(0);
        let mut send = vec![NONE; gpus * colours];
        let mut recv = vec![NONE; gpus * colours];
        let mut colour = vec![NONE; moves.len()];
        for (i, m) in moves.iter().enumerate() {
            let (u, v) = (m.src_gpu, m.dst_gpu);
            let a = (0..colours)
                .find(|&c| send[u * colours + c] == NONE)
                .expect("degree bound");
            let b = (0..colours)
                .find(|&c| recv[v * colours + c] == NONE)
                .expect("degree bound");
            let c = if recv[v * colours + a] == NONE {
                a
            } else if send[u * colours + b] == NONE {
                b
            } else {
                // Swap colours a and b along the path that leaves v by colour a; afterwards a is
                // free at v, and the path cannot reach u, which has no edge of colour a.
                let mut path = Vec::new();
                let mut at_recv = v;
                loop {
                    let e = recv[at_recv * colours + a];
                    if e == NONE {
                        break;
                    }
                    path.push(e);
                    let s = moves[e].src_gpu;
                    let f = send[s * colours + b];
                    if f == NONE {
                        break;
                    }
                    path.push(f);
                    at_recv = moves[f].dst_gpu;
                }
                for &e in &path {
                    send[moves[e].src_gpu * colours + colour[e]] = NONE;
                    recv[moves[e].dst_gpu * colours + colour[e]] = NONE;
                }
                for &e in &path {
                    colour[e] = if colour[e] == a { b } else { a };
                    send[moves[e].src_gpu * colours + colour[e]] = e;
                    recv[moves[e].dst_gpu * colours + colour[e]] = e;
                }
                a
            };
            colour[i] = c;
            send[u * colours + c] = i;
            recv[v * colours + c] = i;
        }
        colour
    }

    #[test]
    fn indexed_moves_and_rounds_equal_the_direct_ones() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        for case in 0..60 {
            let (gpus, nodes) = [(4, 2), (8, 2), (6, 3), (16, 4), (5, 1)][case % 5];
            let slots = 1 + case % 7;
            let experts = 2 + next(3 * gpus);
            let layers = 1 + case % 3;
            let layer = |next: &mut dyn FnMut(usize) -> usize| -> Vec<usize> {
                let mut v: Vec<usize> = (0..gpus * slots).map(|s| s % experts).collect();
                for e in v.iter_mut() {
                    if next(3) == 0 {
                        *e = next(experts);
                    }
                }
                v
            };
            let old: Vec<Vec<usize>> = (0..layers).map(|_| layer(&mut next)).collect();
            let new: Vec<Vec<usize>> = (0..layers).map(|_| layer(&mut next)).collect();
            let moves = plan_moves(&old, &new, gpus, nodes);
            let direct = direct_plan_moves(&old, &new, gpus, nodes);
            assert_eq!(moves, direct, "case {case}");
            assert_eq!(
                schedule_rounds(&moves, gpus),
                direct_schedule_rounds(&moves, gpus),
                "case {case}"
            );
        }
    }
}
