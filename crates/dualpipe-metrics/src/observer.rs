//! [`RunObserver`]: turns the trainer's [`StepEvent`]s into [`StepRecord`]s, and feeds them
//! to the metrics and the run log. Pass it to [`Trainer::run`](dualpipe_train::Trainer::run)
//! through a closure calling [`RunObserver::observe`].

use dualpipe_schedule::Schedule;
use dualpipe_sim::{metrics, simulate, CostModel, MessageKind, OpTally};
use dualpipe_train::{ModelKind, StepEvent, StepReport, TrainConfig};

use crate::error::MetricsError;
use crate::log::RunLog;
use crate::record::{BytesSent, RankRecord, StepRecord};
use crate::registry::TrainingMetrics;

/// Bytes one pipeline message carries for `config`'s model, in its element type
/// (activations forward, their gradients backward): a `[micro_batch_size, hidden]` tensor for
/// the MLP, `[micro_batch_size · seq_len, d_model]` hidden states for the GPT.
pub fn message_bytes(config: &TrainConfig) -> u64 {
    let values = match config.model.kind {
        ModelKind::Mlp => {
            (config.schedule.micro_batch_size as u128).saturating_mul(config.model.hidden as u128)
        }
        ModelKind::Gpt => (config.schedule.micro_batch_size as u128)
            .saturating_mul(config.model.seq_len as u128)
            .saturating_mul(config.model.d_model as u128),
    };
    u64::try_from(values.saturating_mul(config.model.dtype.size_in_bytes())).unwrap_or(u64::MAX)
}

/// Tokens one step of `config` trains on (the GPT's tokens; rows for the MLP).
pub fn tokens_per_step(config: &TrainConfig) -> u64 {
    let tokens = config.samples_per_step();
    if tokens >= u64::MAX as f64 {
        u64::MAX
    } else {
        tokens as u64
    }
}

/// Watches a run: every finished step becomes a [`StepRecord`], given to the metrics and
/// written to the log (each when present).
#[derive(Debug)]
pub struct RunObserver {
    schedule: Schedule,
    tokens_per_step: u64,
    message_bytes: u64,
    tokens_total: u64,
    ops: OpTally,
    metrics: Option<TrainingMetrics>,
    log: Option<RunLog>,
    /// Why the log was dropped, until [`RunObserver::take_log_failure`] takes it.
    log_failure: Option<MetricsError>,
}

impl RunObserver {
    /// An observer of a run of `config` on `schedule`.
    pub fn new(config: &TrainConfig, schedule: &Schedule) -> Self {
        RunObserver {
            schedule: schedule.clone(),
            tokens_per_step: tokens_per_step(config),
            message_bytes: message_bytes(config),
            tokens_total: 0,
            ops: OpTally::default(),
            metrics: None,
            log: None,
            log_failure: None,
        }
    }

    /// Also updates `metrics`.
    pub fn with_metrics(mut self, metrics: TrainingMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Also writes every record to `log`.
    pub fn with_log(mut self, log: RunLog) -> Self {
        self.log = Some(log);
        self
    }

    /// Takes in an event; returns the record of a finished step. A record the log cannot take
    /// (a full disk) drops the log, with its complete lines kept, and the run goes on: the
    /// reason waits in [`RunObserver::take_log_failure`].
    pub fn observe(&mut self, event: StepEvent<'_>) -> Result<Option<StepRecord>, MetricsError> {
        let StepEvent::Finished { report, elapsed } = event else {
            return Ok(None);
        };
        let record = self.record(report, elapsed.as_secs_f64());
        if let Some(m) = &self.metrics {
            m.record(&record);
        }
        if let Some(log) = &mut self.log {
            if let Err(err) = log.write(&record) {
                self.log = None;
                self.log_failure = Some(err);
            }
        }
        Ok(Some(record))
    }

    /// Why the log was dropped, once (`None`: it was not, or this was already taken).
    pub fn take_log_failure(&mut self) -> Option<MetricsError> {
        self.log_failure.take()
    }

    /// The record of a finished step, `elapsed` seconds into the run.
    pub fn record(&mut self, report: &StepReport, elapsed: f64) -> StepRecord {
        self.tokens_total = self.tokens_total.saturating_add(self.tokens_per_step);
        let step_seconds = report.wall.as_secs_f64();
        let times = &report.rank_times;
        let (mut pipeline_seconds, mut bytes) = (0.0, BytesSent::default());
        if let Some(timeline) = &report.timeline {
            pipeline_seconds = timeline.makespan();
            self.ops.add(timeline);
            for m in &timeline.messages {
                let slot = match m.kind {
                    MessageKind::Forward => &mut bytes.activation,
                    MessageKind::Backward => &mut bytes.gradient,
                };
                *slot = slot.saturating_add(self.message_bytes);
            }
        }
        let exchange = report.exchange.unwrap_or_default();
        bytes.data_parallel = exchange.bytes_sent;
        let split = times.split(pipeline_seconds);
        let simulated = self
            .ops
            .means()
            .stage_cost()
            .map(|compute| CostModel {
                compute,
                ..CostModel::default()
            })
            .and_then(|cost| simulate(&self.schedule, &cost).ok())
            .map(|t| metrics(&t, &self.schedule.placement).bubble_ratio);
        StepRecord {
            step: report.step + 1,
            elapsed_seconds: elapsed,
            step_seconds,
            pipeline_seconds,
            loss: report.loss,
            validation_loss: report.evaluation.map(|e| e.loss),
            tokens: self.tokens_per_step,
            tokens_total: self.tokens_total,
            tokens_per_second: self.tokens_per_step as f64 / step_seconds.max(1e-9),
            bubble_ratio: split.bubble_ratio,
            bubble_ratio_simulated: simulated,
            core_wait_ratio: split.core_wait_ratio,
            communication_overhead_ratio: (exchange.seconds / step_seconds.max(1e-9))
                .clamp(0.0, 1.0),
            rank_threads: times.threads,
            cores: times.cores,
            ranks: times
                .ranks
                .iter()
                .enumerate()
                .map(|(rank, t)| RankRecord {
                    rank,
                    busy_seconds: t.cpu_seconds,
                    message_wait_seconds: t.message_wait_seconds,
                    core_wait_seconds: t.core_wait_seconds,
                })
                .collect(),
            bytes_sent: bytes,
        }
    }
}
