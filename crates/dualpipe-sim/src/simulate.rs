//! Event simulation of a lowered schedule on a cost model.
//!
//! Every rank has a compute stream that runs its program's compute ops in order, and a
//! communication stream that carries its outgoing messages in order. The rules:
//!
//! - A `SEND` is posted when the rank's program reaches it (after every earlier op of the
//!   program); the message occupies the sender's communication stream for
//!   [`CommCost::message_time`](crate::CommCost::message_time) and arrives at its end. Sends
//!   never hold up the compute stream, unless communication is blocking, in which case the
//!   compute stream waits for each of its own sends.
//!   With a [`Network`](crate::Network) in the cost model the sender is busy for
//!   `bytes / bandwidth` of the link the message crosses and the message arrives a latency
//!   after that; per-rank speeds divide the compute durations.
//! - A `RECV` posts a receive; a message that arrives before it is posted is buffered.
//! - A compute op starts when the previous compute op of its rank has ended and its inputs
//!   are ready: the messages of its receives have arrived, and its producers on the same
//!   rank (a forward for its backward, an `I` for its `W`, the neighbour stage when both
//!   stages live on this rank) have ended.
//! - `WAIT` blocks the program until every receive posted since the previous `WAIT` has
//!   arrived (sends complete in the background unless communication is blocking).
//!
//! Each op is visited once: ranks advance with their own cursor until they need a message
//! that has not been sent yet, then park on it until its sender posts it. The work is
//! O(total ops) and the result does not depend on the order ranks are visited in.

use std::collections::VecDeque;

use dualpipe_schedule::{Chunk, Op, Schedule};

use crate::cost::CostModel;
use crate::error::SimError;
use dualpipe_schedule::timeline::{ComputeInterval, MessageInterval, MessageKind, Timeline};

/// Simulates a lowered schedule on `cost` and returns its timeline.
///
/// The schedule should be validated; the simulator still reports (rather than panics on)
/// anything it cannot run: an op on a rank the placement does not give its stage, a consumer
/// whose remote input has no `RECV` before it, a `SEND` before its producer, a deadlock.
///
/// Times that add up past the largest `f64` (each cost finite, their sum not) give
/// [`SimError::Overflow`] naming the first op that ends at infinity, rather than a timeline
/// whose makespan is `inf` and whose bubble ratio is meaningless.
pub fn simulate(schedule: &Schedule, cost: &CostModel) -> Result<Timeline, SimError> {
    cost.check()?;
    if let Some(network) = &cost.network {
        network.check(schedule.ranks)?;
    }
    let timeline = Simulator::new(schedule, cost)?.run()?;
    check_finite(&timeline)?;
    Ok(timeline)
}

/// Fails when a time of `timeline` (or the capacity `ranks x makespan` the bubble ratio
/// divides by) is not a finite number.
pub fn check_finite(timeline: &Timeline) -> Result<(), SimError> {
    let advice = "the durations and latencies add up past the largest number (about 1.8e308); \
                  give them in a larger unit (ms instead of s) so they are smaller numbers";
    for (rank, intervals) in timeline.compute.iter().enumerate() {
        if let Some(iv) = intervals
            .iter()
            .find(|iv| !(iv.start.is_finite() && iv.end.is_finite()))
        {
            return Err(SimError::Overflow(format!(
                "simulated times overflow: rank {rank}'s {} ends at {}; {advice}",
                iv.op, iv.end
            )));
        }
    }
    if let Some(m) = timeline
        .messages
        .iter()
        .find(|m| !(m.start.is_finite() && m.end.is_finite()))
    {
        return Err(SimError::Overflow(format!(
            "simulated times overflow: the message from rank {} to rank {} arrives at {}; {advice}",
            m.src, m.dst, m.end
        )));
    }
    let capacity = timeline.ranks() as f64 * timeline.makespan();
    if !capacity.is_finite() {
        return Err(SimError::Overflow(format!(
            "simulated times overflow: {} ranks x makespan {} is past the largest number; {advice}",
            timeline.ranks(),
            timeline.makespan()
        )));
    }
    Ok(())
}

/// Dense index of every chunk of a schedule.
struct ChunkIndex {
    dirs: usize,
    stages: usize,
    mbs: usize,
}

impl ChunkIndex {
    fn len(&self) -> usize {
        self.dirs * self.stages * self.mbs
    }

    fn of(&self, c: Chunk) -> usize {
        (c.dir * self.stages + c.stage) * self.mbs + c.mb
    }
}

/// Which message slot: activations for a forward, or gradients for a backward.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Slot {
    Fwd(usize),
    Bwd(usize),
}

/// What a compute op needs before it may start.
enum Need {
    /// A local op that must already have ended (its end time, NaN if it has not run).
    Local(f64, &'static str, Chunk),
    /// A message to be received on this rank.
    Message(Slot, MessageKind, Chunk),
}

struct RankState {
    pc: usize,
    /// When the program may run its next op (end of the last compute op or wait).
    time: f64,
    /// When the communication stream is free again.
    comm_free: f64,
    /// Receives posted since the last `WAIT`.
    pending: Vec<(Slot, Chunk)>,
}

struct Simulator<'a> {
    schedule: &'a Schedule,
    cost: &'a CostModel,
    index: ChunkIndex,
    message_time: f64,
    fwd_done: Vec<f64>,
    bwd_done: Vec<f64>,
    input_only: Vec<bool>,
    w_done: Vec<bool>,
    fwd_arrival: Vec<f64>,
    bwd_arrival: Vec<f64>,
    fwd_posted: Vec<bool>,
    bwd_posted: Vec<bool>,
    ranks: Vec<RankState>,
    /// The rank parked on each message slot (forward slots, then backward ones), if any;
    /// a message has one receiver, so one waiter at most.
    waiters: Vec<Option<usize>>,
    queue: VecDeque<usize>,
    needs: Vec<Need>,
    timeline: Timeline,
}

impl<'a> Simulator<'a> {
    fn new(schedule: &'a Schedule, cost: &'a CostModel) -> Result<Self, SimError> {
        let placement = &schedule.placement;
        if schedule.programs.len() != schedule.ranks || placement.ranks != schedule.ranks {
            return Err(SimError::Schedule(format!(
                "the schedule has {} ranks but {} programs and a placement over {} ranks; they must agree",
                schedule.ranks,
                schedule.programs.len(),
                placement.ranks
            )));
        }
        if let Some((dir, row)) = placement.rank_of.iter().enumerate().find(|(_, row)| {
            row.len() != placement.stages() || row.iter().any(|&r| r >= schedule.ranks)
        }) {
            return Err(SimError::Schedule(format!(
                "placement row of direction {dir} ({row:?}) must name one rank below {} for each of the {} stages",
                schedule.ranks,
                placement.stages()
            )));
        }
        let mbs = schedule
            .programs
            .iter()
            .flatten()
            .flat_map(|op| match *op {
                Op::FB { f, b } => [Some(f), Some(b)],
                _ => [op.chunk(), None],
            })
            .flatten()
            .map(|c| c.mb + 1)
            .max()
            .unwrap_or(0);
        let index = ChunkIndex {
            dirs: placement.dirs(),
            stages: placement.stages(),
            mbs,
        };
        let n = index.len();
        Ok(Simulator {
            schedule,
            cost,
            index,
            message_time: cost.comm.message_time(),
            fwd_done: vec![f64::NAN; n],
            bwd_done: vec![f64::NAN; n],
            input_only: vec![false; n],
            w_done: vec![false; n],
            fwd_arrival: vec![f64::NAN; n],
            bwd_arrival: vec![f64::NAN; n],
            fwd_posted: vec![false; n],
            bwd_posted: vec![false; n],
            ranks: (0..schedule.ranks)
                .map(|_| RankState {
                    pc: 0,
                    time: 0.0,
                    comm_free: 0.0,
                    pending: Vec::new(),
                })
                .collect(),
            waiters: vec![None; 2 * n],
            queue: (0..schedule.ranks).collect(),
            needs: Vec::with_capacity(4),
            timeline: Self::empty_timeline(schedule),
        })
    }

    /// A timeline with room for every compute op and message of the schedule.
    fn empty_timeline(schedule: &Schedule) -> Timeline {
        let mut timeline = Timeline::new(schedule.ranks);
        let mut sends = 0;
        for (intervals, program) in timeline.compute.iter_mut().zip(&schedule.programs) {
            intervals.reserve_exact(program.iter().filter(|op| op.is_compute()).count());
            sends += program
                .iter()
                .filter(|op| matches!(op, Op::SendF { .. } | Op::SendB { .. }))
                .count();
        }
        timeline.messages.reserve_exact(sends);
        timeline
    }

    fn run(mut self) -> Result<Timeline, SimError> {
        while let Some(rank) = self.queue.pop_front() {
            self.advance(rank)?;
        }
        if let Some(rank) =
            (0..self.ranks.len()).find(|&r| self.ranks[r].pc < self.schedule.programs[r].len())
        {
            let pc = self.ranks[rank].pc;
            let op = self.schedule.programs[rank][pc];
            return Err(SimError::Schedule(format!(
                "deadlock: rank {rank} waits forever at op #{pc} ({op}) for a message no rank sends before it blocks too; check the order of SENDs and RECVs (validate the schedule)"
            )));
        }
        Ok(self.timeline)
    }

    fn err(&self, rank: usize, msg: String) -> SimError {
        let pc = self.ranks[rank].pc;
        let op = self.schedule.programs[rank][pc];
        SimError::Schedule(format!("rank {rank}, op #{pc} ({op}): {msg}"))
    }

    /// Checks a chunk lies inside the placement and runs on `rank`.
    fn check_local(&self, rank: usize, c: Chunk) -> Result<usize, SimError> {
        let placement = &self.schedule.placement;
        if c.dir >= self.index.dirs || c.stage >= self.index.stages {
            return Err(self.err(
                rank,
                format!(
                    "chunk {c} lies outside the placement ({} directions x {} stages)",
                    self.index.dirs, self.index.stages
                ),
            ));
        }
        let owner = placement.rank(c.dir, c.stage);
        if owner != rank {
            return Err(self.err(
                rank,
                format!(
                    "the placement puts stage {} of direction {} on rank {owner}, not here",
                    c.stage, c.dir
                ),
            ));
        }
        Ok(self.index.of(c))
    }

    /// Checks a communication op's peer runs the neighbour chunk `other`.
    fn check_peer(
        &self,
        rank: usize,
        other: Option<Chunk>,
        peer: usize,
        what: &str,
    ) -> Result<Chunk, SimError> {
        let Some(other) = other else {
            return Err(self.err(rank, format!("there is no {what} stage to exchange with")));
        };
        let owner = self.schedule.placement.rank(other.dir, other.stage);
        if owner != peer {
            return Err(self.err(
                rank,
                format!(
                    "the {what} chunk {other} runs on rank {owner}, but the op names peer {peer}"
                ),
            ));
        }
        Ok(other)
    }

    fn next_chunk(&self, c: Chunk) -> Option<Chunk> {
        (c.stage + 1 < self.index.stages).then(|| Chunk::new(c.dir, c.stage + 1, c.mb))
    }

    fn prev_chunk(c: Chunk) -> Option<Chunk> {
        (c.stage > 0).then(|| Chunk::new(c.dir, c.stage - 1, c.mb))
    }

    fn arrival(&self, slot: Slot) -> f64 {
        match slot {
            Slot::Fwd(i) => self.fwd_arrival[i],
            Slot::Bwd(i) => self.bwd_arrival[i],
        }
    }

    fn slot_index(&self, slot: Slot) -> usize {
        match slot {
            Slot::Fwd(i) => i,
            Slot::Bwd(i) => self.index.len() + i,
        }
    }

    /// Parks `rank` until the message of `slot` is sent.
    fn park(&mut self, rank: usize, slot: Slot) {
        let k = self.slot_index(slot);
        self.waiters[k] = Some(rank);
    }

    /// What the forward of `c` on `rank` needs.
    fn forward_needs(&self, rank: usize, c: Chunk, needs: &mut Vec<Need>) {
        if let Some(p) = Self::prev_chunk(c) {
            if self.schedule.placement.rank(p.dir, p.stage) == rank {
                needs.push(Need::Local(self.fwd_done[self.index.of(p)], "forward", p));
            } else {
                needs.push(Need::Message(
                    Slot::Fwd(self.index.of(c)),
                    MessageKind::Forward,
                    c,
                ));
            }
        }
    }

    /// What the backward (B, I or FB's backward) of `c` on `rank` needs.
    fn backward_needs(&self, rank: usize, c: Chunk, needs: &mut Vec<Need>) {
        let i = self.index.of(c);
        needs.push(Need::Local(self.fwd_done[i], "forward", c));
        if let Some(n) = self.next_chunk(c) {
            if self.schedule.placement.rank(n.dir, n.stage) == rank {
                needs.push(Need::Local(self.bwd_done[self.index.of(n)], "backward", n));
            } else {
                needs.push(Need::Message(Slot::Bwd(i), MessageKind::Backward, c));
            }
        }
    }

    /// Runs `rank`'s program until it ends or needs a message that has not been sent.
    fn advance(&mut self, rank: usize) -> Result<(), SimError> {
        // One scratch list for every call (a rank is advanced once per wake-up).
        let mut needs = std::mem::take(&mut self.needs);
        let result = self.advance_with(rank, &mut needs);
        self.needs = needs;
        result
    }

    fn advance_with(&mut self, rank: usize, needs: &mut Vec<Need>) -> Result<(), SimError> {
        let ops = self.schedule.programs[rank].len();
        while self.ranks[rank].pc < ops {
            let op = self.schedule.programs[rank][self.ranks[rank].pc];
            let went_on = match op {
                Op::SendF { chunk, peer } | Op::SendB { chunk, peer } => {
                    let forward = matches!(op, Op::SendF { .. });
                    self.send(rank, chunk, peer, forward)?;
                    true
                }
                Op::RecvF { chunk, peer } | Op::RecvB { chunk, peer } => {
                    self.post_recv(rank, chunk, peer, matches!(op, Op::RecvF { .. }))?;
                    true
                }
                Op::Wait => self.wait(rank),
                Op::F(_) | Op::B(_) | Op::I(_) | Op::W(_) | Op::FB { .. } => {
                    self.compute(rank, op, needs)?
                }
            };
            if !went_on {
                return Ok(());
            }
            self.ranks[rank].pc += 1;
        }
        Ok(())
    }

    /// `rank` sends the forward (or backward) message of `chunk` to `peer`, waking a rank
    /// parked on it.
    fn send(
        &mut self,
        rank: usize,
        chunk: Chunk,
        peer: usize,
        forward: bool,
    ) -> Result<(), SimError> {
        let i = self.check_local(rank, chunk)?;
        let (done, dst, kind) = if forward {
            let dst = self.check_peer(rank, self.next_chunk(chunk), peer, "next")?;
            (self.fwd_done[i], dst, MessageKind::Forward)
        } else {
            let dst = self.check_peer(rank, Self::prev_chunk(chunk), peer, "previous")?;
            (self.bwd_done[i], dst, MessageKind::Backward)
        };
        if done.is_nan() {
            let what = if forward { "forward" } else { "backward" };
            return Err(self.err(
                rank,
                format!("the {what} of {chunk} has not run on this rank before its send"),
            ));
        }
        let j = self.index.of(dst);
        let slot = if forward { Slot::Fwd(j) } else { Slot::Bwd(j) };
        if !self.arrival(slot).is_nan() {
            return Err(self.err(rank, format!("the message for {dst} was already sent")));
        }
        // With a network, the sender is busy for the transfer and the message arrives a
        // latency later; without, the single message time does both.
        let (busy, travel) = match &self.cost.network {
            Some(net) => {
                let boundary = if forward { chunk.stage } else { dst.stage };
                net.message(rank, peer, boundary, self.cost.comm.message_bytes)
            }
            None => (self.message_time, self.message_time),
        };
        let state = &mut self.ranks[rank];
        let start = state.time.max(state.comm_free);
        let end = start + travel;
        state.comm_free = start + busy;
        if self.cost.comm.blocking {
            self.timeline.comm_wait[rank] += end - state.time;
            state.time = end;
        }
        match slot {
            Slot::Fwd(j) => self.fwd_arrival[j] = end,
            Slot::Bwd(j) => self.bwd_arrival[j] = end,
        }
        self.timeline.messages.push(MessageInterval {
            src: rank,
            dst: peer,
            kind,
            src_chunk: chunk,
            dst_chunk: dst,
            start,
            end,
        });
        let k = self.slot_index(slot);
        if let Some(waiting) = self.waiters[k].take() {
            self.queue.push_back(waiting);
        }
        Ok(())
    }

    /// `rank` posts the receive of `chunk`'s forward (or backward) message from `peer`.
    fn post_recv(
        &mut self,
        rank: usize,
        chunk: Chunk,
        peer: usize,
        forward: bool,
    ) -> Result<(), SimError> {
        let i = self.check_local(rank, chunk)?;
        let slot = if forward {
            self.check_peer(rank, Self::prev_chunk(chunk), peer, "previous")?;
            self.fwd_posted[i] = true;
            Slot::Fwd(i)
        } else {
            self.check_peer(rank, self.next_chunk(chunk), peer, "next")?;
            self.bwd_posted[i] = true;
            Slot::Bwd(i)
        };
        self.ranks[rank].pending.push((slot, chunk));
        Ok(())
    }

    /// `rank` waits for every receive it posted; false when it is parked on one not sent yet.
    fn wait(&mut self, rank: usize) -> bool {
        let mut ready = self.ranks[rank].time;
        for k in 0..self.ranks[rank].pending.len() {
            let slot = self.ranks[rank].pending[k].0;
            let arrival = self.arrival(slot);
            if arrival.is_nan() {
                self.park(rank, slot);
                return false;
            }
            ready = ready.max(arrival);
        }
        let state = &mut self.ranks[rank];
        self.timeline.comm_wait[rank] += ready - state.time;
        state.time = ready;
        state.pending.clear();
        true
    }

    /// `rank` runs the compute op `op` once what it needs is there; false when it is parked
    /// on a message not sent yet.
    fn compute(&mut self, rank: usize, op: Op, needs: &mut Vec<Need>) -> Result<bool, SimError> {
        needs.clear();
        let indices = self.compute_needs(rank, op, needs)?;
        let Some(ready) = self.ready_at(rank, needs)? else {
            return Ok(false);
        };
        let duration = if self.cost.rank_speed.is_empty() {
            self.cost.duration(&op)
        } else {
            self.cost.duration(&op) / self.cost.speed(rank)
        };
        let state = &mut self.ranks[rank];
        self.timeline.comm_wait[rank] += ready - state.time;
        let end = ready + duration;
        state.time = end;
        let [fi, bi] = indices;
        if fi != usize::MAX {
            if !self.fwd_done[fi].is_nan() {
                return Err(self.err(rank, "this chunk's forward already ran".into()));
            }
            self.fwd_done[fi] = end;
        }
        if bi != usize::MAX {
            match op {
                Op::W(_) => self.w_done[bi] = true,
                _ => {
                    if !self.bwd_done[bi].is_nan() {
                        return Err(self.err(rank, "this chunk's backward already ran".into()));
                    }
                    self.bwd_done[bi] = end;
                    self.input_only[bi] = matches!(op, Op::I(_));
                }
            }
        }
        self.timeline.compute[rank].push(ComputeInterval {
            op,
            start: ready,
            end,
        });
        Ok(true)
    }

    /// What the compute op `op` on `rank` needs, into `needs`; returns the chunk indices of
    /// its forward and its backward (`usize::MAX` for none).
    fn compute_needs(
        &self,
        rank: usize,
        op: Op,
        needs: &mut Vec<Need>,
    ) -> Result<[usize; 2], SimError> {
        let mut indices = [usize::MAX; 2];
        match op {
            Op::F(c) => {
                indices[0] = self.check_local(rank, c)?;
                self.forward_needs(rank, c, needs);
            }
            Op::B(c) | Op::I(c) => {
                indices[1] = self.check_local(rank, c)?;
                self.backward_needs(rank, c, needs);
            }
            Op::W(c) => {
                let i = self.check_local(rank, c)?;
                if !self.input_only[i] || self.w_done[i] {
                    return Err(self.err(
                        rank,
                        format!("W needs exactly one earlier I of {c} on this rank"),
                    ));
                }
                indices[1] = i;
            }
            Op::FB { f, b } => {
                indices[0] = self.check_local(rank, f)?;
                indices[1] = self.check_local(rank, b)?;
                self.forward_needs(rank, f, needs);
                self.backward_needs(rank, b, needs);
            }
            _ => unreachable!("compute ops only"),
        }
        Ok(indices)
    }

    /// When everything in `needs` is there for `rank`; `None` when it is parked on a message
    /// not sent yet.
    fn ready_at(&mut self, rank: usize, needs: &[Need]) -> Result<Option<f64>, SimError> {
        let mut ready = self.ranks[rank].time;
        for need in needs {
            match *need {
                Need::Local(t, what, c) => {
                    if t.is_nan() {
                        return Err(self.err(
                            rank,
                            format!(
                                "needs the {what} of {c} on this rank, which has not run before it"
                            ),
                        ));
                    }
                    ready = ready.max(t);
                }
                Need::Message(slot, kind, c) => {
                    let posted = match slot {
                        Slot::Fwd(i) => self.fwd_posted[i],
                        Slot::Bwd(i) => self.bwd_posted[i],
                    };
                    if !posted {
                        let recv = match kind {
                            MessageKind::Forward => "RECV_F",
                            MessageKind::Backward => "RECV_B",
                        };
                        return Err(self.err(
                            rank,
                            format!("its input for {c} comes from another rank, but no {recv} for it was posted before it; lower the schedule (dualpipe_schedule::lower) before simulating"),
                        ));
                    }
                    let arrival = self.arrival(slot);
                    if arrival.is_nan() {
                        self.park(rank, slot);
                        return Ok(None);
                    }
                    ready = ready.max(arrival);
                }
            }
        }
        Ok(Some(ready))
    }
}
