//! What a step reports: [`StepReport`] (the figures of one step), [`StepEvent`] (what the run
//! loop tells its callback), and the figures of the parallelisms a report carries
//! ([`StepExchange`]; the experts' are [`super::experts`]).

use std::time::Duration;

use dualpipe_runtime::RankTimes;
use dualpipe_sim::Timeline;

use super::experts::ExpertLoad;
use crate::model::Evaluation;

/// What one training step did.
#[derive(Clone, Debug)]
pub struct StepReport {
    /// The step's index (0 for the first).
    pub step: usize,
    /// The loss of every micro-batch (mean-squared error for the MLP, mean next-token
    /// cross-entropy for the GPT), indexed by global micro-batch.
    pub losses: Vec<f64>,
    /// The step's loss: the mean of `losses`.
    pub loss: f64,
    /// The measured timeline of the pipeline, when the executor records one.
    pub timeline: Option<Timeline>,
    /// Wall-clock time of the whole step (data, pipeline, gradient sum, optimizer).
    pub wall: Duration,
    /// The step's global gradient norm, when the run clips gradients (before clipping).
    pub grad_norm: Option<f64>,
    /// The loss scale the step's backward ran under (f16 mixed precision only).
    pub loss_scale: Option<f64>,
    /// Whether the step's optimizer step was skipped: its f16 gradients overflowed.
    pub skipped: bool,
    /// The validation after this step, when one was due (the GPT every
    /// `eval_every` steps and after the last; on the reporting process).
    pub evaluation: Option<Evaluation>,
    /// Where each rank's pipeline time went: CPU, waiting for a message, waiting for a core.
    pub rank_times: RankTimes,
    /// The MoE router's tokens per (block, expert) of the step (`None` for a dense model).
    pub expert_load: Option<ExpertLoad>,
    /// What this replica's data-parallel gradient exchange cost (`None`: one replica).
    pub exchange: Option<StepExchange>,
}

/// What [`Trainer::run`](crate::Trainer::run) tells its callback.
#[derive(Clone, Copy, Debug)]
pub enum StepEvent<'a> {
    /// Step `step` (0 for the first) is about to start.
    Starting {
        /// The step's index.
        step: usize,
    },
    /// A step finished with a finite loss.
    Finished {
        /// What it did.
        report: &'a StepReport,
        /// Time since the run's first step started.
        elapsed: Duration,
    },
}

/// What one step's gradient exchange cost one replica (the losses' exchange not included).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepExchange {
    /// Wall-clock seconds of the exchange after the pipeline (waiting for what the pipeline
    /// did not hide and writing the results back; starting buckets and making progress
    /// during the pipeline counts as pipeline time).
    pub seconds: f64,
    /// Bytes this replica sent: gradient bodies and message headers.
    pub bytes_sent: u64,
    /// What the gradient bodies would have carried uncompressed.
    pub bytes_uncompressed: u64,
    /// How many of this replica's stage exchanges started during the pipeline (from the
    /// [`ExchangeHook`](crate::parallel::data::ExchangeHook)); 0 when the exchange runs after the pipeline.
    pub started_in_pipeline: usize,
    /// The L2 norm of this replica's error-feedback buffers after the step (worker and
    /// server residuals of every stage whose feedback it keeps): what compression still owes
    /// the model; 0 without a lossy compression or during the warm-up.
    pub feedback_norm: f64,
}
