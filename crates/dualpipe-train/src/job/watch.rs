//! [`Watch`]: what follows a run from outside the trainer (a progress display, served metrics,
//! a run log), started by a front end once the schedule is known, as [`WatchPlan`] asks.
//!
//! The trainer's own hook is the step callback of [`Trainer::run`](crate::Trainer::run); a
//! watch is that callback together with what it needs at the run's start and end, so that one
//! run written against this trait (such as `cli::TrainArgs::run_local`, feature `clap`)
//! serves any front end. `dualpipe_metrics::RunWatch` is the one `dualpipe train` uses.

use std::path::PathBuf;

use dualpipe_io::WriteError;
use dualpipe_schedule::Schedule;

use crate::checkpoint::OnSaved;
use crate::{StepEvent, TrainConfig};

/// Follows one run: its step events, the checkpoints it saves, its end.
pub trait Watch {
    /// Takes in one event of the run; an `Err` stops the run with that reason.
    fn on_event(&mut self, event: StepEvent<'_>) -> Result<(), String>;

    /// What the checkpoint writer should tell of each checkpoint it saves (`None`: nothing).
    fn on_checkpoint(&self) -> Option<OnSaved> {
        None
    }

    /// The run ended (a progress display is cleared).
    fn finish(&mut self) {}
}

/// A watch that follows nothing (a run without progress, metrics or log).
impl Watch for () {
    fn on_event(&mut self, _: StepEvent<'_>) -> Result<(), String> {
        Ok(())
    }
}

/// What a watch is asked to do for one process of a run.
#[derive(Debug)]
pub struct WatchPlan<'a> {
    /// The run's configuration.
    pub config: &'a TrainConfig,
    /// The schedule it runs.
    pub schedule: &'a Schedule,
    /// This process's rank (0 for a local run).
    pub rank: usize,
    /// Serve metrics on this `HOST:PORT` (already moved up by the rank under MPI).
    pub metrics_addr: Option<String>,
    /// Write the run log here (given to the reporting process only).
    pub log: Option<PathBuf>,
    /// The run resumes from a checkpoint: keep the log's records before the first step it
    /// writes (and drop those of the steps it runs again) instead of emptying the log.
    pub keep_log: bool,
    /// Show progress (the reporting process, unless asked to be quiet).
    pub progress: bool,
}

/// Why a watch could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The metrics address cannot be served on.
    #[error("{0}")]
    Serve(String),
    /// The run log cannot be created.
    #[error("{0}")]
    Log(String),
    /// The run log's path cannot be written.
    #[error(transparent)]
    Output(#[from] WriteError),
}
