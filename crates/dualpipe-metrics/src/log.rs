//! [`RunLog`]: the JSONL run log, one [`StepRecord`] per line, written as the run goes.
//!
//! Unlike the end-of-run outputs (written whole, then renamed into place), a run log is meant
//! to be followed while training (`tail -f`): the file is created (or truncated) when the run
//! starts and every line is written whole and flushed at once, so a reader never sees half a
//! record.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::MetricsError;
use crate::record::StepRecord;

/// A JSONL run log being written.
#[derive(Debug)]
pub struct RunLog {
    path: PathBuf,
    file: BufWriter<File>,
}

impl RunLog {
    /// Creates (or truncates) the log at `path`.
    pub fn create(path: &Path) -> Result<Self, MetricsError> {
        let file = File::create(path).map_err(|e| MetricsError::LogWrite {
            path: path.to_path_buf(),
            reason: format!("{e}; give a writable path"),
        })?;
        Ok(RunLog {
            path: path.to_path_buf(),
            file: BufWriter::new(file),
        })
    }

    /// Appends one step and flushes it.
    pub fn write(&mut self, record: &StepRecord) -> Result<(), MetricsError> {
        let mut line = serde_json::to_string(record).map_err(|e| self.error(e.to_string()))?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| self.error(e.to_string()))
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, reason: String) -> MetricsError {
        MetricsError::LogWrite {
            path: self.path.clone(),
            reason,
        }
    }
}
