//! One rank's interpreter: runs its program op by op against its stages.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use dualpipe_schedule::ir::Neighbour;
use dualpipe_schedule::{Chunk, Op, Schedule};
use dualpipe_schedule::{ComputeInterval, MessageInterval, MessageKind};

use super::cpu::{thread_cpu_seconds, thread_run_delay_seconds, RankTime};
use super::hook::{last_weight_ops, StepHook};
use super::types::{describe, ExecOptions, MicroBatchLoss, RankStages};
use crate::error::panic_message;
use crate::transport::{Key, Transport, WaitError};
use crate::{ForwardInput, ForwardOutput, RuntimeError, Stage, StageError};

/// What one rank measured during a successful step.
pub(crate) struct RankRecord {
    /// Compute intervals in program (and start) order.
    pub compute: Vec<ComputeInterval>,
    /// Messages this rank sent.
    pub messages: Vec<MessageInterval>,
    /// Seconds the rank spent blocked on receives.
    pub comm_wait: f64,
    /// Seconds the thread was runnable but waited for a core while running the program
    /// (`None` where the kernel does not say).
    pub run_delay: Option<f64>,
    /// Losses of the micro-batches whose last stage ran here.
    pub losses: Vec<MicroBatchLoss>,
    /// Seconds from the step start until the program ended.
    pub active: f64,
    /// CPU seconds this rank's thread used while running the program (`None`: no thread CPU
    /// clock on this platform).
    pub cpu: Option<f64>,
}

impl RankRecord {
    /// Where this rank's time went.
    pub fn time(&self) -> RankTime {
        match (self.cpu, self.run_delay) {
            (Some(cpu), Some(delay)) => RankTime::from_run_delay(self.active, cpu, delay),
            _ => RankTime::new(self.active, self.comm_wait, self.cpu),
        }
    }
}

/// Why a rank stopped early.
enum Fail {
    /// This rank failed; the error goes to every rank.
    Error(RuntimeError),
    /// Another rank failed first.
    Aborted,
    /// Another process failed and said who it was.
    PeerFailed {
        /// The failed rank.
        rank: usize,
        /// Its error.
        message: String,
    },
}

impl From<RuntimeError> for Fail {
    fn from(err: RuntimeError) -> Self {
        Fail::Error(err)
    }
}

/// One rank's state during a step.
pub(crate) struct Worker<'a, S: Stage, Tr> {
    rank: usize,
    schedule: &'a Schedule,
    stages: &'a mut RankStages<S>,
    transport: Tr,
    /// Tensors handed from one stage of this rank to another, without a message.
    local: HashMap<Key, S::Tensor>,
    options: &'a ExecOptions,
    start: Instant,
    last_stage: usize,
    /// Producer outputs this program sends with an explicit SEND op.
    sends: HashSet<(MessageKind, Chunk)>,
    /// Computed outputs waiting for their SEND op.
    outbox: HashMap<(MessageKind, Chunk), S::Tensor>,
    /// When the compute op being run started (after its inputs arrived).
    op_start: f64,
    /// Told when a stage's gradients are final, and between ops.
    hook: &'a dyn StepHook<S>,
    /// Op index -> the stages whose last weight-gradient op it is.
    done_after: HashMap<usize, Vec<(usize, usize)>>,
    record: RankRecord,
}

impl<'a, S: Stage, Tr: Transport<S::Tensor>> Worker<'a, S, Tr> {
    /// A worker for `rank` on `transport`, timing everything from `start`, telling `hook`.
    pub fn new(
        rank: usize,
        schedule: &'a Schedule,
        stages: &'a mut RankStages<S>,
        transport: Tr,
        options: &'a ExecOptions,
        start: Instant,
        hook: &'a dyn StepHook<S>,
    ) -> Self {
        let mut done_after: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
        for (key, at) in last_weight_ops(&schedule.programs[rank]) {
            done_after.entry(at).or_default().push(key);
        }
        done_after
            .values_mut()
            .for_each(|keys| keys.sort_unstable());
        let sends = schedule.programs[rank]
            .iter()
            .filter_map(|op| match *op {
                Op::SendF { chunk, .. } => Some((MessageKind::Forward, chunk)),
                Op::SendB { chunk, .. } => Some((MessageKind::Backward, chunk)),
                _ => None,
            })
            .collect();
        Worker {
            rank,
            schedule,
            stages,
            transport,
            local: HashMap::new(),
            options,
            start,
            last_stage: schedule.placement.stages() - 1,
            sends,
            outbox: HashMap::new(),
            op_start: 0.0,
            hook,
            done_after,
            record: RankRecord {
                compute: Vec::new(),
                messages: Vec::new(),
                comm_wait: 0.0,
                run_delay: None,
                losses: Vec::new(),
                active: 0.0,
                cpu: None,
            },
        }
    }

    /// Runs the program. On failure tells every rank through the transport and returns
    /// the error: `Err(Some(..))` for this rank's own failure or a failed peer that said who
    /// it was, `Err(None)` when another rank of this process failed first (the transport's
    /// shared state holds that error).
    pub fn run(mut self) -> Result<RankRecord, Option<RuntimeError>> {
        let rank = self.rank;
        let cpu_start = thread_cpu_seconds();
        let delay_start = thread_run_delay_seconds();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.run_program()));
        let err = match outcome {
            Ok(Ok(())) => {
                self.record.active = self.now();
                self.record.cpu = cpu_start
                    .zip(thread_cpu_seconds())
                    .map(|(start, end)| end - start);
                self.record.run_delay = delay_start
                    .zip(thread_run_delay_seconds())
                    .map(|(start, end)| end - start);
                return Ok(self.record);
            }
            Ok(Err(Fail::Aborted)) => return Err(None),
            Ok(Err(Fail::PeerFailed {
                rank: failed_rank,
                message,
            })) => {
                return Err(Some(RuntimeError::PeerFailed {
                    rank,
                    failed_rank,
                    message,
                }))
            }
            Ok(Err(Fail::Error(err))) => err,
            Err(payload) => RuntimeError::StagePanicked {
                rank,
                op: "the executor".into(),
                message: panic_message(payload.as_ref()),
            },
        };
        self.transport.fail(err.clone());
        Err(Some(err))
    }

    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn run_program(&mut self) -> Result<(), Fail> {
        let schedule = self.schedule;
        for (at, op) in schedule.programs[self.rank].iter().enumerate() {
            if self.transport.aborted() {
                return Err(self.abort_reason());
            }
            match *op {
                Op::F(c) => {
                    let input = self.forward_input(op, c)?;
                    let out = self.guarded(op, |st| stage_mut(st, c)?.forward(c, input))?;
                    self.push_compute(op);
                    self.route_forward(op, c, out)?;
                }
                Op::B(c) | Op::I(c) => {
                    let grad = self.grad_output(op, c)?;
                    let full = matches!(op, Op::B(_));
                    let grad_in = self.guarded(op, |st| {
                        let stage = stage_mut(st, c)?;
                        let grad_in = stage.backward_input(c, grad)?;
                        if full {
                            stage.backward_weight(c)?;
                        }
                        Ok(grad_in)
                    })?;
                    self.push_compute(op);
                    self.route_backward(op, c, grad_in)?;
                }
                Op::W(c) => {
                    self.guarded(op, |st| stage_mut(st, c)?.backward_weight(c))?;
                    self.push_compute(op);
                }
                Op::FB { f, b } => {
                    let input = self.forward_input(op, f)?;
                    let grad = self.grad_output(op, b)?;
                    let (out, grad_in) = self.guarded(op, |st| {
                        if (f.dir, f.stage) == (b.dir, b.stage) {
                            stage_mut(st, f)?.forward_backward(f, input, b, grad)
                        } else {
                            let (sf, sb) = st
                                .get_pair_mut((f.dir, f.stage), (b.dir, b.stage))
                                .ok_or_else(|| StageError("a stage of the FB is missing".into()))?;
                            sf.forward_backward_pair(f, input, sb, b, grad)
                        }
                    })?;
                    self.push_compute(op);
                    self.route_forward(op, f, out)?;
                    self.route_backward(op, b, grad_in)?;
                }
                Op::SendF { chunk, peer } => {
                    let consumer = self.neighbour(op, chunk, Neighbour::Next)?;
                    self.send(op, MessageKind::Forward, chunk, consumer, peer)?;
                }
                Op::SendB { chunk, peer } => {
                    let consumer = self.neighbour(op, chunk, Neighbour::Prev)?;
                    self.send(op, MessageKind::Backward, chunk, consumer, peer)?;
                }
                // Receives are posted early (the inbox buffers every arrival) and a compute op
                // waits for its own input only, so neither needs to do anything here.
                Op::RecvF { .. } | Op::RecvB { .. } | Op::Wait => {}
            }
            self.tell_hook(op, at)?;
        }
        if let Some(&(kind, chunk)) = self.outbox.keys().next() {
            return Err(self.protocol(
                &Op::Wait,
                format!(
                    "the program ended with the {} output of {chunk} computed but never sent",
                    kind_name(kind)
                ),
            ));
        }
        Ok(())
    }

    /// Tells the hook which stages op `at` finished (their gradients are final), then that
    /// an op ended.
    fn tell_hook(&mut self, op: &Op, at: usize) -> Result<(), Fail> {
        let (rank, hook) = (self.rank, self.hook);
        let done = self.done_after.remove(&at).unwrap_or_default();
        let stages = &*self.stages;
        let told = catch_unwind(AssertUnwindSafe(|| {
            for (dir, stage) in done {
                let copy = stages.get(dir, stage).ok_or_else(|| {
                    StageError(format!("stage (dir {dir}, stage {stage}) is missing"))
                })?;
                hook.stage_done(rank, dir, stage, copy)?;
            }
            hook.between_ops(rank)
        }));
        match told {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(Fail::Error(RuntimeError::StageFailed {
                rank,
                op: format!("the step hook after {}", describe(op)),
                cause: err.0,
            })),
            Err(payload) => Err(Fail::Error(RuntimeError::StagePanicked {
                rank,
                op: format!("the step hook after {}", describe(op)),
                message: panic_message(payload.as_ref()),
            })),
        }
    }

    /// Runs a stage call, noting its start and turning its error or panic into this rank's
    /// failure.
    fn guarded<R>(
        &mut self,
        op: &Op,
        call: impl FnOnce(&mut RankStages<S>) -> Result<R, StageError>,
    ) -> Result<R, Fail> {
        self.op_start = self.now();
        let slow = self
            .options
            .slow_rank
            .filter(|&(rank, factor)| rank == self.rank && factor > 1.0)
            .map(|(_, factor)| (factor, thread_cpu_seconds()));
        let stages = &mut *self.stages;
        match catch_unwind(AssertUnwindSafe(|| call(stages))) {
            Ok(Ok(value)) => {
                if let Some((factor, cpu_start)) = slow {
                    let used = match (cpu_start, thread_cpu_seconds()) {
                        (Some(a), Some(b)) => b - a,
                        _ => self.now() - self.op_start,
                    };
                    let pause = (factor - 1.0) * used.max(0.0);
                    if pause.is_finite() {
                        std::thread::sleep(std::time::Duration::from_secs_f64(pause.min(3600.0)));
                    }
                }
                Ok(value)
            }
            Ok(Err(err)) => Err(Fail::Error(RuntimeError::StageFailed {
                rank: self.rank,
                op: describe(op),
                cause: err.0,
            })),
            Err(payload) => Err(Fail::Error(RuntimeError::StagePanicked {
                rank: self.rank,
                op: describe(op),
                message: panic_message(payload.as_ref()),
            })),
        }
    }

    /// Records the op that just ended, from the start [`Worker::guarded`] noted.
    fn push_compute(&mut self, op: &Op) {
        let end = self.now();
        self.record.compute.push(ComputeInterval {
            op: *op,
            start: self.op_start,
            end,
        });
    }

    fn protocol(&self, op: &Op, message: String) -> Fail {
        Fail::Error(RuntimeError::Protocol {
            rank: self.rank,
            op: describe(op),
            message,
        })
    }

    /// The input of chunk `c`'s forward: its micro-batch at stage 0, else the activations.
    fn forward_input(&mut self, op: &Op, c: Chunk) -> Result<ForwardInput<S::Tensor>, Fail> {
        let Some(producer) = self.schedule.placement.neighbour(c, Neighbour::Prev) else {
            return Ok(ForwardInput::MicroBatch {
                global_mb: self.schedule.global_mb(c),
            });
        };
        let key = Key {
            kind: MessageKind::Forward,
            chunk: c,
        };
        Ok(ForwardInput::Activation(self.receive(op, key, producer)?))
    }

    /// The output gradient of chunk `c`'s backward: none at the last stage.
    fn grad_output(&mut self, op: &Op, c: Chunk) -> Result<Option<S::Tensor>, Fail> {
        let Some(producer) = self.schedule.placement.neighbour(c, Neighbour::Next) else {
            return Ok(None);
        };
        let key = Key {
            kind: MessageKind::Backward,
            chunk: c,
        };
        Ok(Some(self.receive(op, key, producer)?))
    }

    /// The chunk at the neighbouring stage of `c` (`check_setup` proved it exists wherever a
    /// tensor crosses to it).
    fn neighbour(&self, op: &Op, c: Chunk, side: Neighbour) -> Result<Chunk, Fail> {
        self.schedule.placement.neighbour(c, side).ok_or_else(|| {
            self.protocol(
                op,
                format!("{c} has no neighbouring stage on the {side:?} side"),
            )
        })
    }

    /// Takes the tensor for `key` (produced by `producer`), waiting for it if it is remote.
    fn receive(&mut self, op: &Op, key: Key, producer: Chunk) -> Result<S::Tensor, Fail> {
        let src = self.schedule.placement.rank(producer.dir, producer.stage);
        if let Some(tensor) = self.local.remove(&key) {
            return self.check_source(op, key, src, self.rank).map(|()| tensor);
        }
        match self.transport.try_take(key) {
            Ok(Some((from, tensor))) => {
                return self.check_source(op, key, src, from).map(|()| tensor)
            }
            Ok(None) => {}
            Err(err) => return Err(self.wait_failure(op, key, src, err)),
        }
        if src == self.rank && !self.sends.contains(&(key.kind, producer)) {
            return Err(self.protocol(
                op,
                format!(
                    "needs the {} output of {producer} on this rank, which has not run yet \
                     (the program order breaks a dependency)",
                    kind_name(key.kind)
                ),
            ));
        }
        let began = Instant::now();
        let taken = self.transport.take(
            key,
            began + self.options.recv_timeout,
            self.options.poll_interval,
        );
        self.record.comm_wait += began.elapsed().as_secs_f64();
        match taken {
            Ok((from, tensor)) => self.check_source(op, key, src, from).map(|()| tensor),
            Err(err) => Err(self.wait_failure(op, key, src, err)),
        }
    }

    /// Why the step stops after another rank failed.
    fn abort_reason(&mut self) -> Fail {
        match self.transport.failed_peer() {
            Some((rank, message)) => Fail::PeerFailed { rank, message },
            None => Fail::Aborted,
        }
    }

    /// The failure for a receive of `key` from `src` that ended with `err`.
    fn wait_failure(&self, op: &Op, key: Key, src: usize, err: WaitError) -> Fail {
        match err {
            WaitError::Aborted => Fail::Aborted,
            WaitError::PeerFailed { rank, message } => Fail::PeerFailed { rank, message },
            WaitError::TimedOut => Fail::Error(RuntimeError::Timeout {
                rank: self.rank,
                what: format!("{} {}", recv_name(key.kind), key.chunk),
                peer: src,
                timeout: self.options.recv_timeout,
            }),
            WaitError::Duplicate(dup, from) => self.protocol(
                op,
                format!(
                    "a second {} message for {} arrived (from rank {from})",
                    recv_name(dup.kind),
                    dup.chunk
                ),
            ),
            WaitError::Transport(message) => Fail::Error(RuntimeError::Transport {
                rank: self.rank,
                op: describe(op),
                message,
            }),
        }
    }

    fn check_source(&self, op: &Op, key: Key, expected: usize, from: usize) -> Result<(), Fail> {
        if from == expected {
            Ok(())
        } else {
            Err(self.protocol(
                op,
                format!(
                    "the {} message for {} came from rank {from}, expected rank {expected}",
                    recv_name(key.kind),
                    key.chunk
                ),
            ))
        }
    }

    fn route_forward(
        &mut self,
        op: &Op,
        c: Chunk,
        out: ForwardOutput<S::Tensor>,
    ) -> Result<(), Fail> {
        let last = c.stage == self.last_stage;
        match out {
            ForwardOutput::Loss(loss) if last => {
                self.record.losses.push(MicroBatchLoss {
                    dir: c.dir,
                    mb: c.mb,
                    global_mb: self.schedule.global_mb(c),
                    loss,
                });
                Ok(())
            }
            ForwardOutput::Loss(_) => Err(self.protocol(
                op,
                format!(
                    "the stage returned a loss, but stage {} is not the last ({}); return \
                     ForwardOutput::Activation",
                    c.stage, self.last_stage
                ),
            )),
            ForwardOutput::Activation(_) if last => Err(self.protocol(
                op,
                format!(
                    "stage {} is the last stage and must return ForwardOutput::Loss",
                    c.stage
                ),
            )),
            ForwardOutput::Activation(t) => {
                let consumer = self.neighbour(op, c, Neighbour::Next)?;
                self.route(op, MessageKind::Forward, c, consumer, t)
            }
        }
    }

    fn route_backward(
        &mut self,
        op: &Op,
        c: Chunk,
        grad_in: Option<S::Tensor>,
    ) -> Result<(), Fail> {
        let Some(consumer) = self.schedule.placement.neighbour(c, Neighbour::Prev) else {
            // Nothing precedes the first stage; a gradient it returns anyway is dropped.
            return Ok(());
        };
        match grad_in {
            Some(t) => self.route(op, MessageKind::Backward, c, consumer, t),
            None => Err(self.protocol(
                op,
                format!(
                    "backward_input returned no gradient, but stage {} must pass one to \
                     stage {}",
                    c.stage, consumer.stage
                ),
            )),
        }
    }

    /// Keeps an output for its SEND op, or hands it to a consumer on this rank.
    fn route(
        &mut self,
        op: &Op,
        kind: MessageKind,
        producer: Chunk,
        consumer: Chunk,
        tensor: S::Tensor,
    ) -> Result<(), Fail> {
        if self.sends.contains(&(kind, producer)) {
            if self.outbox.insert((kind, producer), tensor).is_some() {
                return Err(self.protocol(
                    op,
                    format!("the {} of {producer} ran twice", kind_name(kind)),
                ));
            }
            return Ok(());
        }
        // check_setup proved the consumer is on this rank.
        let key = Key {
            kind,
            chunk: consumer,
        };
        if self.local.insert(key, tensor).is_some() {
            return Err(self.protocol(
                op,
                format!("the {} of {producer} ran twice", kind_name(kind)),
            ));
        }
        Ok(())
    }

    fn send(
        &mut self,
        op: &Op,
        kind: MessageKind,
        producer: Chunk,
        consumer: Chunk,
        peer: usize,
    ) -> Result<(), Fail> {
        let Some(tensor) = self.outbox.remove(&(kind, producer)) else {
            return Err(self.protocol(
                op,
                format!(
                    "nothing to send: the {} of {producer} has not run on this rank yet",
                    kind_name(kind)
                ),
            ));
        };
        let start = self.now();
        let key = Key {
            kind,
            chunk: consumer,
        };
        if let Err(err) = self.transport.send(peer, key, tensor) {
            return Err(self.wait_failure(op, key, peer, err));
        }
        let end = self.now();
        self.record.messages.push(MessageInterval {
            src: self.rank,
            dst: peer,
            kind,
            src_chunk: producer,
            dst_chunk: consumer,
            start,
            end,
        });
        Ok(())
    }
}

fn stage_mut<S>(stages: &mut RankStages<S>, c: Chunk) -> Result<&mut S, StageError> {
    stages
        .get_mut(c.dir, c.stage)
        .ok_or_else(|| StageError(format!("no stage for (dir {}, stage {})", c.dir, c.stage)))
}

fn kind_name(kind: MessageKind) -> &'static str {
    match kind {
        MessageKind::Forward => "forward",
        MessageKind::Backward => "backward",
    }
}

fn recv_name(kind: MessageKind) -> &'static str {
    match kind {
        MessageKind::Forward => "RECV_F",
        MessageKind::Backward => "RECV_B",
    }
}
