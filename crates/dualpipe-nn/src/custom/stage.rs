//! [`LayerStage`]: a pipeline stage made of consecutive layers of a user's model.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::Tensor;
use dualpipe_runtime::{ForwardInput, ForwardOutput};
use dualpipe_schedule::Chunk;

use super::{Layer, Loss};
use crate::data::MicroBatch;
use crate::error::NnError;
use crate::layers::Param;
use crate::model_stage::{PipelineStage, StagePosition, StepBatch};
use crate::plumbing::{self, ForwardStart};

/// Consecutive layers of a model as one pipeline stage: the first stage of a direction reads
/// each micro-batch's inputs, the last applies the [`Loss`] to its output and the
/// micro-batch's targets (scaled by `1 / micro_batches`, so the step's loss is the mean).
///
/// The step's batch is a [`StepBatch::Custom`] of [`MicroBatch`]es (or a
/// [`StepBatch::Mlp`]); parameters are named `layers.{l}.{name}` with `l` the layer's index
/// in the whole model, so checkpoints do not depend on the partition.
#[derive(Debug)]
pub struct LayerStage {
    position: StagePosition,
    stages: usize,
    first_layer: usize,
    layers: Vec<Box<dyn Layer>>,
    loss: Arc<dyn Loss>,
    batch: Option<StepBatch>,
    /// Last stage only: output and targets of each chunk whose forward ran.
    loss_inputs: HashMap<Chunk, (Tensor, Tensor)>,
}

impl LayerStage {
    /// Model stage `position.model_stage` of `stages`, holding `layers`, the first of which
    /// is layer `first_layer` of the model.
    pub fn new(
        position: StagePosition,
        stages: usize,
        first_layer: usize,
        layers: Vec<Box<dyn Layer>>,
        loss: Arc<dyn Loss>,
    ) -> Result<Self, NnError> {
        if position.model_stage >= stages {
            return Err(NnError::Config(format!(
                "model stage {} does not exist: the model has {stages} stages",
                position.model_stage
            )));
        }
        if position.micro_batches == 0 || position.micro_batches_per_dir == 0 {
            return Err(NnError::Config(
                "a step needs at least one micro-batch".into(),
            ));
        }
        Ok(LayerStage {
            position,
            stages,
            first_layer,
            layers,
            loss,
            batch: None,
            loss_inputs: HashMap::new(),
        })
    }

    /// The stage's layers.
    pub fn layers(&self) -> &[Box<dyn Layer>] {
        &self.layers
    }

    /// The model-wide index of the stage's first layer.
    pub fn first_layer(&self) -> usize {
        self.first_layer
    }

    /// The stage's forward without keeping anything (its layers' [`Layer::infer`]).
    pub fn infer(&self, x: &Tensor) -> Result<Tensor, NnError> {
        let mut x = x.clone();
        for layer in &self.layers {
            x = layer.infer(&x)?;
        }
        Ok(x)
    }

    fn is_first(&self) -> bool {
        self.position.model_stage == 0
    }

    fn is_last(&self) -> bool {
        self.position.model_stage + 1 == self.stages
    }

    fn micro_batch(&self, chunk: Chunk) -> Result<&MicroBatch, NnError> {
        let all = match &self.batch {
            None => None,
            Some(StepBatch::Mlp(b)) => Some(b.as_slice()),
            Some(b) => Some(b.micro_batches::<MicroBatch>()?),
        };
        plumbing::micro_batch(self.position, all, chunk)
    }
}

impl PipelineStage for LayerStage {
    fn position(&self) -> StagePosition {
        self.position
    }

    fn set_batch(&mut self, batch: &StepBatch) -> Result<(), NnError> {
        if matches!(batch, StepBatch::Gpt(_)) {
            return Err(NnError::Stage(
                "a stage of layers was given the GPT batch".into(),
            ));
        }
        self.batch = Some(batch.clone());
        Ok(())
    }

    fn forward(
        &mut self,
        chunk: Chunk,
        input: ForwardInput<Tensor>,
    ) -> Result<ForwardOutput<Tensor>, NnError> {
        plumbing::check_chunk(self.position, chunk, "forward")?;
        let mut x = match plumbing::forward_start(self.position, self.is_first(), chunk, input)? {
            ForwardStart::MicroBatch => self.micro_batch(chunk)?.inputs.clone(),
            ForwardStart::Activation(x) => x,
        };
        for layer in &mut self.layers {
            x = layer.forward(chunk, &x)?;
        }
        if !self.is_last() {
            return Ok(ForwardOutput::Activation(x));
        }
        let target = self.micro_batch(chunk)?.targets.clone();
        let scale = 1.0 / self.position.micro_batches as f64;
        let (loss, grad) = self.loss.loss(&x, &target, scale)?;
        self.loss_inputs.insert(chunk, (grad, target));
        Ok(ForwardOutput::Loss(loss))
    }

    fn backward_input(
        &mut self,
        chunk: Chunk,
        grad_output: Option<Tensor>,
    ) -> Result<Option<Tensor>, NnError> {
        plumbing::check_chunk(self.position, chunk, "backward_input")?;
        let mut g = match plumbing::backward_start(self.is_last(), chunk, grad_output)? {
            Some(g) => g,
            None => {
                self.loss_inputs
                    .remove(&chunk)
                    .ok_or_else(|| {
                        NnError::Stage(format!("backward_input of {chunk} before its forward"))
                    })?
                    .0
            }
        };
        for layer in self.layers.iter_mut().rev() {
            g = layer.backward_input(chunk, &g)?;
        }
        Ok((!self.is_first()).then_some(g))
    }

    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), NnError> {
        plumbing::check_chunk(self.position, chunk, "backward_weight")?;
        self.layers
            .iter_mut()
            .try_for_each(|layer| layer.backward_weight(chunk))
    }

    fn params(&self) -> Vec<&Param> {
        self.layers.iter().flat_map(|l| l.params()).collect()
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        self.layers
            .iter_mut()
            .flat_map(|l| l.params_mut())
            .collect()
    }

    fn param_names(&self) -> Vec<String> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                let l_model = self.first_layer + i;
                l.param_names()
                    .into_iter()
                    .map(move |n| format!("layers.{l_model}.{n}"))
            })
            .collect()
    }

    fn pending(&self) -> usize {
        self.loss_inputs.len() + self.layers.iter().map(|l| l.pending()).sum::<usize>()
    }
}
