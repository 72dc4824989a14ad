//! Why a write could not be done.

use std::path::PathBuf;

/// A write that could not be done, naming the path and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The folder the file would go into does not exist (or is not a folder).
    #[error("cannot write {path}: folder {dir} does not exist; create it or choose another path")]
    NoDirectory {
        /// The path asked for.
        path: PathBuf,
        /// Its folder.
        dir: PathBuf,
    },
    /// The target is a folder.
    #[error("cannot write {path}: it is a folder; give a file name inside it")]
    IsDirectory {
        /// The path asked for.
        path: PathBuf,
    },
    /// The folder (or the file written in place, or a read-only file) refuses writing.
    #[error("cannot write {path}: {what} is not writable; change its permissions or choose another path")]
    NotWritable {
        /// The path asked for.
        path: PathBuf,
        /// What refuses: `folder X` or `file X`.
        what: String,
    },
    /// A chain of symbolic links that does not end (or is longer than 40 links).
    #[error("cannot write {path}: too many levels of symbolic links; point it at a file")]
    LinkLoop {
        /// The path asked for.
        path: PathBuf,
    },
    /// A path of the form `/dev/fd/N` whose descriptor is not open.
    #[error("cannot write {path}: that file descriptor is not open")]
    ClosedDescriptor {
        /// The path asked for.
        path: PathBuf,
    },
    /// Standard output is closed (the command ran with `>&-`).
    #[error("standard output is closed, so the result would be lost; redirect it (> FILE) or write to a file (`output`)")]
    StdoutClosed,
    /// The operating system refused a step of the write. The system's error is said once, in
    /// the message (it is not also given as the error's source, which a caller printing the
    /// chain would repeat).
    #[error("cannot write {path}: {}", crate::input::os_reason(error))]
    Io {
        /// The path asked for (`-` for standard output).
        path: PathBuf,
        /// The system's error.
        error: std::io::Error,
    },
}

impl WriteError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> WriteError {
        WriteError::Io {
            path: path.to_path_buf(),
            error: source,
        }
    }

    /// Whether the error is in the request (a path that cannot be written: fix the flag) rather
    /// than in the system at write time (a full disk, a device error).
    pub fn is_usage(&self) -> bool {
        match self {
            WriteError::Io { error, .. } => is_path_error(error),
            WriteError::StdoutClosed => false,
            _ => true,
        }
    }
}

/// Whether the system refused the path itself (a file where a folder should be, a name too
/// long, a read-only file system, no permission): the flag is wrong, not the moment.
fn is_path_error(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOTDIR | libc::ENAMETOOLONG | libc::EROFS | libc::EACCES | libc::EPERM)
    )
}
