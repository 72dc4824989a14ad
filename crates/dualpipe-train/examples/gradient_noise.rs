//! Gradient noise, a feature added from outside the crate as a [`Parallelism`] of the step:
//! after the backward, every gradient gets noise drawn uniformly from `[-bound, bound)`, seeded
//! by (step, model stage, parameter) so that DualPipe's two copies of a stage stay equal.
//! `cargo run -p dualpipe-train --example gradient_noise`.

use candle_core::Tensor;
use dualpipe_nn::rng::{stream, uniform, Purpose};
use dualpipe_nn::NnError;
use dualpipe_train::{Driver, Parallelism, StepState, StepView, TrainConfig, TrainError, Trainer};

/// Noise of at most `bound` added to every gradient after the backward.
#[derive(Debug)]
pub struct GradientNoise {
    /// The noise's bound (0: no noise).
    pub bound: f64,
    /// The seed of the noise.
    pub seed: u64,
}

impl<D: Driver> Parallelism<D> for GradientNoise {
    fn after_backward(
        &mut self,
        view: &mut StepView<'_, D>,
        state: &mut StepState,
    ) -> Result<(), TrainError> {
        let (seed, step) = (self.seed, state.step as u64);
        for (stage, _optimizer) in view.copies_mut() {
            let key = (stage.model_stage() as u64) << 32;
            for (k, param) in stage.params_mut().into_iter().enumerate() {
                let mut rng = stream(seed, Purpose::Inputs, step, key | k as u64);
                let noise = uniform(&mut rng, param.grad.elem_count(), self.bound);
                let add = Tensor::from_vec(noise, param.grad.shape(), param.grad.device())
                    .and_then(|n| n.to_dtype(param.grad.dtype()))
                    .and_then(|n| &param.grad + n);
                param.grad = add.map_err(|e| NnError::tensor("gradient noise", e))?;
            }
        }
        Ok(())
    }
}

/// Trains `config` with gradient noise of at most `bound`; the losses of every step.
pub fn train_with_noise(config: TrainConfig, bound: f64) -> Result<Vec<f64>, TrainError> {
    let noise = GradientNoise { bound, seed: 7 };
    let mut trainer = Trainer::builder(config).parallelism(noise).build()?;
    Ok(trainer.run(|_| Ok(()))?.losses)
}

fn main() -> Result<(), TrainError> {
    let mut config = TrainConfig::MLP;
    config.steps = 5;
    for bound in [0.0, 0.05] {
        let losses = train_with_noise(config.clone(), bound)?;
        println!("noise {bound}: losses {losses:?}");
    }
    Ok(())
}
