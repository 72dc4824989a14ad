//! [`MetricsError`]: what can go wrong serving metrics, writing the run log or reading it back.

use std::path::PathBuf;

/// An error of this crate.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The metrics address is not `HOST:PORT`, or cannot be listened on.
    #[error("cannot serve metrics on {addr}: {reason}")]
    Listen {
        /// The address asked for.
        addr: String,
        /// Why not.
        reason: String,
    },
    /// The run log cannot be created or written.
    #[error("cannot write the run log {}: {reason}", path.display())]
    LogWrite {
        /// The log's path.
        path: PathBuf,
        /// Why not.
        reason: String,
    },
    /// Another process holds the run log's lock: it is writing it.
    #[error(
        "the run log {} is being written by another run (it holds the file's lock); give this \
         run another log file, or wait for that run to end",
        path.display()
    )]
    LogLocked {
        /// The log's path.
        path: PathBuf,
    },
    /// The run log cannot be read, or a line of it is not a step record.
    #[error("{}: {reason}", path.display())]
    LogRead {
        /// The log's path (`-` for standard input).
        path: PathBuf,
        /// What is wrong, and where.
        reason: String,
    },
}
