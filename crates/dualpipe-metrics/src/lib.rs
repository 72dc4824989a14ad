//! Operating a training run: Prometheus metrics served over HTTP while it trains, a JSONL log
//! of every step, and the run report read back from that log.
//!
//! - [`record`] — [`StepRecord`]: every figure of one step (serde; one JSON line per step);
//! - [`registry`] — [`TrainingMetrics`]: the `dualpipe_*` metrics (prometheus-client), in the
//!   OpenMetrics or the Prometheus text format;
//! - [`server`] — [`MetricsServer`]: `/metrics` on one thread of its own (std::net and poll; no async
//!   runtime), the format chosen by the `Accept` header, port 0 for a free port;
//! - [`log`] — [`RunLog`]: the JSONL run log, each line flushed whole;
//! - [`observer`] — [`RunObserver`]: turns the trainer's step events into records and feeds
//!   the metrics and the log;
//! - [`report`] — [`read_log`] and [`RunReport`]: the summary text and the SVG of a run;
//! - [`watch`] — [`RunWatch`]: the server, the log and a progress bar behind the trainer's
//!   [`Watch`](dualpipe_train::job::watch::Watch) trait (what `dualpipe train` watches a run with).
//!
//! The metrics (names by Prometheus's rules: one prefix, base units, `_total` counters,
//! ratios 0-1): `dualpipe_pipeline_bubble_ratio` (measured, last step: waits for a message
//! only), `dualpipe_pipeline_bubble_ratio_simulated`, `dualpipe_core_wait_ratio`,
//! `dualpipe_communication_overhead_ratio` (the share of the step this replica spent in the
//! data-parallel gradient exchange; pipeline messages are part of the bubble),
//! `dualpipe_step_duration_seconds` (histogram), `dualpipe_steps_total`,
//! `dualpipe_tokens_total`, `dualpipe_tokens_per_second`, `dualpipe_loss`,
//! `dualpipe_validation_loss`, `dualpipe_rank_busy_seconds_total{rank}`,
//! `dualpipe_rank_wait_seconds_total{rank,reason}` (reason: `message`, `core`),
//! `dualpipe_bytes_sent_total{kind}` (kind: `activation`, `gradient`, `expert`,
//! `data_parallel`).
//!
//! Under MPI every process serves its own metrics on `base port + rank` (port 0: each picks
//! a free port and prints it), so each pod or host is scraped alone and a failed rank's
//! series stop on their own. Every process sees every rank's times (the step's timeline is
//! exchanged), so `rank_*` series of rank 0's endpoint already cover the whole pipeline;
//! sum or pick by the `instance` label.
//!
//! ```
//! use dualpipe_metrics::{MetricsServer, RunObserver, TrainingMetrics};
//! use dualpipe_train::{DType, ModelSection, ScheduleSection, TrainConfig, Trainer};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = TrainConfig {
//!     model: ModelSection {
//!         hidden: 8,
//!         layers_per_stage: 1,
//!         dtype: DType::F64,
//!         ..TrainConfig::MLP.model
//!     },
//!     schedule: ScheduleSection {
//!         ranks: 2,
//!         micro_batches: 4,
//!         micro_batch_size: 4,
//!         ..TrainConfig::MLP.schedule
//!     },
//!     steps: 3,
//!     ..TrainConfig::MLP
//! };
//! let mut trainer = Trainer::new(config.clone())?;
//! let metrics = TrainingMetrics::new(config.schedule.ranks);
//! let server = MetricsServer::start("127.0.0.1:0", metrics.clone())?;
//! eprintln!("metrics: {}", server.url());
//! let mut observer = RunObserver::new(&config, trainer.schedule()).with_metrics(metrics.clone());
//! trainer.run(|event| observer.observe(event).map(drop).map_err(|e| e.to_string()))?;
//! assert_eq!(metrics.steps(), 3);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod error;
pub mod log;
pub mod observer;
pub mod record;
pub mod registry;
pub mod report;
pub mod server;
pub mod watch;

pub use error::MetricsError;
pub use log::RunLog;
pub use observer::{message_bytes, tokens_per_step, RunObserver};
pub use record::{BytesSent, RankRecord, StepRecord};
pub use registry::{to_prometheus_text, TrainingMetrics};
pub use report::{read_log, read_log_checked, LogRead, RunReport};
pub use server::{MetricsServer, ServerLimits, ServerStats};
pub use watch::RunWatch;
