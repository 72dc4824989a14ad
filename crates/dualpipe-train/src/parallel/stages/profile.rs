//! `dualpipe train --profile FILE`: a short profiling run of the GPT that measures every
//! block's forward (`F`), input backward (`I`) and weight backward (`W`), the activations one
//! micro-batch keeps alive in it and the bytes it keeps for the step, in the cost profile
//! format `dualpipe plan --profile` reads ([`dualpipe_plan::Profile`]).
//!
//! The model of the configuration is cut into `blocks + 2` one-piece stages (the embeddings
//! alone, each block alone, the final norm and head alone) run one after another on this
//! thread with one micro-batch of the configuration's size (step 0's first micro-batch). Each
//! op is timed `repeats` times after one warm-up and the median kept; the embeddings' times
//! are added to the first block's and the head's to the last block's, so the profile lists
//! exactly the model's blocks. Times are of this machine's one core (speed 1 in a topology).

use crate::config::{ParallelismSection, ScheduleSection};
use std::time::Instant;

use dualpipe_nn::gpt::GptStage;
use dualpipe_nn::{Recompute, StagePosition, StepBatch};
use dualpipe_plan::{LayerCost, Profile, RecomputeCost};
use dualpipe_runtime::{ForwardInput, ForwardOutput, Stage};
use dualpipe_schedule::Chunk;

use dualpipe_nn::OptimizerKind;

use crate::config::{ModelKind, TrainConfig};
use crate::error::TrainError;
use crate::model::Workload;

/// The most timed repetitions of a profiling run.
pub const MAX_REPEATS: usize = 1000;

/// One piece's op times over the measured passes, and its saved bytes after the forward and
/// after the input backward (the same every pass).
#[derive(Clone, Default)]
struct Samples {
    f: Vec<f64>,
    i: Vec<f64>,
    w: Vec<f64>,
    saved_after_f: f64,
    saved_after_i: f64,
}

impl Samples {
    fn push(&mut self, p: Pass) {
        self.f.push(p.f);
        self.i.push(p.i);
        self.w.push(p.w);
        self.saved_after_f = p.saved_after_f;
        self.saved_after_i = p.saved_after_i;
    }
}

/// One piece's times and saved bytes in one pass.
struct Pass {
    f: f64,
    i: f64,
    w: f64,
    saved_after_f: f64,
    saved_after_i: f64,
}

/// One micro-batch forward through every piece, then the input and weight backward of each
/// from the last; the gradients zeroed after.
fn one_pass(stages: &mut [GptStage]) -> Result<Vec<Pass>, TrainError> {
    let fail =
        |e: dualpipe_runtime::StageError| TrainError::Execution(format!("profiling: {}", e.0));
    let mut passes = Vec::with_capacity(stages.len());
    let mut input = ForwardInput::MicroBatch { global_mb: 0 };
    for (s, stage) in stages.iter_mut().enumerate() {
        let c = Chunk::new(0, s, 0);
        let t = Instant::now();
        let out = stage.forward(c, input).map_err(fail)?;
        passes.push(Pass {
            f: t.elapsed().as_secs_f64(),
            i: 0.0,
            w: 0.0,
            saved_after_f: stage.saved_bytes() as f64,
            saved_after_i: 0.0,
        });
        input = match out {
            ForwardOutput::Activation(a) => ForwardInput::Activation(a),
            ForwardOutput::Loss(_) => ForwardInput::MicroBatch { global_mb: 0 },
        };
    }
    let mut grad = None;
    for (s, stage) in stages.iter_mut().enumerate().rev() {
        let c = Chunk::new(0, s, 0);
        let t = Instant::now();
        let g = stage.backward_input(c, grad.take()).map_err(fail)?;
        passes[s].i = t.elapsed().as_secs_f64();
        passes[s].saved_after_i = stage.saved_bytes() as f64;
        let t = Instant::now();
        stage.backward_weight(c).map_err(fail)?;
        passes[s].w = t.elapsed().as_secs_f64();
        grad = g;
    }
    for stage in stages.iter_mut() {
        stage.zero_grad()?;
    }
    Ok(passes)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Measures the GPT of `config` (see the module documentation): `repeats` timed passes
/// (1 to [`MAX_REPEATS`]) after one warm-up.
pub fn profile_gpt(config: &TrainConfig, repeats: usize) -> Result<Profile, TrainError> {
    if config.model.kind != ModelKind::Gpt {
        return Err(TrainError::Config(
            "a profile measures the GPT's blocks; drop `model` mlp".into(),
        ));
    }
    if !(1..=MAX_REPEATS).contains(&repeats) {
        return Err(TrainError::Config(format!(
            "profile repeats {repeats}: give 1 to {MAX_REPEATS}"
        )));
    }
    config.validate()?;
    let workload = Workload::new(config)?;
    let Some(gpt) = workload.gpt() else {
        return Err(TrainError::Config("a profile measures the GPT".into()));
    };
    let blocks = gpt.weights.config().layers;
    let pieces = blocks + 2;
    let one = TrainConfig {
        schedule: ScheduleSection {
            micro_batches: 1,
            ..config.schedule.clone()
        },
        parallelism: ParallelismSection {
            data_parallel: 1,
            ..config.parallelism.clone()
        },
        ..config.clone()
    };
    let StepBatch::Gpt(batch) = workload.batch(&one, 0)? else {
        return Err(TrainError::Config("a profile measures the GPT".into()));
    };
    let mut stages = (0..pieces)
        .map(|s| {
            let layers = match s {
                0 => 0..0,
                s if s == pieces - 1 => blocks..blocks,
                s => s - 1..s,
            };
            let position = StagePosition {
                dir: 0,
                model_stage: s,
                micro_batches: 1,
                micro_batches_per_dir: 1,
            };
            let mut stage = GptStage::with_layers(&gpt.weights, pieces, position, layers)?;
            stage.set_batch(batch.clone());
            Ok(stage)
        })
        .collect::<Result<Vec<_>, TrainError>>()?;
    let state_tensors = match config.optimizer.kind {
        OptimizerKind::Sgd { .. } => 1.0,
        OptimizerKind::AdamW { .. } => 2.0,
    };
    // Parameters, their gradients and the optimizer state are master-precision values.
    let value_bytes = config.model.dtype.master().size_in_bytes() as f64;
    for stage in &mut stages {
        crate::model::set_gpt_precision(config, stage)?;
    }
    // The same passes three times: saving everything (the times and bytes of the profile),
    // then recomputing fully and selectively (what each keeps, and selective's extra input
    // backward time: the forward seconds it reruns).
    let mut runs = Vec::with_capacity(3);
    for mode in [Recompute::None, Recompute::Full, Recompute::Selective] {
        for stage in &mut stages {
            stage.set_recompute(mode);
        }
        let mut run = vec![Samples::default(); pieces];
        for pass in 0..=repeats {
            let passed = one_pass(&mut stages)?;
            if pass > 0 {
                for (samples, p) in run.iter_mut().zip(passed) {
                    samples.push(p);
                }
            }
        }
        runs.push(run);
    }
    // Every piece as a layer of its own: the embeddings, each block, the head.
    let mut layers: Vec<LayerCost> = stages
        .iter()
        .enumerate()
        .map(|(s, stage)| {
            let values: usize = stage.params().iter().map(|p| p.value.elem_count()).sum();
            let [none, full, selective] = [&runs[0][s], &runs[1][s], &runs[2][s]];
            LayerCost {
                f: median(none.f.clone()),
                i: median(none.i.clone()),
                w: median(none.w.clone()),
                activation_bytes: none.saved_after_f,
                parameter_bytes: values as f64 * value_bytes * (2.0 + state_tensors),
                w_bytes: Some(none.saved_after_i),
                recompute: Some(RecomputeCost {
                    full_bytes: full.saved_after_f,
                    selective_bytes: selective.saved_after_f,
                    selective_f: (median(selective.i.clone()) - median(none.i.clone())).max(0.0),
                }),
            }
        })
        .collect();
    // The embeddings join the first block and the head the last; they always save what they
    // need (their sizes under recomputation are what they saved), and their selective rerun
    // time is left out: they rerun nothing.
    let head = layers.pop().expect("a head piece");
    let embeddings = layers.remove(0);
    for (edge, layer) in [(embeddings, 0), (head, blocks - 1)] {
        let l = &mut layers[layer];
        l.f += edge.f;
        l.i += edge.i;
        l.w += edge.w;
        l.activation_bytes += edge.activation_bytes;
        l.parameter_bytes += edge.parameter_bytes;
        l.w_bytes = Some(l.backward_bytes() + edge.backward_bytes());
        if let (Some(r), Some(e)) = (&mut l.recompute, edge.recompute) {
            r.full_bytes += e.full_bytes;
            r.selective_bytes += e.selective_bytes;
        }
    }
    let message_bytes = (config.schedule.micro_batch_size as u64)
        .saturating_mul(config.model.seq_len as u64)
        .saturating_mul(config.model.d_model as u64)
        .saturating_mul(config.model.dtype.size_in_bytes() as u64);
    // (the activations forwards; their gradients, of the same size, backwards)
    let profile = Profile {
        message_bytes,
        layers,
    };
    profile
        .check()
        .map_err(|e| TrainError::Execution(format!("profiling: {e}")))?;
    Ok(profile)
}
