//! [`Trainer::run`]: the run loop (steps, the divergence check, evaluations, checkpoints,
//! re-balancing, the progress callback) and its closing collective calls.

use std::time::Instant;

use super::{StepEvent, Trainer};
use crate::error::{Divergence, TrainError};
use crate::step::driver::Driver;
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
        for p in &mut self.parallelisms {
            p.begin_run();
        }
        let first = self.steps_done;
        while self.steps_done < self.config.steps {
            let step = self.steps_done;
            let asked = match &self.stop {
                Some(request) => {
                    let mine = request.stops(step);
                    self.driver.agree_stop(step, mine, &self.exec_options)?
                }
                None => None,
            };
            if let Some(signal) = asked {
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
                self.each_parallelism(|p, t| p.after_step(t, &report))?;
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
        let mut summary = summary.finish(total, samples);
        let seconds = total.as_secs_f64();
        self.each_parallelism(|p, t| p.end_run(t, seconds, &mut summary))?;
        self.finish()?;
        Ok(summary)
    }

    /// Stops [`Trainer::run`] at the step boundary `request` fixes (with a final checkpoint
    /// when checkpoints are on and a step was done since the run started).
    pub fn set_stop(&mut self, request: crate::step::stop::StopRequest) {
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
