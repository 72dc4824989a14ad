//! The scheduler's state on disk: `DIR/state.json`, rewritten whole through the safe writer
//! (a temp file beside it, fsync, rename) after every change, so a scheduler killed at any
//! moment finds every job again; and `DIR/.lock`, which keeps a second scheduler out.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::spec::JobRecord;

/// The journal's format version.
pub const VERSION: u32 = 1;

/// The largest journal read (bytes).
pub const MAX_JOURNAL_BYTES: u64 = 64 << 20;

/// The counters of the whole cluster since the state directory was created.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Totals {
    /// Migrations done (same rank count, other slots).
    pub migrations: u64,
    /// Resizes done (another rank count).
    pub resizes: u64,
    /// Crashed processes resumed from their checkpoints.
    pub recoveries: u64,
    /// Slot-seconds some job's process held.
    pub busy_slot_s: f64,
    /// Slot-seconds the scheduler ran (slots x seconds).
    pub slot_s: f64,
    /// Slot-seconds that were free while a job waited.
    pub stranded_slot_s: f64,
}

/// Everything the scheduler journals.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Journal {
    /// [`VERSION`].
    pub version: u32,
    /// The slots the state was made for.
    pub slots: usize,
    /// The next job's sequence number.
    pub next_seq: u64,
    /// The cluster's counters.
    pub totals: Totals,
    /// Every job, in submission order.
    pub jobs: Vec<JobRecord>,
}

impl Journal {
    /// An empty journal for `slots` slots.
    pub fn new(slots: usize) -> Self {
        Journal {
            version: VERSION,
            slots,
            next_seq: 1,
            totals: Totals::default(),
            jobs: Vec::new(),
        }
    }

    /// The state file of directory `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join("state.json")
    }

    /// Reads the journal of `dir`, or `None` when there is none yet; the error is one line.
    /// A file that is not a regular one, or larger than [`MAX_JOURNAL_BYTES`], is refused
    /// before it is read.
    pub fn load(dir: &Path) -> Result<Option<Journal>, String> {
        let path = Self::path(dir);
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            _ => {}
        }
        let bytes = dualpipe_io::read_regular(
            &path,
            dualpipe_io::limits::Limit::new(
                MAX_JOURNAL_BYTES,
                "a journal of 65,536 slots and thousands of jobs is a few MiB",
            ),
            "the scheduler's state",
        )
        .map_err(|e| format!("{e}; give another `state` directory"))?;
        let text = String::from_utf8_lossy(&bytes);
        let journal: Journal = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{}: not a scheduler state file ({e}); give another `state` directory",
                path.display()
            )
        })?;
        if journal.version != VERSION {
            return Err(format!(
                "{}: state version {} (this scheduler reads {VERSION})",
                path.display(),
                journal.version
            ));
        }
        Ok(Some(journal))
    }

    /// Writes the journal into `dir` through the safe writer.
    pub fn save(&self, dir: &Path) -> Result<(), String> {
        let mut text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        text.push('\n');
        dualpipe_io::write(&Self::path(dir), text.as_bytes()).map_err(|e| e.to_string())
    }
}

/// The exclusive lock on a state directory, held while the scheduler runs.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Locks `dir` (creating it, readable by its owner only, and its lock file when
    /// missing); refused while another scheduler holds it.
    pub fn take(dir: &Path) -> Result<DirLock, String> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("`state` {}: cannot create: {e}", dir.display()))?;
        let path = dir.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("`state` {}: cannot open its lock: {e}", dir.display()))?;
        // SAFETY: flock(2) on a descriptor we own.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            return Err(format!(
                "`state` {}: another `dualpipe cluster serve` uses this directory; stop it or give another `state`",
                dir.display()
            ));
        }
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_round_trips_and_the_lock_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Journal::load(dir.path()).unwrap(), None);
        let mut j = Journal::new(4);
        j.totals.migrations = 3;
        j.save(dir.path()).unwrap();
        assert_eq!(Journal::load(dir.path()).unwrap(), Some(j));
        let lock = DirLock::take(dir.path()).unwrap();
        let second = DirLock::take(dir.path()).unwrap_err();
        assert!(
            second.contains("another `dualpipe cluster serve`"),
            "{second}"
        );
        drop(lock);
        DirLock::take(dir.path()).unwrap();
        std::fs::write(Journal::path(dir.path()), "{").unwrap();
        assert!(Journal::load(dir.path())
            .unwrap_err()
            .contains("not a scheduler state file"));
    }

    #[test]
    fn a_huge_journal_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(Journal::path(dir.path())).unwrap();
        // Sparse: 3 GB on the file system's books, no blocks written.
        f.set_len(3 << 30).unwrap();
        let e = Journal::load(dir.path()).unwrap_err();
        assert!(e.contains("state.json") && e.contains("more than"), "{e}");
    }
}
