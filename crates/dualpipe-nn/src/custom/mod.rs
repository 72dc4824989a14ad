//! A user's model from layers: what a network needs to train under any schedule without
//! writing a [`PipelineStage`](crate::PipelineStage) by hand.
//!
//! - [`Layer`]: one layer with a split backward (forward, input gradient, deferred weight
//!   gradient), its parameters by name, and an inference forward;
//! - [`AutogradLayer`]: a layer from a function of candle tensors whose backward is candle's
//!   autograd (I runs the whole backward, W is empty);
//! - [`Loss`]: the last stage's loss ([`MeanSquaredError`], [`SoftmaxCrossEntropy`]);
//! - [`LayerStage`]: a pipeline stage made of consecutive layers of the model (the last stage
//!   adds the loss); its micro-batches are [`MicroBatch`](crate::data::MicroBatch)es (inputs
//!   and targets) in a [`StepBatch::Custom`](crate::StepBatch::Custom).

mod autograd;
mod stage;

use std::fmt;

use candle_core::{DType, Tensor};
use dualpipe_schedule::Chunk;

use crate::error::{NnError, TensorContext};
use crate::layers::{Linear, Param};

pub use autograd::{AutogradFn, AutogradLayer};
pub use stage::LayerStage;

/// One layer of a user's model, with the backward split as zero-bubble schedules want it.
///
/// Activations are kept per [`Chunk`] (one micro-batch at one stage) between a forward and
/// its backward; weight gradients accumulate into [`Param::grad`] over the step.
pub trait Layer: fmt::Debug + Send {
    /// The forward of `chunk`, keeping what its backward needs.
    fn forward(&mut self, chunk: Chunk, x: &Tensor) -> Result<Tensor, NnError>;

    /// The gradient of `chunk`'s input from its output's (the previous layer waits for it).
    fn backward_input(&mut self, chunk: Chunk, grad_output: &Tensor) -> Result<Tensor, NnError>;

    /// The deferred weight gradients of `chunk`. The default does nothing: for a layer whose
    /// `backward_input` computed them (see [`AutogradLayer`]).
    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), NnError> {
        let _ = chunk;
        Ok(())
    }

    /// The forward without keeping anything (evaluation, prediction).
    fn infer(&self, x: &Tensor) -> Result<Tensor, NnError>;

    /// The parameters in a fixed order.
    fn params(&self) -> Vec<&Param>;

    /// The parameters mutably, in the order of [`Layer::params`].
    fn params_mut(&mut self) -> Vec<&mut Param>;

    /// The parameters' names within the layer (e.g. `weight`, `bias`), in the order of
    /// [`Layer::params`]; a [`LayerStage`] names them `layers.{l}.{name}`.
    fn param_names(&self) -> Vec<String>;

    /// Tensors saved by chunks whose backward has not run yet.
    fn pending(&self) -> usize;
}

/// The built-in [`Linear`] (`y = x Wᵀ + b`) as a layer: I computes `dy W`, W the weight
/// gradients.
impl Layer for Linear {
    fn forward(&mut self, chunk: Chunk, x: &Tensor) -> Result<Tensor, NnError> {
        Linear::forward(self, chunk, x)
    }

    fn backward_input(&mut self, chunk: Chunk, grad_output: &Tensor) -> Result<Tensor, NnError> {
        Linear::backward_input(self, chunk, grad_output)
    }

    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), NnError> {
        Linear::backward_weight(self, chunk)
    }

    fn infer(&self, x: &Tensor) -> Result<Tensor, NnError> {
        self.apply(x)
    }

    fn params(&self) -> Vec<&Param> {
        Linear::params(self)
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        Linear::params_mut(self)
    }

    fn param_names(&self) -> Vec<String> {
        ["weight", "bias"]
            .into_iter()
            .take(Linear::params(self).len())
            .map(String::from)
            .collect()
    }

    fn pending(&self) -> usize {
        Linear::pending(self)
    }
}

/// The loss the last stage computes from its output and the micro-batch's targets.
pub trait Loss: fmt::Debug + Send + Sync {
    /// The micro-batch's loss (a mean over its rows) and the gradient of `scale · loss` with
    /// respect to `output`.
    fn loss(&self, output: &Tensor, target: &Tensor, scale: f64) -> Result<(f64, Tensor), NnError>;
}

/// `mean((y − t)²)` over every element.
#[derive(Clone, Copy, Debug, Default)]
pub struct MeanSquaredError;

impl Loss for MeanSquaredError {
    fn loss(&self, output: &Tensor, target: &Tensor, scale: f64) -> Result<(f64, Tensor), NnError> {
        Ok((
            crate::layers::mse_loss(output, target)?,
            crate::layers::mse_grad(output, target, scale)?,
        ))
    }
}

/// Softmax cross-entropy of logits `[rows, classes]` against class ids `[rows]` (a tensor of
/// any integer or float type holding whole numbers), averaged over the rows.
#[derive(Clone, Copy, Debug, Default)]
pub struct SoftmaxCrossEntropy;

impl Loss for SoftmaxCrossEntropy {
    fn loss(&self, output: &Tensor, target: &Tensor, scale: f64) -> Result<(f64, Tensor), NnError> {
        let labels = class_ids(target, output.dim(0).ctx("cross-entropy logits")?)?;
        crate::layers::cross_entropy(output, &labels, scale)
    }
}

/// The class ids of `target` (`rows` whole numbers).
fn class_ids(target: &Tensor, rows: usize) -> Result<Vec<u32>, NnError> {
    let ids = target
        .flatten_all()
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec1::<f64>())
        .ctx("cross-entropy targets")?;
    if ids.len() != rows {
        return Err(NnError::Stage(format!(
            "cross-entropy: {} targets for {rows} rows of logits",
            ids.len()
        )));
    }
    ids.into_iter()
        .map(|v| {
            if v >= 0.0 && v.fract() == 0.0 && v <= f64::from(u32::MAX) {
                Ok(v as u32)
            } else {
                Err(NnError::Stage(format!(
                    "cross-entropy: target {v} is not a class id"
                )))
            }
        })
        .collect()
}

/// Initial tensors of layer `layer` of a model: each `(name, shape)` uniform in
/// `±1/√(last dimension)` (PyTorch's default for a linear layer's fan-in), drawn in f64 from
/// the stream (`seed`, `layer`) and cast to `dtype`. Every copy of the layer a run builds
/// (DualPipe's two, each replica's) gets the same values, as it must.
pub fn seeded_params(
    seed: u64,
    layer: usize,
    shapes: &[(&str, &[usize])],
    dtype: DType,
) -> Result<Vec<(String, Tensor)>, NnError> {
    let mut rng = crate::rng::stream(seed, crate::rng::Purpose::StageParams, layer as u64, 0);
    shapes
        .iter()
        .map(|(name, shape)| {
            let fan_in = shape.last().copied().unwrap_or(1).max(1);
            let values = crate::rng::uniform(
                &mut rng,
                shape.iter().product(),
                1.0 / (fan_in as f64).sqrt(),
            );
            let t = Tensor::from_vec(values, *shape, &candle_core::Device::Cpu)
                .and_then(|t| t.to_dtype(dtype))
                .ctx("seeded_params")?;
            Ok((name.to_string(), t))
        })
        .collect()
}
