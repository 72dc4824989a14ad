//! The flags of what `dualpipe train` shows and exports while it trains ([`ObserveArgs`]):
//! the progress bar, the Prometheus metrics server and the JSONL run log (the figures and
//! formats are `dualpipe_metrics`'s), the job's [`ObserveSection`](dualpipe_train::job::ObserveSection).

use std::path::PathBuf;

/// The flags of what a run shows and exports while it trains.
#[derive(clap::Args, Debug, Default)]
pub struct ObserveArgs {
    /// Serve Prometheus metrics on HOST:PORT while training (port 0 picks a free one; the
    /// address is printed as `metrics: http://HOST:PORT/metrics`). With --transport mpi each
    /// process serves PORT + its rank.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Write one JSON line per step (every metric) into FILE, as the run goes; read it back
    /// with `dualpipe report FILE`. With --transport mpi rank 0 writes it (every rank sees
    /// every rank's figures).
    #[arg(long, value_name = "FILE.jsonl")]
    pub log: Option<PathBuf>,
    /// No progress bar and no per-step lines (the summary is still printed).
    #[arg(long)]
    pub quiet: bool,
}
