//! Phase 3, per chunk: one forward and one full backward, `W` after its `I`, dependencies in
//! order on one rank, and in a lowered schedule a matched, well-placed message pair for every
//! dependency between two ranks.

use super::ops::Positions;
use super::shape::Geometry;
use super::{fail, Res, Rule, NONE};
use crate::ir::Neighbour;
use crate::Chunk;

/// Checks one dependency between ranks of a lowered schedule: the producer `prod` on rank
/// `p` sends after producing, the consumer `cons` on rank `r` receives before consuming.
#[allow(clippy::too_many_arguments)]
fn check_message(
    geo: &Geometry<'_>,
    (send, recv): (u32, u32),
    (produced, consumed): (u32, u32),
    (p, r): (usize, usize),
    (send_name, recv_name): (&str, &str),
    prod: Chunk,
) -> Res<()> {
    match (send == NONE, recv == NONE) {
        (true, true) => Err(fail(
            r,
            Some(geo.op(r, consumed)),
            Rule::MissingMessage,
            &format!(
                "its input from {prod} on rank {p} never arrives: add {recv_name} before it and \
                 {send_name} on rank {p} after the op that produces it"
            ),
        )),
        (true, false) => Err(fail(
            r,
            Some(geo.op(r, recv)),
            Rule::Unmatched,
            &format!("rank {p} has no matching {send_name} of {prod}; add one"),
        )),
        (false, true) => Err(fail(
            p,
            Some(geo.op(p, send)),
            Rule::Unmatched,
            &format!(
                "rank {r} has no matching {recv_name}; add one before the op that consumes it"
            ),
        )),
        (false, false) => {
            if send <= produced {
                return Err(fail(
                    p,
                    Some(geo.op(p, send)),
                    Rule::CommOrder,
                    &format!(
                        "it sends before op {produced} produces the data; move it after that op"
                    ),
                ));
            }
            if recv >= consumed {
                return Err(fail(
                    r,
                    Some(geo.op(r, recv)),
                    Rule::CommOrder,
                    &format!(
                        "it receives after op {consumed} already consumed the data; move it before \
                         that op"
                    ),
                ));
            }
            Ok(())
        }
    }
}

pub(super) fn check_chunks(geo: &Geometry<'_>, pos: &Positions, lowered: bool) -> Res<()> {
    let n = geo.dirs * geo.stages * geo.per_dir;
    for id in 0..n {
        let c = geo.chunk(id);
        let r = geo.rank(c.dir, c.stage);
        let (f, b, w) = (pos.f[id], pos.b[id], pos.w[id]);
        if f == NONE {
            return Err(fail(
                r,
                None,
                Rule::Missing,
                &format!("the forward (F) of chunk {c} never runs; add it to rank {r}'s program"),
            ));
        }
        if b == NONE {
            return Err(fail(
                r,
                None,
                Rule::Missing,
                &format!(
                    "the backward of chunk {c} never runs; add B, I and W, or an FB to rank {r}'s \
                     program"
                ),
            ));
        }
        if pos.split[id] {
            if w == NONE {
                return Err(fail(
                    r,
                    Some(geo.op(r, b)),
                    Rule::WeightGradient,
                    "this I defers a weight gradient that no later W computes; add W of the \
                     chunk after it",
                ));
            }
            if w < b {
                return Err(fail(
                    r,
                    Some(geo.op(r, w)),
                    Rule::WeightGradient,
                    &format!("it runs before the chunk's I at op {b}; move it after"),
                ));
            }
        } else if w != NONE {
            return Err(fail(
                r,
                Some(geo.op(r, w)),
                Rule::WeightGradient,
                &format!(
                    "the chunk's backward at op {b} is full (it computes the weight gradient \
                     itself), so there is no deferred weight gradient; remove the W or make the \
                     backward an I"
                ),
            ));
        }
        if b <= f {
            return Err(fail(
                r,
                Some(geo.op(r, b)),
                Rule::Dependency,
                &format!(
                    "the backward of chunk {c} runs before (or in the same op as) its own \
                     forward at op {f}"
                ),
            ));
        }
        // The inputs a chunk takes from its neighbouring stages: the forward's activations
        // from the previous stage, the backward's gradient from the next.
        let inputs = [
            (
                Neighbour::Prev,
                f,
                &pos.f,
                (&pos.send_f, &pos.recv_f),
                ("SEND_F", "RECV_F"),
                "forward",
            ),
            (
                Neighbour::Next,
                b,
                &pos.b,
                (&pos.send_b, &pos.recv_b),
                ("SEND_B", "RECV_B"),
                "backward",
            ),
        ];
        for (side, consumed, produced, (sends, recvs), names, what) in inputs {
            let Some(n) = geo.schedule.placement.neighbour(c, side) else {
                continue;
            };
            let nid = geo.id(n);
            let p = geo.rank(n.dir, n.stage);
            if p == r {
                if produced[nid] >= consumed {
                    return Err(fail(
                        r,
                        Some(geo.op(r, consumed)),
                        Rule::Dependency,
                        &format!(
                            "the {what} of {c} needs the {what} of {n} first, which runs \
                             later at op {} on this rank",
                            produced[nid]
                        ),
                    ));
                }
            } else if lowered {
                check_message(
                    geo,
                    (sends[nid], recvs[id]),
                    (produced[nid], consumed),
                    (p, r),
                    names,
                    n,
                )?;
            }
        }
    }
    Ok(())
}
