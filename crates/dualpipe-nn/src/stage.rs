//! [`MlpStage`]: a slice of the MLP model that implements the runtime's [`Stage`](dualpipe_runtime::Stage).

use std::collections::HashMap;

use candle_core::{DType, Tensor};
use dualpipe_runtime::{ForwardInput, ForwardOutput};
use dualpipe_schedule::Chunk;

use crate::data::Batch;
use crate::error::{NnError, TensorContext};
use crate::layers::{mse_grad, mse_loss, MlpBlock, Param};
use crate::model_stage::ModelStage;
/// Where a stage copy sits: defined with the stage API, re-exported here (its old path).
pub use crate::model_stage::StagePosition;
use crate::plumbing::{self, ForwardStart};
use crate::rng::{self, Purpose};

/// The shape of the whole model and the seed its parameters are drawn from. The parameters of
/// model stage `s` depend only on (`seed`, `s`, `hidden`, `layers_per_stage`, `dtype`): never on
/// the schedule, the rank count or which direction runs the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// Seed of every random stream.
    pub seed: u64,
    /// Width of the activations between blocks (each block is `h → 4h → h`).
    pub hidden: usize,
    /// Residual MLP blocks per model stage.
    pub layers_per_stage: usize,
    /// Model stages along one direction's pipeline.
    pub stages: usize,
    /// Element type of parameters and activations (F32 or F64).
    pub dtype: DType,
}

impl ModelConfig {
    /// Scalars in one copy of one model stage: per block `h·4h + 4h + 4h·h + h`.
    pub fn parameters_per_stage(&self) -> usize {
        let h = self.hidden;
        self.layers_per_stage * (8 * h * h + 5 * h)
    }

    /// Scalars in the whole model (one copy of every stage).
    pub fn parameter_count(&self) -> usize {
        self.stages * self.parameters_per_stage()
    }
}

/// One copy of a model stage: `layers_per_stage` residual [`MlpBlock`]s.
///
/// The first stage of a direction loads its micro-batch from the step's [`Batch`] (see
/// [`MlpStage::set_batch`]); the last computes the MSE against the targets and returns
/// [`ForwardOutput::Loss`]. Activations and saved tensors are kept per [`Chunk`]; weight
/// gradients are computed in [`Stage::backward_weight`](dualpipe_runtime::Stage::backward_weight) only, and accumulate over the step.
#[derive(Debug)]
pub struct MlpStage {
    model: ModelConfig,
    position: StagePosition,
    blocks: Vec<MlpBlock>,
    batch: Option<Batch>,
    /// Last stage only: output and target of each chunk whose forward ran.
    loss_inputs: HashMap<Chunk, (Tensor, Tensor)>,
    /// What the loss gradient is multiplied by (1 but under f16 loss scaling).
    loss_scale: f64,
}

impl MlpStage {
    /// The copy of model stage `position.model_stage` serving direction `position.dir`, with
    /// parameters drawn from the stream (seed, stage).
    pub fn new(model: &ModelConfig, position: StagePosition) -> Result<Self, NnError> {
        if position.model_stage >= model.stages {
            return Err(NnError::Config(format!(
                "model stage {} does not exist: the model has {} stages",
                position.model_stage, model.stages
            )));
        }
        if position.micro_batches == 0 || position.micro_batches_per_dir == 0 {
            return Err(NnError::Config(
                "a step needs at least one micro-batch".into(),
            ));
        }
        let mut rng = rng::stream(
            model.seed,
            Purpose::StageParams,
            position.model_stage as u64,
            0,
        );
        let blocks = (0..model.layers_per_stage)
            .map(|_| MlpBlock::random(&mut rng, model.hidden, 1.0, model.dtype))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MlpStage {
            model: *model,
            position,
            blocks,
            batch: None,
            loss_inputs: HashMap::new(),
            loss_scale: 1.0,
        })
    }

    /// Computes the blocks in mixed precision with `half` (f32 weights; GEMMs and saved
    /// tensors in `half`), or in the weights' dtype with `None`. The MSE runs in f32.
    pub fn set_half(&mut self, half: Option<crate::Half>) -> Result<(), NnError> {
        self.blocks
            .iter_mut()
            .try_for_each(|block| block.set_half(half))
    }

    /// Where this copy sits.
    pub fn position(&self) -> StagePosition {
        self.position
    }

    /// The model stage index.
    pub fn model_stage(&self) -> usize {
        self.position.model_stage
    }

    /// The direction this copy serves.
    pub fn dir(&self) -> usize {
        self.position.dir
    }

    /// Whether this is the first stage of its direction (it loads inputs).
    pub fn is_first(&self) -> bool {
        self.position.model_stage == 0
    }

    /// Whether this is the last stage of its direction (it computes the loss).
    pub fn is_last(&self) -> bool {
        self.position.model_stage + 1 == self.model.stages
    }

    /// Gives the stage the step's data (first and last stages read it).
    pub fn set_batch(&mut self, batch: Batch) {
        self.batch = Some(batch);
    }

    /// Resets every accumulated gradient to zero (call before each step).
    pub fn zero_grad(&mut self) -> Result<(), NnError> {
        self.params_mut().into_iter().try_for_each(Param::zero_grad)
    }

    /// Parameters in a fixed order: block by block, each up weight, up bias, down weight,
    /// down bias.
    pub fn params(&self) -> Vec<&Param> {
        self.blocks.iter().flat_map(MlpBlock::params).collect()
    }

    /// The names of this stage's parameters, in the order of [`MlpStage::params`], by model
    /// layer: `blocks.{l}.up.weight`, `blocks.{l}.up.bias`, `blocks.{l}.down.weight`,
    /// `blocks.{l}.down.bias` with `l` the block's index in the whole model.
    pub fn param_names(&self) -> Vec<String> {
        let first = self.position.model_stage * self.model.layers_per_stage;
        (first..first + self.blocks.len())
            .flat_map(|l| {
                ["up.weight", "up.bias", "down.weight", "down.bias"]
                    .map(|p| format!("blocks.{l}.{p}"))
            })
            .collect()
    }

    /// Parameters mutably, in the order of [`MlpStage::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        self.blocks
            .iter_mut()
            .flat_map(MlpBlock::params_mut)
            .collect()
    }

    /// Parameter values, in the order of [`MlpStage::params`].
    pub fn parameter_values(&self) -> Vec<Tensor> {
        self.params().into_iter().map(|p| p.value.clone()).collect()
    }

    /// Replaces every accumulated gradient (same order and shapes as [`MlpStage::params`]).
    pub fn set_gradients(&mut self, grads: &[Tensor]) -> Result<(), NnError> {
        let mut params = self.params_mut();
        plumbing::check_grads(&params.iter().map(|p| &**p).collect::<Vec<_>>(), grads)?;
        for (p, g) in params.iter_mut().zip(grads) {
            p.grad = g.clone();
        }
        Ok(())
    }

    /// Saved tensors of chunks whose backward (input or weight) has not run yet; 0 after a
    /// complete step.
    pub fn pending(&self) -> usize {
        self.loss_inputs.len() + self.blocks.iter().map(MlpBlock::pending).sum::<usize>()
    }

    fn micro_batch(&self, chunk: Chunk) -> Result<&crate::data::MicroBatch, NnError> {
        plumbing::micro_batch(
            self.position,
            self.batch.as_deref().map(Vec::as_slice),
            chunk,
        )
    }

    fn forward_impl(
        &mut self,
        chunk: Chunk,
        input: ForwardInput<Tensor>,
    ) -> Result<ForwardOutput<Tensor>, NnError> {
        plumbing::check_chunk(self.position, chunk, "forward")?;
        let mut x = match plumbing::forward_start(self.position, self.is_first(), chunk, input)? {
            ForwardStart::MicroBatch => self.micro_batch(chunk)?.inputs.clone(),
            ForwardStart::Activation(x) => x,
        };
        for block in &mut self.blocks {
            x = block.forward(chunk, &x)?;
        }
        if self.is_last() {
            let target = self.micro_batch(chunk)?.targets.clone();
            let loss = mse_loss(&x, &target)?;
            self.loss_inputs.insert(chunk, (x, target));
            Ok(ForwardOutput::Loss(loss))
        } else {
            Ok(ForwardOutput::Activation(x))
        }
    }

    fn backward_input_impl(
        &mut self,
        chunk: Chunk,
        grad_output: Option<Tensor>,
    ) -> Result<Option<Tensor>, NnError> {
        plumbing::check_chunk(self.position, chunk, "backward_input")?;
        let mut g = match plumbing::backward_start(self.is_last(), chunk, grad_output)? {
            Some(g) => g,
            None => {
                let (y, t) = self.loss_inputs.remove(&chunk).ok_or_else(|| {
                    NnError::Stage(format!("backward_input of {chunk} before its forward"))
                })?;
                mse_grad(&y, &t, self.loss_scale / self.position.micro_batches as f64)?
            }
        };
        for block in self.blocks.iter_mut().rev() {
            g = block.backward_input(chunk, &g)?;
        }
        Ok(if self.is_first() { None } else { Some(g) })
    }

    fn backward_weight_impl(&mut self, chunk: Chunk) -> Result<(), NnError> {
        plumbing::check_chunk(self.position, chunk, "backward_weight")?;
        self.blocks
            .iter_mut()
            .try_for_each(|block| block.backward_weight(chunk))
    }
}

crate::plumbing::impl_param_stage!(MlpStage);

/// Converts a tensor to a flat f64 vector (for comparisons and reports).
pub fn to_f64_vec(t: &Tensor) -> Result<Vec<f64>, NnError> {
    t.flatten_all()
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec1::<f64>())
        .ctx("to_f64_vec")
}

crate::plumbing::impl_pipeline_stage!(MlpStage, Mlp, "an MLP", {
    fn set_loss_scale(&mut self, scale: f64) -> Result<(), NnError> {
        self.loss_scale = scale;
        Ok(())
    }
});

impl From<MlpStage> for ModelStage {
    fn from(stage: MlpStage) -> Self {
        ModelStage::new(stage)
    }
}
