//! [`Trainer::run`]: the run loop (steps, the divergence check, evaluations, checkpoints,
//! re-balancing, the progress callback) and its closing collective calls.

use std::time::Instant;

use super::{StepEvent, Trainer, TOTALS_ROUND};
use crate::collective::gather_f64s;
use crate::driver::Driver;
use crate::error::{Divergence, TrainError};
use crate::summary::{RunSummary, SummaryBuilder};

impl<D: Driver> Trainer<D> {
    /// Runs the configuration's remaining steps, stopping at the first loss that is not a
    /// finite number ([`TrainError::Diverged`]); tells `on_step` before each step and after
    /// each finished one (an `Err(reason)` from it stops the run with
    /// [`TrainError::Stopped`], and the other ranks are told). Lines up with the other ranks
    /// at the end and returns the run's summary. Keeps per step only the figures the summary
    /// needs (no timeline but the last).
    pub fn run(
        &mut self,
        mut on_step: impl FnMut(StepEvent<'_>) -> Result<(), String>,
    ) -> Result<RunSummary, TrainError> {
        let mut summary = SummaryBuilder::new(&self.config, &self.schedule);
        let began = Instant::now();
        let mut rebalancer = None;
        let first = self.steps_done;
        while self.steps_done < self.config.steps {
            let step = self.steps_done;
            if let Some(signal) = self.stop.as_ref().and_then(|s| s.stops(step)) {
                if step > first {
                    self.save_final_checkpoint(step)?;
                }
                return Err(TrainError::Interrupted { step, signal });
            }
            if let Err(reason) = on_step(StepEvent::Starting { step }) {
                return Err(self.stop(reason));
            }
            let mut report = self.step()?;
            if !report.loss.is_finite() {
                return Err(TrainError::Diverged(Divergence {
                    step,
                    loss: report.loss,
                    lr: self.config.optimizer.lr,
                }));
            }
            if self.evaluation_due(step) {
                report.evaluation = self.evaluate()?;
            }
            self.save_due_checkpoint(step)?;
            if self.steps_done < self.config.steps {
                self.rebalance_after(&mut rebalancer, &report)?;
            }
            let elapsed = began.elapsed();
            if let Err(reason) = on_step(StepEvent::Finished {
                report: &report,
                elapsed,
            }) {
                return Err(self.stop(reason));
            }
            summary.add(report);
        }
        let total = began.elapsed();
        let samples = self.samples()?;
        let exchanged = self.exchange_totals(total.as_secs_f64())?;
        let rebalanced = self.rebalance_over_ranks()?;
        self.finish()?;
        let mut summary = summary.finish(total, samples);
        if let Some((rebalances, moved, scratch, bytes)) = rebalanced {
            summary.eplb_rebalances = Some(rebalances);
            summary.experts_moved = Some(moved);
            summary.experts_moved_from_scratch = Some(scratch);
            summary.expert_bytes_moved = Some(bytes);
        }
        if let Some([sent, uncompressed, overhead, workers]) = exchanged {
            summary.grad_exchange = self.dp.as_ref().map(|dp| dp.method().to_string());
            summary.grad_exchange_started = self.dp.as_ref().map(|dp| dp.started().to_string());
            summary.grad_bytes_sent = sent as u64;
            summary.grad_bytes_uncompressed = uncompressed as u64;
            summary.communication_overhead = overhead / workers.max(1.0);
        }
        Ok(summary)
    }

    /// The gradient exchange's figures over every worker of the run, the same on every
    /// process (a collective call after the last step): bytes sent, bytes uncompressed, the
    /// sum of the processes' exchange shares of `seconds`, and the number of processes.
    fn exchange_totals(&mut self, seconds: f64) -> Result<Option<[f64; 4]>, TrainError> {
        let Some(dp) = &self.dp else {
            return Ok(None);
        };
        let t = dp.totals();
        let mine = [
            t.grad_bytes_sent as f64,
            t.grad_bytes_uncompressed as f64,
            dp.seconds() / seconds.max(1e-9),
            1.0,
        ];
        let done = self.steps_done;
        let parts = gather_f64s(
            &mut self.driver,
            done,
            TOTALS_ROUND,
            &mine,
            &self.exec_options,
            "the exchange's figures",
        )?;
        let mut pipeline = [0.0; 4];
        for values in parts {
            for (acc, v) in pipeline.iter_mut().zip(values) {
                *acc += v;
            }
        }
        let Some(dp) = self.dp.as_mut() else {
            return Ok(None);
        };
        Ok(Some(dp.sum_over_replicas(done, pipeline)?))
    }

    /// Stops [`Trainer::run`] at the step boundary `request` fixes (with a final checkpoint
    /// when checkpoints are on and a step was done since the run started).
    pub fn set_stop(&mut self, request: crate::stop::StopRequest) {
        self.stop = Some(request);
    }

    /// Stops the run at the callback's request: the other ranks are told `reason` in its own
    /// words.
    fn stop(&mut self, reason: String) -> TrainError {
        self.fail(&reason);
        TrainError::Stopped(reason)
    }

    /// Lines up with the other ranks (if any) after the last step, so no process leaves while
    /// another may still need it. [`Trainer::run`] calls it.
    pub fn finish(&mut self) -> Result<(), TrainError> {
        self.driver.finish(self.steps_done, &self.exec_options)
    }

    /// Tells every other rank that this one failed with `message` (they stop with an error
    /// naming it) and marks the trainer failed.
    pub fn fail(&mut self, message: &str) {
        self.failed = true;
        self.driver.fail(message);
    }
}
