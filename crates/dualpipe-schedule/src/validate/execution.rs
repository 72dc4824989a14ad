//! The execution check: an event-driven run of the programs, O(total ops).

use std::collections::VecDeque;

use super::shape::Geometry;
use super::{fail, parts, Part, Res, Rule, ValidationError, NONE};
use crate::{Chunk, Op};

/// An event a rank can wait for: the activations (`bwd == false`) or the input gradient
/// (`bwd == true`) of a producer chunk becoming available on the consumer's rank.
#[derive(Clone, Copy)]
struct Event {
    bwd: bool,
    id: usize,
}

/// The event a forward of `c` waits for: the activations of the previous stage.
#[inline]
fn fwd_input(geo: &Geometry<'_>, c: Chunk) -> Event {
    Event {
        bwd: false,
        id: geo.id(c) - geo.per_dir,
    }
}

/// The event a backward of `c` waits for: the gradient of the next stage.
#[inline]
fn bwd_input(geo: &Geometry<'_>, c: Chunk) -> Event {
    Event {
        bwd: true,
        id: geo.id(c) + geo.per_dir,
    }
}

/// Runs the programs event by event; returns each rank's final op index and what a stuck rank
/// waits for.
fn run(geo: &Geometry<'_>, lowered: bool) -> (Vec<usize>, Vec<Option<Event>>) {
    let schedule = geo.schedule;
    let ranks = schedule.ranks;
    let n = geo.dirs * geo.stages * geo.per_dir;
    let mut ready = [vec![false; n], vec![false; n]];
    let mut waiter = [vec![NONE; n], vec![NONE; n]];
    let mut pc = vec![0usize; ranks];
    let mut blocked: Vec<Option<Event>> = vec![None; ranks];
    let mut posted: Vec<VecDeque<Event>> = vec![VecDeque::new(); ranks];
    let mut work: Vec<usize> = (0..ranks).rev().collect();

    while let Some(rank) = work.pop() {
        let program = &schedule.programs[rank];
        blocked[rank] = None;
        'ops: while pc[rank] < program.len() {
            let op = &program[pc[rank]];
            // What this op waits for.
            let mut need: [Option<Event>; 2] = [None, None];
            match *op {
                Op::RecvF { .. } | Op::RecvB { .. } | Op::SendF { .. } | Op::SendB { .. } => {}
                Op::Wait => {
                    while let Some(&e) = posted[rank].front() {
                        if ready[usize::from(e.bwd)][e.id] {
                            posted[rank].pop_front();
                        } else {
                            need[0] = Some(e);
                            break;
                        }
                    }
                }
                Op::F(c) => need[0] = geo.remote_prev(c).map(|_| fwd_input(geo, c)),
                Op::B(c) | Op::I(c) => need[0] = geo.remote_next(c).map(|_| bwd_input(geo, c)),
                Op::FB { f, b } => {
                    need[0] = geo.remote_prev(f).map(|_| fwd_input(geo, f));
                    need[1] = geo.remote_next(b).map(|_| bwd_input(geo, b));
                }
                Op::W(_) => {}
            }
            for e in need.into_iter().flatten() {
                if !ready[usize::from(e.bwd)][e.id] {
                    waiter[usize::from(e.bwd)][e.id] = rank as u32;
                    blocked[rank] = Some(e);
                    break 'ops;
                }
            }
            // Run the op; announce what it makes available to other ranks.
            let mut fire = |e: Event, work: &mut Vec<usize>| {
                let k = usize::from(e.bwd);
                ready[k][e.id] = true;
                let w = std::mem::replace(&mut waiter[k][e.id], NONE);
                if w != NONE {
                    work.push(w as usize);
                }
            };
            match *op {
                Op::SendF { chunk, .. } => fire(
                    Event {
                        bwd: false,
                        id: geo.id(chunk),
                    },
                    &mut work,
                ),
                Op::SendB { chunk, .. } => fire(
                    Event {
                        bwd: true,
                        id: geo.id(chunk),
                    },
                    &mut work,
                ),
                Op::RecvF { chunk, .. } | Op::RecvB { chunk, .. } => {
                    // The message of the neighbouring stage (check_ops proved it exists).
                    let bwd = matches!(op, Op::RecvB { .. });
                    let e = if bwd {
                        bwd_input(geo, chunk)
                    } else {
                        fwd_input(geo, chunk)
                    };
                    // Only a later WAIT looks at posted receives; drop the ones already
                    // arrived so the queue stays short in programs without WAIT.
                    let queue = &mut posted[rank];
                    while queue
                        .front()
                        .is_some_and(|f| ready[usize::from(f.bwd)][f.id])
                    {
                        queue.pop_front();
                    }
                    if !ready[usize::from(bwd)][e.id] {
                        queue.push_back(e);
                    }
                }
                Op::Wait => {}
                _ if !lowered => {
                    let (ps, count) = parts(op);
                    for &(part, c) in &ps[..count] {
                        match part {
                            Part::Fwd if geo.remote_next(c).is_some() => fire(
                                Event {
                                    bwd: false,
                                    id: geo.id(c),
                                },
                                &mut work,
                            ),
                            Part::Bwd { .. } if geo.remote_prev(c).is_some() => fire(
                                Event {
                                    bwd: true,
                                    id: geo.id(c),
                                },
                                &mut work,
                            ),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
            pc[rank] += 1;
        }
    }

    (pc, blocked)
}

/// Checks that the programs run to completion; names a cycle of waiting ranks when not.
pub(super) fn check_execution(geo: &Geometry<'_>, lowered: bool) -> Res<()> {
    let (pc, blocked) = run(geo, lowered);
    let programs = &geo.schedule.programs;
    let Some(first) = (0..geo.schedule.ranks).find(|&r| pc[r] < programs[r].len()) else {
        return Ok(());
    };
    Err(deadlock_error(geo, &pc, &blocked, first))
}

/// Describes the cycle of waiting ranks reached from the stuck rank `first`.
fn deadlock_error(
    geo: &Geometry<'_>,
    pc: &[usize],
    blocked: &[Option<Event>],
    first: usize,
) -> Box<ValidationError> {
    let ranks = geo.schedule.ranks;
    let stuck = (0..ranks)
        .filter(|&r| pc[r] < geo.schedule.programs[r].len())
        .count();
    let producer = |e: Event| {
        let c = geo.chunk(e.id);
        geo.rank(c.dir, c.stage)
    };
    // Walk the wait-for graph until a rank repeats.
    let mut seen = vec![usize::MAX; ranks];
    let mut chain = Vec::new();
    let is_stuck = |r: usize| pc[r] < geo.schedule.programs[r].len();
    let mut r = first;
    let cycle_start = loop {
        if seen[r] != usize::MAX {
            break Some(seen[r]);
        }
        seen[r] = chain.len();
        chain.push(r);
        match blocked[r] {
            Some(e) if is_stuck(producer(e)) => r = producer(e),
            _ => break None,
        }
    };
    let cycle: Vec<usize> = match cycle_start {
        Some(s) => chain[s..].to_vec(),
        None => chain,
    };
    let describe = |r: usize| {
        let op = &geo.schedule.programs[r][pc[r]];
        match blocked[r] {
            Some(e) => {
                let what = if e.bwd {
                    "the gradient"
                } else {
                    "the activations"
                };
                format!(
                    "rank {r} at op {} `{op}` waits for {what} of {} from rank {}",
                    pc[r],
                    geo.chunk(e.id),
                    producer(e)
                )
            }
            None => format!("rank {r} at op {} `{op}` cannot run", pc[r]),
        }
    };
    let head = *cycle.iter().min().unwrap_or(&first);
    let start = cycle.iter().position(|&x| x == head).unwrap_or(0);
    let ordered: Vec<String> = cycle[start..]
        .iter()
        .chain(&cycle[..start])
        .map(|&r| describe(r))
        .collect();
    fail(
        head,
        Some((pc[head], &geo.schedule.programs[head][pc[head]])),
        Rule::Deadlock,
        &format!(
            "{stuck} of {ranks} ranks cannot finish; they wait in a cycle: {}; reorder the ops \
             so that every rank produces what another waits for before it waits itself",
            ordered.join("; ")
        ),
    )
}
