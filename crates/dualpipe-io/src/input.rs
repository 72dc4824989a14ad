//! Reading a file the user named, safely: only a regular file, never more than a cap, never a
//! blocking open.
//!
//! The file is opened with `O_NONBLOCK`, so a FIFO with no writer does not block the open;
//! anything that is not a regular file (a FIFO, a character device such as `/dev/zero`, a
//! socket, a folder) is then refused by its kind, before a byte is read. A regular file larger
//! than the cap is refused by its size; the buffer is reserved once, at the file's size, with a
//! fallible allocation, so a file the memory cannot hold is an error, not an abort.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a named input could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The path is not a regular file (a FIFO, a device, a socket, a folder).
    #[error("{what} {} is {kind}, not a regular file; give a file", path.display())]
    NotRegular {
        /// What the file is for (`the training text`).
        what: String,
        /// The path as given.
        path: PathBuf,
        /// What it is instead (`a FIFO`, `a character device`, ...).
        kind: &'static str,
    },
    /// The file is larger than the most read.
    #[error("{what} {} has {size} bytes, more than the {cap} bytes read at most ({why}); use a smaller file", path.display())]
    TooLarge {
        /// What the file is for.
        what: String,
        /// The path as given.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The cap.
        cap: u64,
        /// Where the cap comes from.
        why: String,
    },
    /// The file could not be opened or read (or its buffer not allocated).
    #[error("cannot read {what} {}: {reason}", path.display())]
    Io {
        /// What the file is for.
        what: String,
        /// The path as given.
        path: PathBuf,
        /// The system's reason, without repetition.
        reason: String,
    },
}

/// What kind of file `meta` describes, in words (for a file that is not regular).
fn kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// The system's error in words, once: Rust's `Display` of an OS error adds `(os error N)`,
/// which callers that also print the error's source would otherwise show twice.
pub fn os_reason(err: &std::io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => {
            let text = std::io::Error::from_raw_os_error(code).to_string();
            text.split(" (os error").next().unwrap_or(&text).to_string()
        }
        None => err.to_string(),
    }
}

/// Reads the regular file at `path` whole, refusing anything else and any file over `cap`
/// bytes (`why` says where the cap comes from, for the message). `what` names the file's use
/// in messages (`the training text`).
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("text.txt");
/// std::fs::write(&path, "hello").unwrap();
/// let bytes = dualpipe_io::read_regular(&path, 1 << 20, "the cap", "the text").unwrap();
/// assert_eq!(bytes, b"hello");
/// assert!(dualpipe_io::read_regular(std::path::Path::new("/dev/zero"), 10, "", "the text").is_err());
/// ```
pub fn read_regular(path: &Path, cap: u64, why: &str, what: &str) -> Result<Vec<u8>, ReadError> {
    let io = |e: std::io::Error| ReadError::Io {
        what: what.into(),
        path: path.into(),
        reason: os_reason(&e),
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular {
            what: what.into(),
            path: path.into(),
            kind: kind(&meta),
        });
    }
    let size = meta.len();
    let too_large = |size| ReadError::TooLarge {
        what: what.into(),
        path: path.into(),
        size,
        cap,
        why: why.into(),
    };
    if size > cap {
        return Err(too_large(size));
    }
    let mut bytes = Vec::new();
    let want = usize::try_from(size).map_err(|_| too_large(size))?;
    bytes.try_reserve_exact(want).map_err(|_| ReadError::Io {
        what: what.into(),
        path: path.into(),
        reason: format!("not enough memory for its {size} bytes"),
    })?;
    // At most one byte past the cap: a file that grows while read stops too.
    file.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > cap {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_devices_and_folders_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for (path, kind) in [
            (fifo.as_path(), "a FIFO"),
            (Path::new("/dev/zero"), "a character device"),
            (dir.path(), "a folder"),
        ] {
            let err = read_regular(path, 1 << 20, "", "the text").unwrap_err();
            assert!(err.to_string().contains(kind), "{err}");
        }
    }

    #[test]
    fn a_file_over_the_cap_is_refused_and_one_at_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, [7u8; 100]).unwrap();
        assert_eq!(read_regular(&path, 100, "x", "t").unwrap().len(), 100);
        let err = read_regular(&path, 99, "the cap of tests", "t").unwrap_err();
        assert!(err.to_string().contains("the cap of tests"), "{err}");
    }

    #[test]
    fn the_os_error_is_said_once() {
        let err = std::io::Error::from_raw_os_error(libc::ENOTDIR);
        assert_eq!(os_reason(&err), "Not a directory");
    }
}
