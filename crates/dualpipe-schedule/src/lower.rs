//! Lowering: inserts SEND/RECV ops into compute-only programs.
//!
//! For every compute op, the receives of its inputs that come from another rank go right before
//! it and the sends of its outputs to another rank right after it:
//!
//! * a forward of stage `s` receives activations (`RECV_F`) from stage `s - 1` and sends its own
//!   (`SEND_F`) to stage `s + 1`;
//! * a backward that produces the input gradient (`B`, `I`, the backward half of `FB`) receives
//!   the output gradient (`RECV_B`) from stage `s + 1` and sends the input gradient (`SEND_B`) to
//!   stage `s - 1`; `W` exchanges nothing.
//!
//! Neighbouring stages on the same rank (DualPipeV's last rank holds stages `ranks - 1` and
//! `ranks`; interleaved schedules on one rank) exchange locally, without messages. Comm ops name
//! the local chunk and the peer (see [`crate::Op`]). An `FB` receives `RECV_F` then `RECV_B`
//! before it and sends `SEND_F` then `SEND_B` after it.
//!
//! Why this cannot deadlock: with sends that never block and receives posted right before their
//! consumer, a lowered rank waits exactly where the compute-only rank would wait for its input,
//! and a message is available exactly when its producer has run. So the lowered programs run to
//! completion whenever the compute-only programs do, which [`crate::validate()`] checks.
//!
//! No `WAIT` ops are emitted: a compute op waits for its own inputs.

use crate::ir::Neighbour::{Next, Prev};
use crate::ir::{Neighbour, Peers};
use crate::{Chunk, Op, Schedule};

/// Returns `schedule` with the communication ops added.
///
/// Communication and `WAIT` ops already in the input are dropped first, so lowering a lowered
/// schedule (or an imported golden file) gives the same result as lowering its compute ops.
pub fn lower(schedule: &Schedule) -> Schedule {
    // Which rank each (dir, stage) talks to on either side; chunks outside the placement
    // (only in invalid input) get no messages, and the validator reports them.
    let peers = Peers::new(&schedule.placement);
    let peer = |side: Neighbour, c: Chunk| peers.get(c, side);
    let programs = schedule
        .programs
        .iter()
        .map(|program| {
            let mut out = Vec::with_capacity(program.len() * 3);
            for op in program {
                let (fwd, bwd) = match *op {
                    Op::F(c) => (Some(c), None),
                    Op::B(c) | Op::I(c) => (None, Some(c)),
                    Op::FB { f, b } => (Some(f), Some(b)),
                    Op::W(_) => (None, None),
                    _ => continue,
                };
                if let Some(c) = fwd {
                    if let Some(peer) = peer(Prev, c) {
                        out.push(Op::RecvF { chunk: c, peer });
                    }
                }
                if let Some(c) = bwd {
                    if let Some(peer) = peer(Next, c) {
                        out.push(Op::RecvB { chunk: c, peer });
                    }
                }
                out.push(*op);
                if let Some(c) = fwd {
                    if let Some(peer) = peer(Next, c) {
                        out.push(Op::SendF { chunk: c, peer });
                    }
                }
                if let Some(c) = bwd {
                    if let Some(peer) = peer(Prev, c) {
                        out.push(Op::SendB { chunk: c, peer });
                    }
                }
            }
            out
        })
        .collect();
    Schedule {
        programs,
        ..schedule.clone_without_programs()
    }
}
