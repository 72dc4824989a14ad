//! [`RunWatch`]: the [`Watch`] of `dualpipe train`: the Prometheus metrics server, the JSONL
//! run log and a progress bar on standard error, each when its [`WatchPlan`] asks.

use std::io::{IsTerminal, Write};

use dualpipe_train::checkpoint::OnSaved;
use dualpipe_train::job::watch::{Watch, WatchError, WatchPlan};
use dualpipe_train::StepEvent;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::{MetricsServer, RunLog, RunObserver, StepRecord, TrainingMetrics};

/// Watches one run: the metrics server and the log (when asked for) and the progress bar.
pub struct RunWatch {
    observer: RunObserver,
    progress: ProgressBar,
    /// The metrics the server serves (for the checkpoint writer's figures).
    metrics: Option<TrainingMetrics>,
    /// Serves until the run's end (dropped with this).
    _server: Option<MetricsServer>,
}

impl RunWatch {
    /// Starts what `plan` asks for, telling `say` the address the metrics are served on.
    /// The progress bar shows only when asked and standard error is a terminal.
    pub fn start(plan: WatchPlan<'_>, say: &mut dyn FnMut(&str)) -> Result<Self, WatchError> {
        let (config, schedule) = (plan.config, plan.schedule);
        let mut observer = RunObserver::new(config, schedule);
        let (mut server, mut served) = (None, None);
        if let Some(addr) = &plan.metrics_addr {
            let metrics = TrainingMetrics::new(config.schedule.ranks);
            let started = MetricsServer::start(addr, metrics.clone())
                .map_err(|e| WatchError::Serve(e.to_string()))?;
            say(&format!("metrics: {}", started.url()));
            served = Some(metrics.clone());
            observer = observer.with_metrics(metrics);
            server = Some(started);
        }
        if let Some(path) = &plan.log {
            dualpipe_io::check(path)?;
            let log =
                RunLog::open(path, plan.keep_log).map_err(|e| WatchError::Log(e.to_string()))?;
            observer = observer.with_log(log);
        }
        let progress = if plan.progress && std::io::stderr().is_terminal() {
            progress_bar(config.steps)
        } else {
            ProgressBar::hidden()
        };
        Ok(RunWatch {
            observer,
            progress,
            metrics: served,
            _server: server,
        })
    }
}

impl Watch for RunWatch {
    /// Records a finished step (metrics, log) and shows it. A log that cannot be written is
    /// said once on stderr and dropped; the run goes on.
    fn on_event(&mut self, event: StepEvent<'_>) -> Result<(), String> {
        let record = self.observer.observe(event).map_err(|e| e.to_string())?;
        if let Some(err) = self.observer.take_log_failure() {
            let line = format!(
                "warning: {err}; the run log stops here (its complete lines are kept) and \
                 training goes on\n"
            );
            self.progress
                .suspend(|| std::io::stderr().write_all(line.as_bytes()).ok());
        }
        if let Some(record) = record {
            show(&self.progress, &record);
        }
        Ok(())
    }

    /// Each checkpoint's time and count into the served metrics (`None` without a server).
    fn on_checkpoint(&self) -> Option<OnSaved> {
        let metrics = self.metrics.clone()?;
        Some(Box::new(move |saved| {
            metrics.record_checkpoint(saved.seconds)
        }))
    }

    /// Clears the progress bar (the server stops when this is dropped).
    fn finish(&mut self) {
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

/// A progress bar on stderr: step, loss, tokens/s and time left.
fn progress_bar(steps: usize) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("step {pos}/{len} [{bar:20}] {msg} · eta {eta}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
