//! [`RunLog`]: the JSONL run log, one [`StepRecord`] per line, written as the run goes.
//!
//! Unlike the end-of-run outputs (written whole, then renamed into place), a run log is meant
//! to be followed while training (`tail -f`), so it is written in place, one whole line per
//! write. What protects it:
//!
//! - **One writer.** A regular file is locked (`flock`, exclusive) before anything in it
//!   changes; a second run naming the same log is refused ([`MetricsError::LogLocked`]) and the
//!   file is left as it was.
//! - **A resumed run keeps the history.** [`RunLog::open`] with `keep_earlier` (a run that
//!   resumes from a checkpoint) keeps every complete record before the first step the run
//!   writes and cuts the rest (the records of steps it will run again, and a torn last line),
//!   at the first write; a fresh run empties the file once it holds the lock.
//! - **A failed write leaves whole lines.** When a write fails (a full disk), the part of the
//!   line that was written is cut off again, so the file ends with the last complete record,
//!   and the error is returned; the caller drops the log and goes on.
//! - **Never a blocking open.** The file is opened with `O_NONBLOCK`: a FIFO no process reads
//!   is refused at once instead of blocking the run before its first step. Devices, FIFOs with
//!   a reader and descriptor paths are written as streams; a descriptor path (`/dev/stdout`,
//!   `/dev/fd/N`) writes through that descriptor itself, so `>> FILE` appends and nothing the
//!   descriptor already wrote is overwritten.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::MetricsError;
use crate::record::StepRecord;

/// A JSONL run log being written.
#[derive(Debug)]
pub struct RunLog {
    path: PathBuf,
    file: File,
    /// A regular file (locked, cut back on failure); otherwise a stream.
    regular: bool,
    /// Keep the records before the first step written (cut at the first write).
    pending_cut: bool,
    /// Bytes of complete lines in the file (a regular file).
    good_len: u64,
}

impl RunLog {
    /// Creates the log at `path`, or empties it: a fresh run's log.
    pub fn create(path: &Path) -> Result<Self, MetricsError> {
        RunLog::open(path, false)
    }

    /// Opens the log at `path`, creating it when missing, and locks it against a second
    /// writer. With `keep_earlier` (a resumed run) the records before the first step written
    /// are kept (module documentation); without, the file is emptied.
    pub fn open(path: &Path, keep_earlier: bool) -> Result<Self, MetricsError> {
        let fail = |reason: String| MetricsError::LogWrite {
            path: path.to_path_buf(),
            reason,
        };
        if let Some(fd) = descriptor(path) {
            // `/dev/stdout` and its kin: the descriptor itself (its offset and `O_APPEND`
            // shared), never reopened at offset 0 over what it already holds.
            // SAFETY: dup of a descriptor number; the new descriptor is owned below.
            let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if dup < 0 {
                return Err(fail(format!(
                    "descriptor {fd} is not open: {}",
                    dualpipe_io::os_reason(&std::io::Error::last_os_error())
                )));
            }
            // SAFETY: `dup` is a fresh descriptor nothing else owns.
            let file = unsafe { <File as std::os::unix::io::FromRawFd>::from_raw_fd(dup) };
            return Ok(RunLog {
                path: path.to_path_buf(),
                file,
                regular: false,
                pending_cut: false,
                good_len: 0,
            });
        }
        // A regular file (or a new one) is read back on resume; anything else (a FIFO, a
        // device, a descriptor path) is opened for writing only: a FIFO opened read-write
        // would be its own reader.
        let is_file = std::fs::metadata(path).map_or(true, |m| m.is_file());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .read(is_file)
            .create(is_file)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENXIO) => fail(
                    "it is a FIFO that no process reads; start its reader first, or give a file"
                        .into(),
                ),
                _ => fail(format!(
                    "{}; give a writable path",
                    dualpipe_io::os_reason(&e)
                )),
            })?;
        set_blocking(&file).map_err(|e| fail(dualpipe_io::os_reason(&e)))?;
        let regular = file
            .metadata()
            .map_err(|e| fail(dualpipe_io::os_reason(&e)))?
            .is_file();
        let log = RunLog {
            path: path.to_path_buf(),
            file,
            regular,
            pending_cut: regular && keep_earlier,
            good_len: 0,
        };
        if regular {
            lock(&log.file).map_err(|e| {
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    MetricsError::LogLocked {
                        path: path.to_path_buf(),
                    }
                } else {
                    fail(dualpipe_io::os_reason(&e))
                }
            })?;
            if !keep_earlier {
                log.file
                    .set_len(0)
                    .map_err(|e| fail(dualpipe_io::os_reason(&e)))?;
            }
        }
        Ok(log)
    }

    /// Appends one step, in one write of a whole line. On failure the part written is cut off
    /// again (a regular file), so the file still ends with a complete record.
    pub fn write(&mut self, record: &StepRecord) -> Result<(), MetricsError> {
        if self.pending_cut {
            self.pending_cut = false;
            let keep = kept_bytes(&self.file, record.step).map_err(|e| self.io_error(&e))?;
            self.file.set_len(keep).map_err(|e| self.io_error(&e))?;
            self.good_len = keep;
        }
        let mut line = serde_json::to_string(record).map_err(|e| self.error(e.to_string()))?;
        line.push('\n');
        if self.regular {
            self.file
                .seek(SeekFrom::Start(self.good_len))
                .map_err(|e| self.io_error(&e))?;
        }
        match self.file.write_all(line.as_bytes()) {
            Ok(()) => {
                self.good_len += line.len() as u64;
                Ok(())
            }
            Err(e) => {
                if self.regular {
                    let _ = self.file.set_len(self.good_len);
                }
                Err(self.io_error(&e))
            }
        }
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io_error(&self, e: &std::io::Error) -> MetricsError {
        self.error(dualpipe_io::os_reason(e))
    }

    fn error(&self, reason: String) -> MetricsError {
        MetricsError::LogWrite {
            path: self.path.clone(),
            reason,
        }
    }
}

/// The descriptor a path names (`/dev/stdout` 1, `/dev/stderr` 2, `/dev/fd/N`,
/// `/proc/self/fd/N`), if it names one.
fn descriptor(path: &Path) -> Option<libc::c_int> {
    let text = path.to_str()?;
    match text {
        "/dev/stdout" => Some(1),
        "/dev/stderr" => Some(2),
        _ => text
            .strip_prefix("/dev/fd/")
            .or_else(|| text.strip_prefix("/proc/self/fd/"))
            .and_then(|n| n.parse().ok()),
    }
}

/// Clears `O_NONBLOCK` again (it was only there so that opening a FIFO cannot block).
fn set_blocking(file: &File) -> std::io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on an open descriptor with integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Takes the exclusive lock of `file` without waiting (held until the file is closed).
fn lock(file: &File) -> std::io::Result<()> {
    // SAFETY: flock on an open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The bytes of `file`'s leading complete records whose step is before `first_step`: the
/// part a resumed run keeps. The first line that is not a whole record (torn by a kill, or not
/// JSON) or whose step is `first_step` or later ends it.
fn kept_bytes(file: &File, first_step: usize) -> std::io::Result<u64> {
    #[derive(serde::Deserialize)]
    struct Step {
        step: usize,
    }
    let mut reader = BufReader::new(file);
    reader.seek(SeekFrom::Start(0))?;
    let (mut kept, mut line) = (0u64, Vec::new());
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            return Ok(kept);
        }
        match serde_json::from_slice::<Step>(&line) {
            Ok(s) if s.step < first_step => kept += n as u64,
            _ => return Ok(kept),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(step: usize) -> StepRecord {
        StepRecord {
            step,
            elapsed_seconds: step as f64,
            step_seconds: 1.0,
            pipeline_seconds: 1.0,
            loss: 1.0,
            validation_loss: None,
            tokens: 8,
            tokens_total: 8 * step as u64,
            tokens_per_second: 8.0,
            bubble_ratio: 0.0,
            bubble_ratio_simulated: None,
            core_wait_ratio: 0.0,
            communication_overhead_ratio: 0.0,
            rank_threads: 1,
            cores: 1,
            ranks: Vec::new(),
            bytes_sent: Default::default(),
        }
    }

    fn steps(path: &Path) -> Vec<usize> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<StepRecord>(l).unwrap().step)
            .collect()
    }

    #[test]
    fn a_resumed_log_keeps_the_steps_before_it_and_drops_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.jsonl");
        let mut log = RunLog::create(&path).unwrap();
        for step in 1..=9 {
            log.write(&record(step)).unwrap();
        }
        drop(log);
        // A kill tore the last line.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"{\"step\":10,\"elap").unwrap();
        drop(f);
        // Resumed from the checkpoint of step 6: steps 7.. are run again.
        let mut log = RunLog::open(&path, true).unwrap();
        assert_eq!(
            steps_prefix(&path),
            9,
            "nothing changes before the first write"
        );
        for step in 7..=10 {
            log.write(&record(step)).unwrap();
        }
        drop(log);
        assert_eq!(steps(&path), (1..=10).collect::<Vec<_>>());
        // A fresh run empties it.
        let mut log = RunLog::create(&path).unwrap();
        log.write(&record(1)).unwrap();
        assert_eq!(steps(&path), vec![1]);
    }

    fn steps_prefix(path: &Path) -> usize {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter(|l| l.ends_with('}'))
            .count()
    }

    #[test]
    fn a_second_writer_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.jsonl");
        let mut first = RunLog::create(&path).unwrap();
        first.write(&record(1)).unwrap();
        let err = RunLog::create(&path).unwrap_err();
        assert!(matches!(err, MetricsError::LogLocked { .. }), "{err}");
        assert_eq!(steps(&path), vec![1]);
        first.write(&record(2)).unwrap();
        drop(first);
        RunLog::open(&path, true).unwrap();
    }

    #[test]
    fn a_fifo_without_a_reader_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = RunLog::create(&fifo).unwrap_err().to_string();
        assert!(err.contains("no process reads"), "{err}");
    }

    #[test]
    fn a_failed_write_leaves_whole_lines() {
        // /dev/full fails every write: a stream, nothing to cut, one error.
        let mut log = RunLog::create(Path::new("/dev/full")).unwrap();
        let err = log.write(&record(1)).unwrap_err().to_string();
        assert!(err.contains("No space left on device"), "{err}");
        assert!(!err.contains("os error"), "{err}");
    }
}
