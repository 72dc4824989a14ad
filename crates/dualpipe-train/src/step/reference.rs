//! The sequential reference: the same model, run on one thread, all stages in order, one
//! micro-batch after the other — the oracle every pipeline schedule must match.

use candle_core::Tensor;
use dualpipe_nn::data::DataSet;
use dualpipe_nn::{MlpStage, NnError, Optimizer, StagePosition};
use dualpipe_runtime::{ForwardInput, ForwardOutput, Stage};
use dualpipe_schedule::Chunk;

use crate::config::TrainConfig;
use crate::error::TrainError;

/// What one reference step produced.
#[derive(Clone, Debug)]
pub struct ReferenceStep {
    /// Mean-squared error of every micro-batch.
    pub losses: Vec<f64>,
    /// Mean of `losses`.
    pub loss: f64,
    /// Gradients of every model stage (`[stage][param]`), before the optimizer step.
    pub gradients: Vec<Vec<Tensor>>,
}

/// The full model on one thread: one copy of every model stage and one optimizer each.
#[derive(Debug)]
pub struct Reference {
    micro_batches: usize,
    data: DataSet,
    stages: Vec<MlpStage>,
    optimizers: Vec<Optimizer>,
    steps_done: usize,
}

impl Reference {
    /// The model, data and optimizers of `config` (its schedule and ranks only decide the
    /// number of model stages, [`TrainConfig::model_stages`]).
    pub fn new(config: &TrainConfig) -> Result<Self, TrainError> {
        config.validate()?;
        let model = config.mlp();
        let data = DataSet::new(
            config.seed,
            config.model.hidden,
            config.schedule.micro_batch_size,
            model.dtype,
        )?;
        let stages = (0..model.stages)
            .map(|s| {
                MlpStage::new(
                    &model,
                    StagePosition {
                        dir: 0,
                        model_stage: s,
                        micro_batches: config.schedule.micro_batches,
                        micro_batches_per_dir: config.schedule.micro_batches,
                    },
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let optimizers = stages.iter().map(|_| config.new_optimizer()).collect();
        Ok(Reference {
            micro_batches: config.schedule.micro_batches,
            data,
            stages,
            optimizers,
            steps_done: 0,
        })
    }

    /// Runs one step: forward and full backward of every micro-batch through every stage, in
    /// order, then the optimizer.
    pub fn step(&mut self) -> Result<ReferenceStep, NnError> {
        let batch = self.data.batch(self.steps_done, self.micro_batches)?;
        for stage in &mut self.stages {
            stage.set_batch(batch.clone());
            stage.zero_grad()?;
        }
        let mut losses = Vec::with_capacity(self.micro_batches);
        for mb in 0..self.micro_batches {
            let mut input = ForwardInput::MicroBatch { global_mb: mb };
            for (s, stage) in self.stages.iter_mut().enumerate() {
                match stage.forward(Chunk::new(0, s, mb), input)? {
                    ForwardOutput::Activation(t) => input = ForwardInput::Activation(t),
                    ForwardOutput::Loss(l) => {
                        losses.push(l);
                        break;
                    }
                }
            }
            let mut grad = None;
            for (s, stage) in self.stages.iter_mut().enumerate().rev() {
                let chunk = Chunk::new(0, s, mb);
                grad = stage.backward_input(chunk, grad)?;
                stage.backward_weight(chunk)?;
            }
        }
        let gradients = self.gradients();
        for (stage, opt) in self.stages.iter_mut().zip(&mut self.optimizers) {
            opt.step(&mut stage.params_mut())?;
        }
        self.steps_done += 1;
        let loss = losses.iter().sum::<f64>() / losses.len() as f64;
        Ok(ReferenceStep {
            losses,
            loss,
            gradients,
        })
    }

    /// Parameter values of every model stage (`[stage][param]`).
    pub fn parameters(&self) -> Vec<Vec<Tensor>> {
        self.stages.iter().map(MlpStage::parameter_values).collect()
    }

    /// The gradients accumulated by the last step (`[stage][param]`).
    pub fn gradients(&self) -> Vec<Vec<Tensor>> {
        self.stages
            .iter()
            .map(|s| s.params().into_iter().map(|p| p.grad.clone()).collect())
            .collect()
    }

    /// The model's stages, in order (for inspection and gradient checks).
    pub fn stages(&self) -> &[MlpStage] {
        &self.stages
    }
}
