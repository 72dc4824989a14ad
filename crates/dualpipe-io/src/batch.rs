//! Several files written as one: all or nothing.

use std::path::Path;

use crate::error::WriteError;
use crate::replace::Staged;
use crate::target::{check, Target};

/// Files a command writes together (a report, its picture, its trace). Paths are checked when
/// added; [`Batch::commit`] first stages every replaced file in its temp file, and only when all
/// are staged renames them into place and writes the in-place targets (devices, FIFOs,
/// standard output). A failure while staging leaves no file written and no temp file behind.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let mut batch = dualpipe_io::Batch::new();
/// batch.add(&dir.path().join("a.svg"), b"<svg/>".to_vec()).unwrap();
/// let bad = batch.add(&dir.path().join("missing/b.json"), b"{}".to_vec());
/// assert!(bad.is_err()); // refused before anything is written
/// ```
#[derive(Debug, Default)]
pub struct Batch {
    items: Vec<(Target, Vec<u8>)>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Checks `path` ([`check`]) and adds `bytes` as its whole content.
    pub fn add(&mut self, path: &Path, bytes: Vec<u8>) -> Result<(), WriteError> {
        let target = check(path)?;
        self.items.push((target, bytes));
        Ok(())
    }

    /// Adds an already checked target.
    pub fn add_target(&mut self, target: Target, bytes: Vec<u8>) {
        self.items.push((target, bytes));
    }

    /// Writes every file: stages all replacements, then renames them and writes the rest in
    /// the order added.
    pub fn commit(self) -> Result<(), WriteError> {
        let mut staged = Vec::new();
        for (target, bytes) in &self.items {
            if let Target::Replace { path, file, .. } = target {
                staged.push(Some(Staged::new(path, file, bytes)?));
            } else {
                staged.push(None);
            }
        }
        for ((target, bytes), stage) in self.items.iter().zip(staged) {
            match stage {
                Some(stage) => stage.commit()?,
                None => target.write(bytes)?,
            }
        }
        Ok(())
    }
}
