//! Phase 2, per op (rank by rank, op by op): every chunk in range and on the rank the placement
//! gives its stage, nothing run twice, every communication op naming the right peer; records
//! where each chunk's ops sit for phase 3.

use super::shape::Geometry;
use super::{fail, Res, Rule, ValidationError, NONE};
use crate::{Chunk, Op};

/// Where each chunk's ops sit (index in the program of the rank the placement gives it).
pub(super) struct Positions {
    pub(super) f: Vec<u32>,
    pub(super) b: Vec<u32>,
    pub(super) split: Vec<bool>,
    pub(super) w: Vec<u32>,
    pub(super) send_f: Vec<u32>,
    pub(super) recv_f: Vec<u32>,
    pub(super) send_b: Vec<u32>,
    pub(super) recv_b: Vec<u32>,
}

/// Records a position, failing on a duplicate.
#[inline]
fn record(table: &mut [u32], id: usize, rank: usize, index: usize, op: &Op, what: &str) -> Res<()> {
    if table[id] != NONE {
        return Err(duplicate(table[id], rank, index, op, what));
    }
    table[id] = index as u32;
    Ok(())
}

#[cold]
fn duplicate(earlier: u32, rank: usize, index: usize, op: &Op, what: &str) -> Box<ValidationError> {
    {
        fail(
            rank,
            Some((index, op)),
            Rule::Duplicate,
            &format!("{what} already ran at op {earlier}; each must run exactly once"),
        )
    }
}

pub(super) fn check_ops(geo: &Geometry<'_>) -> Res<Positions> {
    let n = geo.dirs * geo.stages * geo.per_dir;
    let mut pos = Positions {
        f: vec![NONE; n],
        b: vec![NONE; n],
        split: vec![false; n],
        w: vec![NONE; n],
        send_f: vec![NONE; n],
        recv_f: vec![NONE; n],
        send_b: vec![NONE; n],
        recv_b: vec![NONE; n],
    };
    for (rank, program) in geo.schedule.programs.iter().enumerate() {
        for (index, op) in program.iter().enumerate() {
            match *op {
                Op::F(c) => {
                    let id = geo.own(c, rank, index, op)?;
                    record(&mut pos.f, id, rank, index, op, FORWARD)?;
                }
                Op::B(c) | Op::I(c) => {
                    let id = geo.own(c, rank, index, op)?;
                    record(&mut pos.b, id, rank, index, op, BACKWARD)?;
                    pos.split[id] = matches!(op, Op::I(_));
                }
                Op::W(c) => {
                    let id = geo.own(c, rank, index, op)?;
                    record(&mut pos.w, id, rank, index, op, WEIGHT)?;
                }
                Op::FB { f, b } => {
                    let fid = geo.own(f, rank, index, op)?;
                    let bid = geo.own(b, rank, index, op)?;
                    record(&mut pos.f, fid, rank, index, op, FORWARD)?;
                    record(&mut pos.b, bid, rank, index, op, BACKWARD)?;
                }
                Op::Wait => {}
                Op::SendF { chunk, peer }
                | Op::RecvF { chunk, peer }
                | Op::SendB { chunk, peer }
                | Op::RecvB { chunk, peer } => {
                    let id = geo.own(chunk, rank, index, op)?;
                    let want = op.peer_side().and_then(|side| geo.peers.get(chunk, side));
                    let table = match op {
                        Op::SendF { .. } => &mut pos.send_f,
                        Op::RecvF { .. } => &mut pos.recv_f,
                        Op::SendB { .. } => &mut pos.send_b,
                        _ => &mut pos.recv_b,
                    };
                    if want != Some(peer) {
                        return Err(peer_error(geo, rank, index, op, want));
                    }
                    record(table, id, rank, index, op, "the same message")?;
                }
            }
        }
    }
    Ok(pos)
}

const FORWARD: &str = "the forward of this chunk";
const BACKWARD: &str = "the backward of this chunk";
const WEIGHT: &str = "the weight gradient of this chunk";

/// The error of a comm op whose peer is not `want` (the rank of the neighbouring stage when a
/// message is needed at all).
#[cold]
#[inline(never)]
fn peer_error(
    geo: &Geometry<'_>,
    rank: usize,
    index: usize,
    op: &Op,
    want: Option<usize>,
) -> Box<ValidationError> {
    let at = Some((index, op));
    let (chunk, peer) = (
        op.chunk().unwrap_or(Chunk::new(0, 0, 0)),
        op.peer().unwrap_or(0),
    );
    let what = match op {
        Op::SendF { .. } => "activations to the next stage",
        Op::RecvF { .. } => "activations from the previous stage",
        Op::SendB { .. } => "the input gradient to the previous stage",
        _ => "the output gradient from the next stage",
    };
    let ranks = geo.schedule.ranks;
    if peer >= ranks {
        return fail(
            rank,
            at,
            Rule::Peer,
            &format!("peer {peer} does not exist (the schedule has {ranks} ranks)"),
        );
    }
    match want {
        None => fail(
            rank,
            at,
            Rule::Peer,
            &format!(
                "no message carries {what} of stage {} of direction {}: that stage does not \
                 exist or runs on this same rank (a local exchange); remove the op",
                chunk.stage, chunk.dir
            ),
        ),
        Some(q) => fail(
            rank,
            at,
            Rule::Peer,
            &format!(
                "{what} go to or come from rank {q}, which runs the neighbouring stage, not \
                 rank {peer}"
            ),
        ),
    }
}
