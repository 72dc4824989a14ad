//! The one way a file the user named is opened ([`open_regular`]) and read ([`read_regular`],
//! [`read_text`]): only a regular file, never more than its kind's cap ([`crate::limits`]),
//! never a blocking open. Files the process owns (`/proc/...`, its own locks and journals) are
//! not user inputs and need not come here.
//!
//! The file is opened with `O_NONBLOCK`, so a FIFO with no writer does not block the open;
//! anything that is not a regular file (a FIFO, a character device such as `/dev/zero`, a
//! socket, a folder) is then refused by its kind, before a byte is read. A regular file larger
//! than the cap is refused by its size; the buffer is reserved once, at the file's size, with a
//! fallible allocation, so a file the memory cannot hold is an error, not an abort.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::limits::Limit;

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
    #[error("{what} {} has {size} bytes, more than the {} read at most ({why}); use a smaller file", path.display(), in_units(*cap))]
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
    /// The file is not UTF-8 text.
    #[error("{what} {} is not UTF-8 text (byte {at}); give a text file", path.display())]
    NotText {
        /// What the file is for.
        what: String,
        /// The path as given.
        path: PathBuf,
        /// The offset of the first byte that is not UTF-8.
        at: usize,
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

/// A byte count in words: `64 MiB (67108864 bytes)` when it is whole MiB, else `N bytes`.
fn in_units(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB ({bytes} bytes)", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// What kind of file `meta` describes, in words (`a folder`, `a FIFO`, `a character device`,
/// ...), for messages about a path that is not the kind expected.
pub fn kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
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

/// An input file opened by [`open_regular`]: a regular file, checked against its cap before a
/// byte was read. Reading it ([`std::io::Read`]) stops one byte past the cap, so a file that
/// grows while read is caught by [`Regular::read_all`] too.
#[derive(Debug)]
pub struct Regular {
    file: std::io::Take<std::fs::File>,
    size: u64,
    path: PathBuf,
    what: String,
    limit: Limit,
}

impl Regular {
    /// The file's size when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Reads the whole file: the buffer reserved once at its size with a fallible allocation
    /// (a file the memory cannot hold is an error, not an abort), and never more than the cap.
    pub fn read_all(mut self) -> Result<Vec<u8>, ReadError> {
        let mut bytes = Vec::new();
        let want = usize::try_from(self.size).map_err(|_| self.too_large(self.size))?;
        bytes.try_reserve_exact(want).map_err(|_| ReadError::Io {
            what: self.what.clone(),
            path: self.path.clone(),
            reason: format!("not enough memory for its {} bytes", self.size),
        })?;
        self.file.read_to_end(&mut bytes).map_err(|e| self.io(&e))?;
        if bytes.len() as u64 > self.limit.bytes {
            return Err(self.too_large(bytes.len() as u64));
        }
        Ok(bytes)
    }

    /// Reads the whole file as UTF-8 text ([`Regular::read_all`], then the encoding checked).
    pub fn read_text(self) -> Result<String, ReadError> {
        let (what, path) = (self.what.clone(), self.path.clone());
        String::from_utf8(self.read_all()?).map_err(|e| ReadError::NotText {
            what,
            path,
            at: e.utf8_error().valid_up_to(),
        })
    }

    fn too_large(&self, size: u64) -> ReadError {
        ReadError::TooLarge {
            what: self.what.clone(),
            path: self.path.clone(),
            size,
            cap: self.limit.bytes,
            why: self.limit.why.to_string(),
        }
    }

    fn io(&self, e: &std::io::Error) -> ReadError {
        ReadError::Io {
            what: self.what.clone(),
            path: self.path.clone(),
            reason: os_reason(e),
        }
    }
}

impl Read for Regular {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.file.read(buf)
    }
}

/// Opens the input at `path`, the one way every file the user names is opened: with
/// `O_NONBLOCK` (a FIFO with no writer never blocks the open), then refused unless it is a
/// regular file (a FIFO, `/dev/zero`, a socket, a folder: by its kind) of at most `limit`
/// bytes, before a byte is read. `what` names the file's use in messages (`the training text`).
/// The caps of each kind of file are in [`crate::limits`].
///
/// ```
/// use std::io::Read;
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("t.safetensors");
/// std::fs::write(&path, [1u8; 10]).unwrap();
/// let mut file = dualpipe_io::open_regular(&path, dualpipe_io::limits::TENSORS, "the weights").unwrap();
/// assert_eq!(file.size(), 10);
/// let mut head = [0u8; 4];
/// file.read_exact(&mut head).unwrap();
/// ```
pub fn open_regular(path: &Path, limit: Limit, what: &str) -> Result<Regular, ReadError> {
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
    let opened = Regular {
        file: file.take(limit.bytes.saturating_add(1)),
        size: meta.len(),
        path: path.into(),
        what: what.into(),
        limit,
    };
    if opened.size > opened.limit.bytes {
        return Err(opened.too_large(opened.size));
    }
    Ok(opened)
}

/// Reads the regular file at `path` whole ([`open_regular`], then [`Regular::read_all`]).
///
/// ```
/// use dualpipe_io::{limits::Limit, read_regular};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("text.txt");
/// std::fs::write(&path, "hello").unwrap();
/// let bytes = read_regular(&path, Limit::new(1 << 20, "the cap"), "the text").unwrap();
/// assert_eq!(bytes, b"hello");
/// assert!(read_regular(std::path::Path::new("/dev/zero"), Limit::new(10, ""), "the text").is_err());
/// ```
pub fn read_regular(path: &Path, limit: Limit, what: &str) -> Result<Vec<u8>, ReadError> {
    open_regular(path, limit, what)?.read_all()
}

/// Reads the regular file at `path` whole as UTF-8 text ([`open_regular`], then
/// [`Regular::read_text`]).
pub fn read_text(path: &Path, limit: Limit, what: &str) -> Result<String, ReadError> {
    open_regular(path, limit, what)?.read_text()
}

/// Reads standard input whole as UTF-8 text, never more than `limit` (for an input the user
/// gives as `-`; a pipe there is what they asked for).
pub fn read_stdin_text(limit: Limit, what: &str) -> Result<String, ReadError> {
    let path = PathBuf::from("-");
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(limit.bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| ReadError::Io {
            what: what.into(),
            path: path.clone(),
            reason: os_reason(&e),
        })?;
    if bytes.len() as u64 > limit.bytes {
        return Err(ReadError::TooLarge {
            what: what.into(),
            path,
            size: bytes.len() as u64,
            cap: limit.bytes,
            why: limit.why.to_string(),
        });
    }
    String::from_utf8(bytes).map_err(|e| ReadError::NotText {
        what: what.into(),
        path,
        at: e.utf8_error().valid_up_to(),
    })
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
            let err = read_regular(path, Limit::new(1 << 20, ""), "the text").unwrap_err();
            assert!(err.to_string().contains(kind), "{err}");
        }
    }

    #[test]
    fn a_file_over_the_cap_is_refused_and_one_at_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, [7u8; 100]).unwrap();
        assert_eq!(
            read_regular(&path, Limit::new(100, "x"), "t")
                .unwrap()
                .len(),
            100
        );
        let err = read_regular(&path, Limit::new(99, "the cap of tests"), "t").unwrap_err();
        assert!(err.to_string().contains("the cap of tests"), "{err}");
    }

    #[test]
    fn the_os_error_is_said_once() {
        let err = std::io::Error::from_raw_os_error(libc::ENOTDIR);
        assert_eq!(os_reason(&err), "Not a directory");
    }
}
