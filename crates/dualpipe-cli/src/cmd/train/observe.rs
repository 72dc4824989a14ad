//! What `dualpipe train` shows and exports while it trains: the progress bar, the Prometheus
//! metrics server (`--metrics-addr`) and the JSONL run log (`--log`). The flags are
//! [`ObserveArgs`]; the figures and the formats are `dualpipe_metrics`'s; this module holds
//! the terminal.

use std::io::IsTerminal;

use dualpipe_metrics::{MetricsServer, RunLog, RunObserver, StepRecord, TrainingMetrics};
use dualpipe_schedule::Schedule;
use dualpipe_train::cli::{rank_addr, ObserveArgs};
use dualpipe_train::{StepEvent, TrainConfig};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cmd::output::check_output;
use crate::cmd::UsageError;

/// Watches one run: the metrics server and the log (when asked for) and the progress bar.
pub struct Observe {
    observer: RunObserver,
    progress: ProgressBar,
    /// The metrics `--metrics-addr` serves (for the checkpoint writer's figures).
    metrics: Option<TrainingMetrics>,
    /// Serves until the run's end (dropped with this).
    _server: Option<MetricsServer>,
}

impl Observe {
    /// Starts what `args` asks for, for process `rank` (0 locally); the progress bar only when
    /// `progress` (rank 0), not `--quiet` and stderr is a terminal. A bad address or log path
    /// is a usage error, found before the first step.
    pub fn start(
        args: &ObserveArgs,
        config: &TrainConfig,
        schedule: &Schedule,
        rank: usize,
        progress: bool,
    ) -> anyhow::Result<Self> {
        let mut observer = RunObserver::new(config, schedule);
        let mut server = None;
        let mut served = None;
        if let Some(addr) = &args.metrics_addr {
            let addr = rank_addr(addr, rank).map_err(UsageError::from)?;
            let metrics = TrainingMetrics::new(config.ranks);
            let started = MetricsServer::start(&addr, metrics.clone())
                .map_err(|e| UsageError(format!("--metrics-addr: {e}")))?;
            eprintln!("metrics: {}", started.url());
            served = Some(metrics.clone());
            observer = observer.with_metrics(metrics);
            server = Some(started);
        }
        if let Some(path) = args.log.as_ref().filter(|_| rank == 0) {
            check_output(path)?;
            let log = RunLog::create(path).map_err(|e| UsageError(format!("--log: {e}")))?;
            observer = observer.with_log(log);
        }
        let progress = if progress {
            progress_bar(args.quiet, config.steps)
        } else {
            ProgressBar::hidden()
        };
        Ok(Observe {
            observer,
            progress,
            metrics: served,
            _server: server,
        })
    }

    /// Takes in one event of the run (an `Err` stops the run: the log cannot be written).
    pub fn on_event(&mut self, event: StepEvent<'_>) -> Result<(), String> {
        let record = self.observer.observe(event).map_err(|e| e.to_string())?;
        if let Some(record) = record {
            show(&self.progress, &record);
        }
        Ok(())
    }

    /// What the checkpoint writer tells of each checkpoint it saved: its time and count into
    /// the served metrics (`None` without `--metrics-addr`).
    pub fn on_checkpoint(&self) -> Option<dualpipe_train::checkpoint::OnSaved> {
        let metrics = self.metrics.clone()?;
        Some(Box::new(move |saved| {
            metrics.record_checkpoint(saved.seconds)
        }))
    }

    /// Clears the progress bar (the server stops when this is dropped).
    pub fn finish(&self) {
        self.progress.finish_and_clear();
    }
}

/// Shows a finished step on the progress bar.
fn show(progress: &ProgressBar, record: &StepRecord) {
    progress.set_message(format!(
        "loss {:.5} · {:.0} tokens/s",
        record.loss,
        record.tokens_total as f64 / record.elapsed_seconds.max(1e-9)
    ));
    progress.set_position(record.step as u64);
}

/// A progress bar on stderr: step, loss, tokens/s and time left; hidden with `--quiet` or
/// when stderr is not a terminal.
fn progress_bar(quiet: bool, steps: usize) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("step {pos}/{len} [{bar:20}] {msg} · eta {eta}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
