//! The one planner of a command's paths: every file it reads and every file it writes is
//! declared before any work, and the plan refuses, before a byte is written, an output that is
//! the same file as an input or as another output (through any name: symbolic and hard links,
//! `..`, `/dev/fd/N`; [`check_clashes`]) and an output that cannot be written ([`check`]).
//!
//! A command that writes into a folder declares each file it will write there (a manifest per
//! job, a checkpoint's `latest`), so an input that lives in that folder under one of those
//! names is caught too.

use std::path::{Path, PathBuf};

use crate::clash::{check_clashes, Named, PathClash};
use crate::error::WriteError;
use crate::target::check;

/// Why a plan was refused.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// An output on an input, or two outputs on one file.
    #[error(transparent)]
    Clash(#[from] PathClash),
    /// An output that cannot be written.
    #[error(transparent)]
    Write(#[from] WriteError),
}

impl PlanError {
    /// Whether the error is in the request (fix a flag) rather than in the system.
    pub fn is_usage(&self) -> bool {
        match self {
            PlanError::Clash(_) => true,
            PlanError::Write(e) => e.is_usage(),
        }
    }
}

/// Every path one command reads and writes, each with the setting that named it.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let trace = dir.path().join("t.csv");
/// std::fs::write(&trace, "job\n").unwrap();
/// let mut plan = dualpipe_io::OutputPlan::new();
/// plan.input("--trace", Some(&trace)).output("--svg", Some(&dir.path().join("./t.csv")));
/// assert!(plan.check().unwrap_err().to_string().contains("--svg"));
/// ```
#[derive(Debug, Default)]
pub struct OutputPlan {
    inputs: Vec<(String, PathBuf)>,
    outputs: Vec<(String, PathBuf)>,
}

impl OutputPlan {
    /// An empty plan.
    pub fn new() -> OutputPlan {
        OutputPlan::default()
    }

    /// Declares a file the command reads (`None`: the setting was not given).
    pub fn input(&mut self, name: &str, path: Option<&Path>) -> &mut Self {
        if let Some(path) = path {
            self.inputs.push((name.to_string(), path.to_path_buf()));
        }
        self
    }

    /// Declares a file the command writes (`-`: standard output; `None`: not given).
    pub fn output(&mut self, name: &str, path: Option<&Path>) -> &mut Self {
        if let Some(path) = path {
            self.outputs.push((name.to_string(), path.to_path_buf()));
        }
        self
    }

    /// Checks the plan: no output on an input or on another output, every output writable.
    /// Nothing is read or written.
    pub fn check(&self) -> Result<(), PlanError> {
        let ins: Vec<Named> = self.inputs.iter().map(|(n, p)| Named::new(n, p)).collect();
        let outs: Vec<Named> = self.outputs.iter().map(|(n, p)| Named::new(n, p)).collect();
        check_clashes(&ins, &outs)?;
        for (_, path) in &self.outputs {
            check(path)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_written_into_a_folder_is_checked_against_the_inputs_there() {
        let dir = tempfile::tempdir().unwrap();
        let placement = dir.path().join("mpijob-a.yaml");
        std::fs::write(&placement, "{}").unwrap();
        let mut plan = OutputPlan::new();
        plan.input("--placement", Some(&placement))
            .output("--output-dir", Some(&dir.path().join("mpijob-a.yaml")));
        let err = plan.check().unwrap_err();
        assert!(
            err.is_usage() && err.to_string().contains("--placement"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&placement).unwrap(), "{}");
    }

    #[test]
    fn an_output_in_a_missing_folder_is_refused_and_a_fine_plan_passes() {
        let dir = tempfile::tempdir().unwrap();
        let mut plan = OutputPlan::new();
        plan.output("--svg", Some(&dir.path().join("no/x.svg")));
        assert!(plan
            .check()
            .unwrap_err()
            .to_string()
            .contains("does not exist"));
        let mut plan = OutputPlan::new();
        plan.input("--trace", None)
            .output("--svg", Some(&dir.path().join("x.svg")));
        plan.check().unwrap();
    }
}
