//! A validator for any placement and move plan, whichever policy produced it.
//!
//! - [`check_placement`]: every logical expert has at least one replica, every GPU has the same
//!   number of slots, every slot names an existing expert;
//! - [`check_maps`]: `phy2log`, `log2phy` and `logcnt` agree;
//! - [`check_policy`]: the improved policy's rules (duplicate-free, groups kept on nodes);
//! - [`check_moves`]: the moves turn the old placement into the new one exactly;
//! - [`check_rounds`]: every move is in one round and no GPU sends or receives twice in a round.

use crate::moves::{Move, MovePlan};
use crate::{ExpertPlan, Layout};

/// What is wrong with a plan.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanViolation {
    /// A layer's row has the wrong length or the slots do not divide over the GPUs.
    #[error("layer {layer}: {len} physical experts do not fill {gpus} GPUs equally (expected {expected})")]
    Shape {
        /// Layer.
        layer: usize,
        /// Its length.
        len: usize,
        /// GPUs.
        gpus: usize,
        /// The expected length.
        expected: usize,
    },
    /// A slot names an expert that does not exist.
    #[error("layer {layer}, physical expert {slot}: logical expert {expert} is out of range (0..{experts})")]
    UnknownExpert {
        /// Layer.
        layer: usize,
        /// Physical expert (slot).
        slot: usize,
        /// The expert named.
        expert: usize,
        /// Logical experts.
        experts: usize,
    },
    /// A logical expert has no replica.
    #[error("layer {layer}: logical expert {expert} has no replica")]
    Missing {
        /// Layer.
        layer: usize,
        /// The expert.
        expert: usize,
    },
    /// `logcnt` disagrees with `phy2log`.
    #[error(
        "layer {layer}, expert {expert}: logcnt says {logcnt} replicas but phy2log has {actual}"
    )]
    Count {
        /// Layer.
        layer: usize,
        /// Expert.
        expert: usize,
        /// logcnt's value.
        logcnt: usize,
        /// Replicas in phy2log.
        actual: usize,
    },
    /// `log2phy` disagrees with `phy2log`.
    #[error("layer {layer}, expert {expert}: log2phy lists {listed:?} but phy2log places it at {actual:?}")]
    Log2Phy {
        /// Layer.
        layer: usize,
        /// Expert.
        expert: usize,
        /// What log2phy lists (without padding).
        listed: Vec<i64>,
        /// Where phy2log places it.
        actual: Vec<i64>,
    },
    /// A GPU holds more replicas of one expert than the improved policy allows.
    #[error(
        "layer {layer}, GPU {gpu}: {copies} replicas of expert {expert} (at most {cap} allowed)"
    )]
    Duplicate {
        /// Layer.
        layer: usize,
        /// GPU.
        gpu: usize,
        /// Expert.
        expert: usize,
        /// Replicas on that GPU.
        copies: usize,
        /// The cap.
        cap: usize,
    },
    /// An expert group spans nodes under the hierarchical policy.
    #[error("layer {layer}: expert group {group} is on nodes {first} and {second}")]
    SplitGroup {
        /// Layer.
        layer: usize,
        /// Group.
        group: usize,
        /// One node.
        first: usize,
        /// Another node.
        second: usize,
    },
    /// A move is malformed or does not match the placements.
    #[error("move {index}: {reason}")]
    BadMove {
        /// Index in the move list.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A slot changed to an expert its GPU did not hold, and no move brings it.
    #[error(
        "layer {layer}, GPU {gpu}, slot {slot}: expert {expert} arrives but no move brings it"
    )]
    Unmoved {
        /// Layer.
        layer: usize,
        /// GPU.
        gpu: usize,
        /// Slot on that GPU.
        slot: usize,
        /// Expert.
        expert: usize,
    },
    /// The rounds do not schedule every move once, or a GPU is busy twice in a round.
    #[error("round {round}: {reason}")]
    BadRound {
        /// Round.
        round: usize,
        /// What is wrong.
        reason: String,
    },
}

/// Validates any [`ExpertPlan`]: a placement with equal slots per GPU and every expert present, and
/// `phy2log`, `log2phy` and `logcnt` in agreement.
pub fn check_plan(plan: &ExpertPlan) -> Result<(), PlanViolation> {
    let Some(phy2log) = plan.phy2log_rows() else {
        return Err(PlanViolation::UnknownExpert {
            layer: 0,
            slot: 0,
            expert: usize::MAX,
            experts: plan.num_experts(),
        });
    };
    check_placement(&phy2log, plan.num_experts(), plan.num_gpus)?;
    let log2phy = plan.log2phy.to_nested();
    let logcnt: Vec<Vec<usize>> = plan
        .logcnt
        .iter_rows()
        .map(|r| {
            r.iter()
                .map(|&c| usize::try_from(c).unwrap_or(usize::MAX))
                .collect()
        })
        .collect();
    check_maps(&phy2log, &log2phy, &logcnt)
}

/// Checks that `phy2log` (`[layers][replicas]`) is a placement of `experts` logical experts on
/// `gpus` GPUs.
pub fn check_placement(
    phy2log: &[Vec<usize>],
    experts: usize,
    gpus: usize,
) -> Result<(), PlanViolation> {
    let expected = phy2log.first().map_or(0, Vec::len);
    for (layer, row) in phy2log.iter().enumerate() {
        if gpus == 0 || row.len() != expected || row.len() % gpus != 0 || row.is_empty() {
            return Err(PlanViolation::Shape {
                layer,
                len: row.len(),
                gpus,
                expected,
            });
        }
        let mut seen = vec![false; experts];
        for (slot, &expert) in row.iter().enumerate() {
            if expert >= experts {
                return Err(PlanViolation::UnknownExpert {
                    layer,
                    slot,
                    expert,
                    experts,
                });
            }
            seen[expert] = true;
        }
        if let Some(expert) = seen.iter().position(|&s| !s) {
            return Err(PlanViolation::Missing { layer, expert });
        }
    }
    Ok(())
}

/// Checks that `log2phy` (`[layers][experts][max replicas]`, padded with -1, replicas in any
/// order) and `logcnt` (`[layers][experts]`) describe the same placement as `phy2log`.
pub fn check_maps(
    phy2log: &[Vec<usize>],
    log2phy: &[Vec<Vec<i64>>],
    logcnt: &[Vec<usize>],
) -> Result<(), PlanViolation> {
    for (layer, row) in phy2log.iter().enumerate() {
        let experts = logcnt.get(layer).map_or(0, Vec::len);
        let mut actual: Vec<Vec<i64>> = vec![Vec::new(); experts];
        for (slot, &e) in row.iter().enumerate() {
            if e >= experts {
                return Err(PlanViolation::UnknownExpert {
                    layer,
                    slot,
                    expert: e,
                    experts,
                });
            }
            actual[e].push(slot as i64);
        }
        for (expert, places) in actual.iter().enumerate() {
            let logcnt = logcnt[layer][expert];
            if logcnt != places.len() {
                return Err(PlanViolation::Count {
                    layer,
                    expert,
                    logcnt,
                    actual: places.len(),
                });
            }
            let listed_row = log2phy.get(layer).and_then(|l| l.get(expert));
            let mut listed: Vec<i64> = listed_row.map_or(Vec::new(), |r| {
                r.iter().copied().filter(|&p| p != -1).collect()
            });
            listed.sort_unstable();
            if listed != *places {
                return Err(PlanViolation::Log2Phy {
                    layer,
                    expert,
                    listed,
                    actual: places.clone(),
                });
            }
        }
    }
    if log2phy.len() != phy2log.len() || logcnt.len() != phy2log.len() {
        return Err(PlanViolation::Log2Phy {
            layer: phy2log.len().min(log2phy.len()).min(logcnt.len()),
            expert: 0,
            listed: Vec::new(),
            actual: Vec::new(),
        });
    }
    Ok(())
}

/// Checks the improved policy's rules: no GPU holds more than `ceil(replicas / domain GPUs)`
/// replicas of one expert, and under the hierarchical policy every group stays on one node.
pub fn check_policy(phy2log: &[Vec<usize>], layout: &Layout) -> Result<(), PlanViolation> {
    let slots = layout.slots_per_gpu();
    let hierarchical = layout.hierarchical() && layout.nodes > 1;
    let domain_gpus = if layout.hierarchical() {
        layout.gpus_per_node()
    } else {
        layout.gpus
    };
    for (layer, row) in phy2log.iter().enumerate() {
        let mut count = vec![0usize; layout.experts];
        for &e in row {
            count[e] += 1;
        }
        for gpu in 0..layout.gpus {
            let mut here = vec![0usize; layout.experts];
            for &e in &row[gpu * slots..(gpu + 1) * slots] {
                here[e] += 1;
            }
            for (expert, &copies) in here.iter().enumerate() {
                let cap = count[expert].div_ceil(domain_gpus).max(1);
                if copies > cap {
                    return Err(PlanViolation::Duplicate {
                        layer,
                        gpu,
                        expert,
                        copies,
                        cap,
                    });
                }
            }
        }
        if hierarchical {
            let size = layout.experts / layout.groups;
            let mut node_of = vec![usize::MAX; layout.groups];
            for (s, &e) in row.iter().enumerate() {
                let node = s / slots / layout.gpus_per_node();
                let group = e / size;
                if node_of[group] == usize::MAX {
                    node_of[group] = node;
                } else if node_of[group] != node {
                    let first = node_of[group];
                    return Err(PlanViolation::SplitGroup {
                        layer,
                        group,
                        first,
                        second: node,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Checks that `moves` turn `old` into `new` exactly: every move takes its expert from a GPU that
/// held it in `old` to a slot that holds it in `new` on a GPU that did not hold it; no slot
/// receives twice; and every slot whose expert was not on its GPU before receives a move (the
/// other slots hold experts their GPU already had).
pub fn check_moves(
    old: &[Vec<usize>],
    new: &[Vec<usize>],
    moves: &[Move],
    gpus: usize,
) -> Result<(), PlanViolation> {
    let bad = |index: usize, reason: String| Err(PlanViolation::BadMove { index, reason });
    if old.len() != new.len() {
        return bad(
            0,
            format!("old has {} layers, new has {}", old.len(), new.len()),
        );
    }
    let mut received = std::collections::HashSet::new();
    for (index, m) in moves.iter().enumerate() {
        let (Some(before), Some(after)) = (old.get(m.layer), new.get(m.layer)) else {
            return bad(index, format!("layer {} does not exist", m.layer));
        };
        let slots = after.len() / gpus;
        if m.src_gpu >= gpus || m.dst_gpu >= gpus || m.src_slot >= slots || m.dst_slot >= slots {
            return bad(index, "GPU or slot out of range".into());
        }
        if m.src_gpu == m.dst_gpu {
            return bad(index, "source and destination are the same GPU".into());
        }
        if before[m.src_gpu * slots + m.src_slot] != m.expert {
            return bad(
                index,
                format!(
                    "GPU {} slot {} did not hold expert {}",
                    m.src_gpu, m.src_slot, m.expert
                ),
            );
        }
        if after[m.dst_gpu * slots + m.dst_slot] != m.expert {
            return bad(
                index,
                format!(
                    "GPU {} slot {} does not hold expert {} afterwards",
                    m.dst_gpu, m.dst_slot, m.expert
                ),
            );
        }
        if before[m.dst_gpu * slots..(m.dst_gpu + 1) * slots].contains(&m.expert) {
            return bad(
                index,
                format!("GPU {} already held expert {}", m.dst_gpu, m.expert),
            );
        }
        if !received.insert((m.layer, m.dst_gpu, m.dst_slot)) {
            return bad(index, "a second move into the same slot".into());
        }
    }
    for (layer, (before, after)) in old.iter().zip(new).enumerate() {
        if before.len() != after.len() {
            return bad(0, format!("layer {layer} changes its number of slots"));
        }
        let slots = after.len() / gpus;
        for gpu in 0..gpus {
            let held = &before[gpu * slots..(gpu + 1) * slots];
            for slot in 0..slots {
                let expert = after[gpu * slots + slot];
                if !held.contains(&expert) && !received.contains(&(layer, gpu, slot)) {
                    return Err(PlanViolation::Unmoved {
                        layer,
                        gpu,
                        slot,
                        expert,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Checks that every move of `plan` is in exactly one round and that no GPU sends twice or
/// receives twice within a round.
pub fn check_rounds(plan: &MovePlan) -> Result<(), PlanViolation> {
    let mut seen = vec![false; plan.moves.len()];
    for (round, r) in plan.rounds.iter().enumerate() {
        let mut senders = std::collections::HashSet::new();
        let mut receivers = std::collections::HashSet::new();
        for &i in &r.moves {
            let Some(m) = plan.moves.get(i) else {
                return Err(PlanViolation::BadRound {
                    round,
                    reason: format!("no move {i}"),
                });
            };
            if std::mem::replace(&mut seen[i], true) {
                return Err(PlanViolation::BadRound {
                    round,
                    reason: format!("move {i} again"),
                });
            }
            if !senders.insert(m.src_gpu) {
                return Err(PlanViolation::BadRound {
                    round,
                    reason: format!("GPU {} sends twice", m.src_gpu),
                });
            }
            if !receivers.insert(m.dst_gpu) {
                return Err(PlanViolation::BadRound {
                    round,
                    reason: format!("GPU {} receives twice", m.dst_gpu),
                });
            }
        }
    }
    if let Some(i) = seen.iter().position(|&s| !s) {
        return Err(PlanViolation::BadRound {
            round: plan.rounds.len(),
            reason: format!("move {i} is in no round"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_errors_are_found() {
        assert!(check_placement(&[vec![0, 1, 1, 0]], 2, 2).is_ok());
        assert_eq!(
            check_placement(&[vec![0, 0, 0, 0]], 2, 2),
            Err(PlanViolation::Missing {
                layer: 0,
                expert: 1
            })
        );
        assert!(matches!(
            check_placement(&[vec![0, 1, 2]], 3, 2),
            Err(PlanViolation::Shape { .. })
        ));
        assert!(matches!(
            check_placement(&[vec![0, 5]], 2, 2),
            Err(PlanViolation::UnknownExpert { .. })
        ));
    }

    #[test]
    fn map_mismatches_are_found() {
        let phy2log = vec![vec![0, 1, 0]];
        let good = vec![vec![vec![2, 0], vec![1, -1]]];
        assert!(check_maps(&phy2log, &good, &[vec![2, 1]]).is_ok());
        assert!(matches!(
            check_maps(&phy2log, &good, &[vec![1, 1]]),
            Err(PlanViolation::Count { .. })
        ));
        let wrong = vec![vec![vec![0, 1], vec![2, -1]]];
        assert!(matches!(
            check_maps(&phy2log, &wrong, &[vec![2, 1]]),
            Err(PlanViolation::Log2Phy { .. })
        ));
    }

    #[test]
    fn moves_must_explain_every_arrival() {
        let old = vec![vec![0, 1, 2, 3]];
        let new = vec![vec![0, 2, 2, 3]];
        let m = Move {
            layer: 0,
            expert: 2,
            src_gpu: 1,
            src_slot: 0,
            dst_gpu: 0,
            dst_slot: 1,
            inter_node: false,
        };
        assert!(check_moves(&old, &new, &[m], 2).is_ok());
        assert!(matches!(
            check_moves(&old, &new, &[], 2),
            Err(PlanViolation::Unmoved { .. })
        ));
        let wrong = Move { src_gpu: 0, ..m };
        assert!(matches!(
            check_moves(&old, &new, &[wrong], 2),
            Err(PlanViolation::BadMove { .. })
        ));
    }
}
