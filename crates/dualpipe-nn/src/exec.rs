//! Runs a schedule's compute ops over the trainer's stage copies.
//!
//! Until the runtime's executor is wired in, this is a single-thread interpreter: it walks the
//! ranks' programs round-robin, runs each rank's next compute op as soon as its input is
//! there (activations of the previous stage, gradients of the next), routes outputs by the
//! placement and ignores communication ops.

use std::collections::HashMap;

use candle_core::Tensor;
use dualpipe_runtime::{ForwardInput, ForwardOutput, Stage};
use dualpipe_schedule::{Chunk, Op, Schedule};
use dualpipe_sim::Timeline;

use crate::error::NnError;
use crate::stage::MlpStage;

/// What running one step produced.
pub(crate) struct Outcome {
    /// Loss of every global micro-batch.
    pub losses: Vec<f64>,
    /// The measured timeline, if the executor records one.
    pub timeline: Option<Timeline>,
}

/// Runs one step of `schedule` over `stages[rank]`.
pub(crate) fn run(schedule: &Schedule, stages: &mut [Vec<MlpStage>]) -> Result<Outcome, NnError> {
    run_sequential(schedule, stages)
}

fn stage_for(
    stages: &mut [Vec<MlpStage>],
    rank: usize,
    chunk: Chunk,
) -> Result<&mut MlpStage, NnError> {
    stages[rank]
        .iter_mut()
        .find(|s| s.dir() == chunk.dir && s.model_stage() == chunk.stage)
        .ok_or_else(|| NnError::Execution(format!("rank {rank} holds no stage for {chunk}")))
}

struct Interp<'s> {
    schedule: &'s Schedule,
    stages_per_dir: usize,
    activations: HashMap<Chunk, Tensor>,
    grads: HashMap<Chunk, Tensor>,
    losses: Vec<Option<f64>>,
}

impl Interp<'_> {
    fn forward_ready(&self, c: Chunk) -> bool {
        c.stage == 0 || self.activations.contains_key(&c)
    }

    fn backward_ready(&self, c: Chunk) -> bool {
        c.stage + 1 == self.stages_per_dir || self.grads.contains_key(&c)
    }

    fn ready(&self, op: &Op) -> bool {
        match *op {
            Op::F(c) => self.forward_ready(c),
            Op::B(c) | Op::I(c) => self.backward_ready(c),
            Op::FB { f, b } => self.forward_ready(f) && self.backward_ready(b),
            _ => true,
        }
    }

    fn forward(
        &mut self,
        stages: &mut [Vec<MlpStage>],
        rank: usize,
        c: Chunk,
    ) -> Result<(), NnError> {
        let input = if c.stage == 0 {
            ForwardInput::MicroBatch {
                global_mb: self.schedule.global_mb(c),
            }
        } else {
            ForwardInput::Activation(self.activations.remove(&c).expect("checked ready"))
        };
        match stage_for(stages, rank, c)?.forward(c, input)? {
            ForwardOutput::Activation(t) => {
                self.activations
                    .insert(Chunk::new(c.dir, c.stage + 1, c.mb), t);
            }
            ForwardOutput::Loss(l) => {
                let slot = self
                    .losses
                    .get_mut(self.schedule.global_mb(c))
                    .ok_or_else(|| NnError::Execution(format!("{c} is outside the step")))?;
                *slot = Some(l);
            }
        }
        Ok(())
    }

    fn backward(
        &mut self,
        stages: &mut [Vec<MlpStage>],
        rank: usize,
        c: Chunk,
        weight_too: bool,
    ) -> Result<(), NnError> {
        let grad = self.grads.remove(&c);
        let stage = stage_for(stages, rank, c)?;
        let out = stage.backward_input(c, grad)?;
        if weight_too {
            stage.backward_weight(c)?;
        }
        if let Some(g) = out {
            self.grads.insert(Chunk::new(c.dir, c.stage - 1, c.mb), g);
        }
        Ok(())
    }
}

fn run_sequential(schedule: &Schedule, stages: &mut [Vec<MlpStage>]) -> Result<Outcome, NnError> {
    let mut it = Interp {
        schedule,
        stages_per_dir: schedule.placement.stages(),
        activations: HashMap::new(),
        grads: HashMap::new(),
        losses: vec![None; schedule.micro_batches],
    };
    let mut pc = vec![0usize; schedule.ranks];
    loop {
        let mut progress = false;
        for (rank, pc) in pc.iter_mut().enumerate() {
            while let Some(op) = schedule.programs[rank].get(*pc) {
                if !it.ready(op) {
                    break;
                }
                match *op {
                    Op::F(c) => it.forward(stages, rank, c)?,
                    Op::B(c) => it.backward(stages, rank, c, true)?,
                    Op::I(c) => it.backward(stages, rank, c, false)?,
                    Op::W(c) => stage_for(stages, rank, c)?.backward_weight(c)?,
                    Op::FB { f, b } => {
                        it.forward(stages, rank, f)?;
                        it.backward(stages, rank, b, true)?;
                    }
                    _ => {}
                }
                *pc += 1;
                progress = true;
            }
        }
        let done = (0..schedule.ranks).all(|r| pc[r] == schedule.programs[r].len());
        if done {
            break;
        }
        if !progress {
            let stuck: Vec<String> = (0..schedule.ranks)
                .filter_map(|r| {
                    schedule.programs[r]
                        .get(pc[r])
                        .map(|op| format!("rank {r} at {op}"))
                })
                .collect();
            return Err(NnError::Execution(format!(
                "the schedule deadlocked: {}",
                stuck.join(", ")
            )));
        }
    }
    let losses = it
        .losses
        .iter()
        .enumerate()
        .map(|(mb, l)| {
            l.ok_or_else(|| NnError::Execution(format!("micro-batch {mb} never reached the loss")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Outcome {
        losses,
        timeline: None,
    })
}
