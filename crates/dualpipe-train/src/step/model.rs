//! The trainer's whole-model work beside the step: gradient clipping, the GPT's weights
//! gathered from every rank, validation and samples, and who reports.

use dualpipe_nn::gpt::GptWeights;

use super::Trainer;
use crate::error::TrainError;
use crate::model::{Evaluation, Sample};
use crate::step::collective;
use crate::step::driver::Driver;

impl<D: Driver> Trainer<D> {
    /// With [`TrainConfig::clip_grad`]: the step's global gradient norm (the same on every
    /// process), and every gradient scaled by `clip / (norm + 1e-6)` when that is below 1.
    pub(crate) fn clip_gradients(&mut self, step: usize) -> Result<Option<f64>, TrainError> {
        let Some(clip) = self.config.optimizer.clip_grad else {
            return Ok(None);
        };
        let norm = self.gradient_norm(step)?;
        let scale = clip / (norm + 1e-6);
        if scale < 1.0 {
            let scaled = collective::scale_gradients(&mut self.stages, scale);
            self.own(step, scaled)?;
        }
        Ok(Some(norm))
    }

    /// Under f16 loss scaling: the step's scaled gradients' global norm decides (the same on
    /// every process) whether the step is taken; if so every gradient is divided by the scale
    /// (so clipping and the optimizer see the true gradients), if not (an overflow) the
    /// optimizer step is skipped and the scale halved. Without loss scaling: `true`.
    pub(crate) fn unscale_gradients(&mut self, step: usize) -> Result<bool, TrainError> {
        let Some(mut loss_scale) = self.loss_scale else {
            return Ok(true);
        };
        let norm = self.gradient_norm(step)?;
        let scale = loss_scale.scale;
        let applied = loss_scale.update(norm);
        self.loss_scale = Some(loss_scale);
        if applied {
            let unscaled = collective::scale_gradients(&mut self.stages, 1.0 / scale);
            self.own(step, unscaled)?;
        }
        Ok(applied)
    }

    /// Sets the loss scale of every held stage (the last stages multiply their loss gradient
    /// by it).
    pub(crate) fn scale_losses(&mut self, scale: f64) -> Result<(), TrainError> {
        for (_, stage) in self.stages.iter_mut().flat_map(|r| r.iter_mut()) {
            stage.set_loss_scale(scale)?;
        }
        Ok(())
    }

    /// The f16 loss scale and its history (`None` in every other dtype).
    pub fn loss_scale(&self) -> Option<crate::step::loss_scale::LossScale> {
        self.loss_scale
    }

    /// Sets the f16 loss scale and its history (for example a larger first scale than
    /// [`crate::step::loss_scale::INITIAL_SCALE`]); an error in every other dtype.
    pub fn set_loss_scale(
        &mut self,
        state: crate::step::loss_scale::LossScale,
    ) -> Result<(), TrainError> {
        if self.loss_scale.is_none() {
            return Err(TrainError::Config(format!(
                "`dtype` {} has no loss scale; only f16 scales its loss",
                self.config.model.dtype
            )));
        }
        self.loss_scale = Some(state);
        Ok(())
    }

    /// Steps the optimizers have taken (fewer than the steps done when f16 loss scaling
    /// skipped some).
    pub(crate) fn optimizer_steps(&self) -> u64 {
        self.optimizers
            .iter()
            .flatten()
            .next()
            .map_or(self.steps_done as u64, |o| o.steps())
    }

    /// The step's global gradient norm over every stage (the same on every process): a
    /// collective call.
    fn gradient_norm(&mut self, step: usize) -> Result<f64, TrainError> {
        // The squares of what the stages hold only a share of (the routed experts of an
        // expert-parallel group), from the parallelisms that shard.
        let mut sharded = 0.0;
        self.each_parallelism(|p, t| {
            if let Some(squares) = p.sharded_squares(t, step)? {
                sharded += squares;
            }
            Ok(())
        })?;
        collective::gradient_norm(
            &mut self.driver,
            &self.stages,
            self.config.model_stages(),
            step,
            &self.exec_options,
            sharded,
        )
    }

    /// The GPT's weights now (`None` for the MLP), on every process: a collective call that
    /// every process of a run makes after the same step (and, with expert parallelism, every
    /// replica of the group: each stores only its experts).
    pub fn weights(&mut self) -> Result<Option<&GptWeights>, TrainError> {
        let Some(gpt) = self.workload.gpt() else {
            return Ok(None);
        };
        let done = self.steps_done;
        if self.gathered.as_ref().map(|(s, _)| *s) != Some(done) {
            // The routed experts of the held blocks first (each worker stores only its own),
            // then everything over the pipeline's ranks.
            let mut template = gpt.weights.clone();
            let sharded = self.sharded_experts();
            self.each_parallelism(|p, view| p.gather_shards(view, &mut template))?;
            let weights = collective::gather_weights(
                &mut self.driver,
                &self.stages,
                &template,
                sharded,
                done,
                &self.exec_options,
            )?;
            self.gathered = Some((done, weights));
        }
        Ok(self.gathered.as_ref().map(|(_, w)| w))
    }

    /// Validates the GPT on the held-out text (and problems) after the steps run so far; a
    /// collective call ([`Trainer::weights`]). `None` for the MLP and on processes that do
    /// not report.
    pub fn evaluate(&mut self) -> Result<Option<Evaluation>, TrainError> {
        let done = self.steps_done;
        let reports = self.reports();
        let Some(weights) = self.weights()? else {
            return Ok(None);
        };
        let weights = weights.clone();
        match self.workload.gpt() {
            Some(gpt) if reports => Ok(Some(gpt.evaluate(&weights, done)?)),
            _ => Ok(None),
        }
    }

    /// A few continuations by the GPT as it is now (empty for the MLP and on processes
    /// that do not report); a collective call ([`Trainer::weights`]).
    pub fn samples(&mut self) -> Result<Vec<Sample>, TrainError> {
        let reports = self.reports();
        let Some(weights) = self.weights()? else {
            return Ok(Vec::new());
        };
        let weights = weights.clone();
        match self.workload.gpt() {
            Some(gpt) if reports => gpt.samples(&weights, self.config.seed),
            _ => Ok(Vec::new()),
        }
    }

    /// Whether this process reports the run: the driver's say, and replica 0 only of a
    /// data-parallel run.
    pub fn reports(&self) -> bool {
        self.driver.reports() && self.replica_index() == 0
    }

    /// This trainer's data-parallel replica (0 for a single replica).
    pub fn replica_index(&self) -> usize {
        self.replica
    }

    /// Whether a validation is due after step `step` (0-based) of the run.
    pub(crate) fn evaluation_due(&self, step: usize) -> bool {
        let every = self.config.data.eval_every;
        self.workload.gpt().is_some()
            && (step + 1 == self.config.steps || (every > 0 && (step + 1).is_multiple_of(every)))
    }
}
