//! The trainer's whole-model work beside the step: gradient clipping, the GPT's weights
//! gathered from every rank, validation and samples, and who reports.

use dualpipe_nn::gpt::GptWeights;

use super::experts::Experts;
use super::phase::find_mut;
use super::Trainer;
use crate::collective;
use crate::data_parallel::ReplicaExchange;
use crate::driver::Driver;
use crate::error::TrainError;
use crate::workload::{Evaluation, Sample};

impl<D: Driver> Trainer<D> {
    /// With [`TrainConfig::clip_grad`]: the step's global gradient norm (the same on every
    /// process), and every gradient scaled by `clip / (norm + 1e-6)` when that is below 1.
    pub(super) fn clip_gradients(&mut self, step: usize) -> Result<Option<f64>, TrainError> {
        let Some(clip) = self.config.optimizer.clip_grad else {
            return Ok(None);
        };
        // The squares of what the stages hold only a share of (the routed experts of an
        // expert-parallel group), from the parallelisms that shard.
        let mut sharded = 0.0;
        self.each_parallelism(|p, t| {
            if let Some(squares) = p.sharded_squares(t, step)? {
                sharded += squares;
            }
            Ok(())
        })?;
        let norm = collective::gradient_norm(
            &mut self.driver,
            &self.stages,
            self.config.model_stages(),
            step,
            &self.exec_options,
            sharded,
        )?;
        let scale = clip / (norm + 1e-6);
        if scale < 1.0 {
            let scaled = collective::scale_gradients(&mut self.stages, scale);
            self.own(step, scaled)?;
        }
        Ok(Some(norm))
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
            let sharded = self.config.model.moe.is_some_and(|m| m.expert_parallel)
                && self.expert_group().is_some();
            let experts = find_mut::<D, Experts>(&mut self.parallelisms);
            if let Some(group) = experts.and_then(|e| e.group.as_mut()) {
                group.gather_experts(done, &mut self.stages, &mut template)?;
            }
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

    /// This replica's end of the gradient exchange (`None`: a single replica).
    pub fn exchange(&self) -> Option<&ReplicaExchange> {
        self.parallelism::<ReplicaExchange>()
    }

    /// Whether a validation is due after step `step` (0-based) of the run.
    pub(super) fn evaluation_due(&self, step: usize) -> bool {
        let every = self.config.data.eval_every;
        self.workload.gpt().is_some()
            && (step + 1 == self.config.steps || (every > 0 && (step + 1).is_multiple_of(every)))
    }
}
