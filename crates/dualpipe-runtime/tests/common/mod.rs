//! Test stages and hand-made schedules for the executor's tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use dualpipe_runtime::{build_ranks, ForwardInput, ForwardOutput, RankStages, Stage, StageError};
use dualpipe_schedule::{lower, Chunk, Op, OpKind, Schedule, ScheduleKind, StagePlacement};

/// The input of micro-batch `global_mb`.
pub fn input(global_mb: usize) -> f64 {
    1.0 + 0.25 * global_mb as f64
}

/// A scalar affine stage `y = a x + b`; the last stage's loss is `y^2 / 2`.
///
/// It checks its own use: a forward twice for one chunk, a backward before the forward, a `W`
/// without its `I` or twice, all fail, so an executor that mixes messages or misorders ops is
/// caught.
#[derive(Clone, Debug)]
pub struct AffineStage {
    pub stage: usize,
    pub last: bool,
    pub a: f64,
    pub b: f64,
    pub grad_a: f64,
    pub grad_b: f64,
    saved_x: HashMap<Chunk, f64>,
    saved_y: HashMap<Chunk, f64>,
    pending_dy: HashMap<Chunk, f64>,
}

impl AffineStage {
    pub fn new(stage: usize, stages: usize) -> Self {
        AffineStage {
            stage,
            last: stage + 1 == stages,
            a: 0.9 + 0.05 * stage as f64,
            b: 0.01 * (stage as f64 + 1.0),
            grad_a: 0.0,
            grad_b: 0.0,
            saved_x: HashMap::new(),
            saved_y: HashMap::new(),
            pending_dy: HashMap::new(),
        }
    }

    /// Whether every forward was matched by its backward.
    pub fn drained(&self) -> bool {
        self.saved_x.is_empty() && self.saved_y.is_empty() && self.pending_dy.is_empty()
    }
}

impl Stage for AffineStage {
    type Tensor = f64;

    fn forward(
        &mut self,
        chunk: Chunk,
        input_: ForwardInput<f64>,
    ) -> Result<ForwardOutput<f64>, StageError> {
        if chunk.stage != self.stage {
            return Err(StageError(format!("stage {} got {chunk}", self.stage)));
        }
        let x = match input_ {
            ForwardInput::MicroBatch { global_mb } if self.stage == 0 => input(global_mb),
            ForwardInput::Activation(x) if self.stage > 0 => x,
            _ => return Err(StageError("wrong kind of forward input".into())),
        };
        if self.saved_x.insert(chunk, x).is_some() {
            return Err(StageError(format!("forward of {chunk} ran twice")));
        }
        let y = self.a * x + self.b;
        if self.last {
            self.saved_y.insert(chunk, y);
            Ok(ForwardOutput::Loss(0.5 * y * y))
        } else {
            Ok(ForwardOutput::Activation(y))
        }
    }

    fn backward_input(
        &mut self,
        chunk: Chunk,
        grad_output: Option<f64>,
    ) -> Result<Option<f64>, StageError> {
        if !self.saved_x.contains_key(&chunk) {
            return Err(StageError(format!(
                "backward of {chunk} before its forward"
            )));
        }
        let dy = match (grad_output, self.last) {
            (None, true) => self
                .saved_y
                .remove(&chunk)
                .ok_or_else(|| StageError(format!("no saved output for {chunk}")))?,
            (Some(g), false) => g,
            _ => return Err(StageError("wrong kind of output gradient".into())),
        };
        if self.pending_dy.insert(chunk, dy).is_some() {
            return Err(StageError(format!("backward_input of {chunk} ran twice")));
        }
        Ok((self.stage > 0).then_some(self.a * dy))
    }

    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), StageError> {
        let dy = self
            .pending_dy
            .remove(&chunk)
            .ok_or_else(|| StageError(format!("W of {chunk} without its I")))?;
        let x = self.saved_x.remove(&chunk).expect("saved with the forward");
        self.grad_a += dy * x;
        self.grad_b += dy;
        Ok(())
    }

    fn gradients(&self) -> Vec<f64> {
        vec![self.grad_a, self.grad_b]
    }

    fn add_gradients(&mut self, other: &[f64]) -> Result<(), StageError> {
        let [ga, gb] = other else {
            return Err(StageError(format!(
                "expected 2 gradients, got {}",
                other.len()
            )));
        };
        self.grad_a += ga;
        self.grad_b += gb;
        Ok(())
    }
}

/// The oracle: losses per global micro-batch and total gradients per stage, computed one
/// micro-batch at a time through a single copy of every stage, without the executor.
pub fn sequential(stages: usize, micro_batches: usize) -> (Vec<f64>, Vec<(f64, f64)>) {
    let mut model: Vec<AffineStage> = (0..stages).map(|s| AffineStage::new(s, stages)).collect();
    let mut losses = Vec::new();
    for g in 0..micro_batches {
        let mut input_ = ForwardInput::MicroBatch { global_mb: g };
        for (s, st) in model.iter_mut().enumerate() {
            match st.forward(Chunk::new(0, s, g), input_).unwrap() {
                ForwardOutput::Activation(y) => input_ = ForwardInput::Activation(y),
                ForwardOutput::Loss(l) => {
                    losses.push(l);
                    input_ = ForwardInput::Activation(f64::NAN);
                }
            }
        }
        let mut grad = None;
        for (s, st) in model.iter_mut().enumerate().rev() {
            grad = st.backward_input(Chunk::new(0, s, g), grad).unwrap();
            st.backward_weight(Chunk::new(0, s, g)).unwrap();
        }
    }
    let grads = model.iter().map(|s| (s.grad_a, s.grad_b)).collect();
    (losses, grads)
}

/// Affine stages for every rank of `schedule`.
pub fn affine_ranks(schedule: &Schedule) -> Vec<RankStages<AffineStage>> {
    let stages = schedule.placement.stages();
    build_ranks(&schedule.placement, |_, _, stage| {
        AffineStage::new(stage, stages)
    })
}

/// How a [`Faulty`] stage misbehaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// Returns a `StageError`.
    Error,
    /// Panics.
    Panic,
    /// Sleeps this long, then works.
    Sleep(Duration),
}

/// An [`AffineStage`] that misbehaves at one op of one chunk.
pub struct Faulty {
    pub inner: AffineStage,
    pub at: Option<(OpKind, Chunk)>,
    pub fault: Fault,
}

impl Faulty {
    fn trip(&self, kind: OpKind, chunk: Chunk) -> Result<(), StageError> {
        if self.at != Some((kind, chunk)) {
            return Ok(());
        }
        match self.fault {
            Fault::Error => Err(StageError("injected failure".into())),
            Fault::Panic => panic!("injected panic"),
            Fault::Sleep(d) => {
                std::thread::sleep(d);
                Ok(())
            }
        }
    }
}

impl Stage for Faulty {
    type Tensor = f64;

    fn forward(
        &mut self,
        chunk: Chunk,
        input_: ForwardInput<f64>,
    ) -> Result<ForwardOutput<f64>, StageError> {
        self.trip(OpKind::F, chunk)?;
        self.inner.forward(chunk, input_)
    }

    fn backward_input(
        &mut self,
        chunk: Chunk,
        grad_output: Option<f64>,
    ) -> Result<Option<f64>, StageError> {
        self.trip(OpKind::I, chunk)?;
        self.inner.backward_input(chunk, grad_output)
    }

    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), StageError> {
        self.trip(OpKind::W, chunk)?;
        self.inner.backward_weight(chunk)
    }
}

/// Faulty stages for `schedule`: the stage at (dir, stage) of `at` misbehaves.
pub fn faulty_ranks(
    schedule: &Schedule,
    at: (OpKind, Chunk),
    fault: Fault,
) -> Vec<RankStages<Faulty>> {
    let stages = schedule.placement.stages();
    build_ranks(&schedule.placement, |_, dir, stage| Faulty {
        inner: AffineStage::new(stage, stages),
        at: (dir == at.1.dir && stage == at.1.stage).then_some(at),
        fault,
    })
}

fn schedule(
    kind: ScheduleKind,
    placement: StagePlacement,
    micro_batches: usize,
    programs: Vec<Vec<Op>>,
) -> Schedule {
    lower(&Schedule {
        kind,
        ranks: placement.ranks,
        micro_batches,
        virtual_stages: 1,
        placement,
        programs,
    })
}

/// GPipe over `ranks` ranks (one stage each): all forwards, then all backwards.
pub fn gpipe(ranks: usize, micro_batches: usize) -> Schedule {
    let placement = StagePlacement {
        ranks,
        rank_of: vec![(0..ranks).collect()],
    };
    let programs = (0..ranks)
        .map(|r| {
            let mut p: Vec<Op> = (0..micro_batches)
                .map(|m| Op::F(Chunk::new(0, r, m)))
                .collect();
            p.extend((0..micro_batches).map(|m| Op::B(Chunk::new(0, r, m))));
            p
        })
        .collect();
    schedule(ScheduleKind::GPipe, placement, micro_batches, programs)
}

/// 1F1B with the backward split into `I` and a deferred `W` (weight gradients at the end).
pub fn one_f_one_b_split(ranks: usize, micro_batches: usize) -> Schedule {
    let placement = StagePlacement {
        ranks,
        rank_of: vec![(0..ranks).collect()],
    };
    let programs = (0..ranks)
        .map(|r| {
            let c = |m| Chunk::new(0, r, m);
            let warmup = (ranks - r - 1).min(micro_batches);
            let mut p: Vec<Op> = (0..warmup).map(|m| Op::F(c(m))).collect();
            let mut next_b = 0;
            for m in warmup..micro_batches {
                p.push(Op::F(c(m)));
                p.push(Op::I(c(next_b)));
                next_b += 1;
            }
            while next_b < micro_batches {
                p.push(Op::I(c(next_b)));
                next_b += 1;
            }
            p.extend((0..micro_batches).map(|m| Op::W(c(m))));
            p
        })
        .collect();
    schedule(ScheduleKind::Zb1p, placement, micro_batches, programs)
}

/// Two directions over the same ranks (DualPipe's placement: rank r runs stage r of direction
/// 0 and stage ranks-1-r of direction 1), GPipe-like order per rank.
pub fn bidirectional(ranks: usize, micro_batches: usize) -> Schedule {
    let placement = StagePlacement {
        ranks,
        rank_of: vec![(0..ranks).collect(), (0..ranks).rev().collect()],
    };
    let per_dir = micro_batches / 2;
    let programs = (0..ranks)
        .map(|r| {
            let s1 = ranks - 1 - r;
            let mut p = Vec::new();
            for m in 0..per_dir {
                p.push(Op::F(Chunk::new(0, r, m)));
                p.push(Op::F(Chunk::new(1, s1, m)));
            }
            for m in 0..per_dir {
                p.push(Op::B(Chunk::new(0, r, m)));
                p.push(Op::B(Chunk::new(1, s1, m)));
            }
            p
        })
        .collect();
    schedule(ScheduleKind::DualPipe, placement, micro_batches, programs)
}

/// One pipeline of 2 x ranks stages folded in a V (DualPipeV's placement): the bottom of the
/// V (stages ranks-1 and ranks on the last rank) hands over locally.
pub fn v_shape(ranks: usize, micro_batches: usize) -> Schedule {
    let stages = 2 * ranks;
    let rank_of = (0..stages)
        .map(|s| if s < ranks { s } else { stages - 1 - s })
        .collect();
    let placement = StagePlacement {
        ranks,
        rank_of: vec![rank_of],
    };
    let programs = (0..ranks)
        .map(|r| {
            let (down, up) = (r, stages - 1 - r);
            let mut p: Vec<Op> = Vec::new();
            p.extend((0..micro_batches).map(|m| Op::F(Chunk::new(0, down, m))));
            p.extend((0..micro_batches).map(|m| Op::F(Chunk::new(0, up, m))));
            p.extend((0..micro_batches).map(|m| Op::I(Chunk::new(0, up, m))));
            p.extend((0..micro_batches).map(|m| Op::B(Chunk::new(0, down, m))));
            p.extend((0..micro_batches).map(|m| Op::W(Chunk::new(0, up, m))));
            p
        })
        .collect();
    schedule(ScheduleKind::DualPipeV, placement, micro_batches, programs)
}

/// A golden DualPipe / DualPipeV program from testdata/golden (a test oracle input).
pub fn golden(name: &str) -> Schedule {
    let path = format!(
        "{}/../../testdata/golden/dualpipe/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ranks = v["ranks"].as_u64().unwrap() as usize;
    let micro_batches = v["micro_batches"].as_u64().unwrap() as usize;
    let v_shape = v["schedule"] == "dualpipev";
    let chunk = |o: &serde_json::Value| {
        Chunk::new(
            o["dir"].as_u64().unwrap_or(0) as usize,
            o["stage"].as_u64().unwrap() as usize,
            o["mb"].as_u64().unwrap() as usize,
        )
    };
    let programs = v["programs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p.as_array()
                .unwrap()
                .iter()
                .map(|o| {
                    let peer = || o["peer"].as_u64().unwrap() as usize;
                    match o["op"].as_str().unwrap() {
                        "F" => Op::F(chunk(o)),
                        "B" => Op::B(chunk(o)),
                        "I" => Op::I(chunk(o)),
                        "W" => Op::W(chunk(o)),
                        "FB" => Op::FB {
                            f: chunk(&o["f"]),
                            b: chunk(&o["b"]),
                        },
                        "SEND_F" => Op::SendF {
                            chunk: chunk(o),
                            peer: peer(),
                        },
                        "RECV_F" => Op::RecvF {
                            chunk: chunk(o),
                            peer: peer(),
                        },
                        "SEND_B" => Op::SendB {
                            chunk: chunk(o),
                            peer: peer(),
                        },
                        "RECV_B" => Op::RecvB {
                            chunk: chunk(o),
                            peer: peer(),
                        },
                        "WAIT" => Op::Wait,
                        other => panic!("unknown op {other}"),
                    }
                })
                .collect()
        })
        .collect();
    let placement = if v_shape {
        let stages = 2 * ranks;
        StagePlacement {
            ranks,
            rank_of: vec![(0..stages)
                .map(|s| if s < ranks { s } else { stages - 1 - s })
                .collect()],
        }
    } else {
        StagePlacement {
            ranks,
            rank_of: vec![(0..ranks).collect(), (0..ranks).rev().collect()],
        }
    };
    Schedule {
        kind: if v_shape {
            ScheduleKind::DualPipeV
        } else {
            ScheduleKind::DualPipe
        },
        ranks,
        micro_batches,
        virtual_stages: 1,
        placement,
        programs,
    }
}
