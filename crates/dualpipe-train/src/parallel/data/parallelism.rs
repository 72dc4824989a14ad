//! Data parallelism as a [`Parallelism`] of the step: this replica's end of the gradient
//! exchange ([`ReplicaExchange`]) starts its buckets from the pipeline's hook, averages the
//! gradients over the replicas after the backward and gathers every replica's losses; after
//! the run it sums the exchange's figures over every worker; checkpoints keep its error
//! feedback.

use dualpipe_dp::ErrorFeedbackState;
use dualpipe_nn::ModelStage;
use dualpipe_runtime::StepHook;

use crate::checkpoint::format::feedback_name;
use crate::checkpoint::trainer::holds_writer_of;
use crate::checkpoint::{Checkpoint, HostTensor, Restored};
use crate::error::TrainError;
use crate::parallel::data::ReplicaExchange;
use crate::step::collective::gather_f64s;
use crate::step::driver::{Driver, Round};
use crate::step::{Parallelism, StageRead, StepState, StepView, Trainer};
use crate::summary::RunSummary;

impl<D: Driver> Parallelism<D> for ReplicaExchange {
    /// The exchange's hook starts each stage's buckets during the pipeline (with overlap).
    fn pipeline_hook(&self, step: usize) -> Option<Box<dyn StepHook<ModelStage>>> {
        Some(Box::new(self.hook(step)))
    }

    fn sums_copies(&self) -> bool {
        ReplicaExchange::sums_copies(self)
    }

    fn after_backward(
        &mut self,
        t: &mut StepView<'_, D>,
        state: &mut StepState,
    ) -> Result<(), TrainError> {
        let step = state.step;
        let folded = fold_momentum(t);
        t.own(step, folded)?;
        let exchanged = self
            .exchange(step, t.stages)
            .and_then(|cost| Ok((cost, self.gather_losses(step, &state.losses)?)));
        let (cost, all) = t.own(step, exchanged)?;
        (state.exchange, state.losses) = (Some(cost), all);
        Ok(())
    }

    /// The gradient exchange's figures over every worker of the run, the same on every
    /// process (a collective call after the last step): bytes sent, bytes uncompressed, and
    /// the mean of the processes' exchange shares of `seconds`.
    fn end_run(
        &mut self,
        t: &mut StepView<'_, D>,
        seconds: f64,
        summary: &mut RunSummary,
    ) -> Result<(), TrainError> {
        let totals = self.totals();
        let mine = [
            totals.grad_bytes_sent as f64,
            totals.grad_bytes_uncompressed as f64,
            self.seconds() / seconds.max(1e-9),
            1.0,
        ];
        let done = t.steps_done;
        let parts = gather_f64s(
            t.driver,
            done,
            Round::ExchangeTotals,
            &mine,
            t.exec_options,
            "the exchange's figures",
        )?;
        let mut pipeline = [0.0; 4];
        for values in parts {
            for (acc, v) in pipeline.iter_mut().zip(values) {
                *acc += v;
            }
        }
        let [sent, uncompressed, overhead, workers] = self.sum_over_replicas(done, pipeline)?;
        summary.grad_exchange = Some(self.method().to_string());
        summary.grad_exchange_started = Some(self.started().to_string());
        summary.grad_bytes_sent = sent as u64;
        summary.grad_bytes_uncompressed = uncompressed as u64;
        summary.communication_overhead = overhead / workers.max(1.0);
        Ok(())
    }

    /// Every replica's error-feedback buffers of the stages whose saved copy it holds.
    fn checkpoint_tensors(
        &self,
        t: &StageRead<'_>,
        tensors: &mut Vec<HostTensor>,
    ) -> Result<(), TrainError> {
        for (s, fb) in self.error_feedback() {
            if !holds_writer_of(t, s) {
                continue;
            }
            for (server, buffers) in [(false, &fb.worker), (true, &fb.server)] {
                for (b, values) in buffers.iter().enumerate() {
                    if !values.is_empty() {
                        let name = feedback_name(s, t.replica, b, server);
                        tensors.push(HostTensor::from_f64s(name, values));
                    }
                }
            }
        }
        Ok(())
    }

    /// Restores the error feedback when the grid is the checkpoint's, and carries it over
    /// ([`ErrorFeedbackState::regroup`]) when only the data-parallel degree changed (the
    /// same model stages, buckets and compression).
    fn restore_state(
        &mut self,
        t: &mut StepView<'_, D>,
        ckpt: &Checkpoint,
        restored: &mut Restored,
    ) -> Result<(), TrainError> {
        let held = ckpt.tensors.keys().any(|k| k.starts_with("feedback."));
        restored.feedback_dropped = false;
        if !held {
            return Ok(());
        }
        let saved = &ckpt.state.config;
        let same_buckets = saved.model_stages() == t.config.model_stages()
            && saved.parallelism.bucket_mb.to_bits() == t.config.parallelism.bucket_mb.to_bits()
            && saved.parallelism.gradient_compression == t.config.parallelism.gradient_compression
            && saved.parallelism.error_feedback == t.config.parallelism.error_feedback;
        if !same_buckets {
            restored.feedback_dropped = true;
            return Ok(());
        }
        let (old_replicas, replicas) = (
            saved.parallelism.data_parallel,
            t.config.parallelism.data_parallel,
        );
        let replica = t.replica;
        let side = |s: usize, r: usize, server: bool, count: usize| -> Vec<Vec<f64>> {
            (0..count)
                .map(|b| {
                    ckpt.tensors
                        .get(&feedback_name(s, r, b, server))
                        .map(HostTensor::to_f64s)
                        .unwrap_or_default()
                })
                .collect()
        };
        let saved_state = |s: usize, r: usize, buckets: usize| ErrorFeedbackState {
            worker: side(s, r, false, buckets),
            server: side(s, r, true, buckets),
        };
        for (s, current) in self.error_feedback() {
            let buckets = current.worker.len();
            let state = if old_replicas == replicas {
                saved_state(s, replica, buckets)
            } else {
                let Some(layout) = self.feedback_layout(s) else {
                    continue;
                };
                let olds: Vec<_> = (0..old_replicas)
                    .map(|r| saved_state(s, r, buckets))
                    .collect();
                ErrorFeedbackState::regroup(&olds, &layout, replica, replicas).map_err(|e| {
                    crate::checkpoint::trainer::mismatch(
                        ckpt,
                        format!("its error feedback of model stage {s} does not fit: {e}"),
                    )
                })?
            };
            self.set_error_feedback(s, &state)?;
        }
        restored.feedback_restored = true;
        restored.feedback_regrouped_from = (old_replicas != replicas).then_some(old_replicas);
        Ok(())
    }
}

/// 1-bit Adam's compression phase: each copy's gradients become its optimizer's next
/// momentum, the value the replicas then average (a no-op in every other step). The sharded
/// experts of an expert-parallel block keep their gradient: it is summed exactly among their
/// holders, not compressed, and they stay plain AdamW.
fn fold_momentum<D: Driver>(t: &mut StepView<'_, D>) -> Result<(), TrainError> {
    for (stage, opt) in t.copies_mut() {
        let plain = stage.sharded_params();
        opt.fold_momentum(&mut stage.params_mut(), &plain)?;
    }
    Ok(())
}

impl<D: Driver> Trainer<D> {
    /// This replica's end of the gradient exchange (`None`: a single replica).
    pub fn exchange(&self) -> Option<&ReplicaExchange> {
        self.parallelism::<ReplicaExchange>()
    }
}
