//! Where a path's bytes go: standard output, in place, or by atomic replacement.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use crate::error::WriteError;

/// Most symbolic links followed from a target before giving up (as the kernel's `ELOOP`).
const MAX_LINKS: usize = 40;

/// How a checked path is written (see the crate documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `-`: standard output.
    Stdout,
    /// Opened and written in place, never replaced: a path naming an open file descriptor, or an
    /// existing file that is not a regular file (device, FIFO, socket).
    InPlace {
        /// The path as given.
        path: PathBuf,
    },
    /// Replaced atomically by a temp file renamed over it.
    Replace {
        /// The path as given (for messages).
        path: PathBuf,
        /// The file actually replaced: the path with its symbolic links followed.
        file: PathBuf,
        /// Whether `file` exists now (its permission bits are kept).
        exists: bool,
    },
}

impl Target {
    /// The path as the user gave it (`-` for standard output).
    pub fn path(&self) -> &Path {
        match self {
            Target::Stdout => Path::new("-"),
            Target::InPlace { path } | Target::Replace { path, .. } => path,
        }
    }

    /// Writes `bytes` to this target (the whole content of the file).
    pub fn write(&self, bytes: &[u8]) -> Result<(), WriteError> {
        match self {
            Target::Stdout => crate::stdout::write_stdout(bytes),
            Target::InPlace { path } => write_in_place(path, bytes),
            Target::Replace { path, file, .. } => {
                crate::replace::Staged::new(path, file, bytes)?.commit()
            }
        }
    }
}

/// Checks that `path` can be written, without writing anything, and says how it will be.
///
/// Refused: a folder; a file in a folder that does not exist or is not writable; an existing
/// file that is not writable (a read-only result is not silently replaced); a device or FIFO
/// that is not writable; a `/dev/fd/N` that is not open; a loop of symbolic links. `-` checks
/// that standard output is open ([`crate::check_stdout`]).
pub fn check(path: &Path) -> Result<Target, WriteError> {
    if path.as_os_str() == "-" {
        crate::stdout::check_stdout()?;
        return Ok(Target::Stdout);
    }
    if path.as_os_str().is_empty() {
        return Err(WriteError::NoDirectory {
            path: path.into(),
            dir: PathBuf::from("(empty path)"),
        });
    }
    if names_descriptor(path) {
        let name = path.file_name().unwrap_or_default();
        if name == "stdout" || name == "1" {
            crate::stdout::check_stdout()?;
        }
        return match std::fs::metadata(path) {
            Ok(_) => Ok(Target::InPlace { path: path.into() }),
            Err(_) => Err(WriteError::ClosedDescriptor { path: path.into() }),
        };
    }
    let file = follow_links(path)?;
    match std::fs::symlink_metadata(&file) {
        Ok(meta) if meta.is_dir() => Err(WriteError::IsDirectory { path: path.into() }),
        Ok(meta) if meta.is_file() => {
            check_dir(path, &file)?;
            if !writable(&file) {
                return Err(WriteError::NotWritable {
                    path: path.into(),
                    what: format!("file {}", file.display()),
                });
            }
            Ok(Target::Replace {
                path: path.into(),
                file,
                exists: true,
            })
        }
        Ok(meta) => {
            let t = meta.file_type();
            if !(t.is_char_device() || t.is_block_device() || t.is_fifo() || t.is_socket()) {
                return Err(WriteError::io(
                    path,
                    std::io::Error::other("unknown kind of file"),
                ));
            }
            if !writable(&file) {
                return Err(WriteError::NotWritable {
                    path: path.into(),
                    what: format!("file {}", file.display()),
                });
            }
            Ok(Target::InPlace { path: file })
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            check_dir(path, &file)?;
            Ok(Target::Replace {
                path: path.into(),
                file,
                exists: false,
            })
        }
        Err(err) => Err(WriteError::io(path, err)),
    }
}

/// Whether `path` names an open file descriptor rather than a file (`/dev/stdout`,
/// `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`): such a path is always written in place,
/// so `--output /dev/stdout` works with pipes, terminals and `>>` alike.
fn names_descriptor(path: &Path) -> bool {
    let parts: Vec<Component> = path.components().collect();
    let name = |c: &Component| c.as_os_str().to_string_lossy().into_owned();
    let is_number = |c: &Component| {
        let n = name(c);
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
    };
    match parts.as_slice() {
        [Component::RootDir, dev, std] if name(dev) == "dev" => {
            matches!(name(std).as_str(), "stdout" | "stderr")
        }
        [Component::RootDir, dev, fd, n] if name(dev) == "dev" && name(fd) == "fd" => is_number(n),
        [Component::RootDir, proc, me, fd, n]
            if name(proc) == "proc" && name(me) == "self" && name(fd) == "fd" =>
        {
            is_number(n)
        }
        _ => false,
    }
}

/// Follows the symbolic links of the last component of `path` to the file they end at
/// (which may not exist yet): the file that is replaced, as `cp` writes through a link.
fn follow_links(path: &Path) -> Result<PathBuf, WriteError> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let dest = std::fs::read_link(&current).map_err(|e| WriteError::io(path, e))?;
                current = if dest.is_absolute() {
                    dest
                } else {
                    parent_of(&current).join(dest)
                };
            }
            _ => return Ok(current),
        }
    }
    Err(WriteError::LinkLoop { path: path.into() })
}

/// The folder a file lives in (`.` for a bare name).
pub(crate) fn parent_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Checks that the folder of `file` exists, is a folder, and lets us create files in it.
fn check_dir(path: &Path, file: &Path) -> Result<(), WriteError> {
    let dir = parent_of(file);
    if !dir.is_dir() {
        return Err(WriteError::NoDirectory {
            path: path.into(),
            dir,
        });
    }
    if file.file_name().is_none() {
        return Err(WriteError::IsDirectory { path: path.into() });
    }
    if !writable(&dir) {
        return Err(WriteError::NotWritable {
            path: path.into(),
            what: format!("folder {}", dir.display()),
        });
    }
    Ok(())
}

/// Whether the calling process may write `path` (`access(2)` with `W_OK`; for a folder, also
/// `X_OK`). A read-only file system answers no, also to root.
fn writable(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mode = if path.is_dir() {
        libc::W_OK | libc::X_OK
    } else {
        libc::W_OK
    };
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    unsafe { libc::access(c.as_ptr(), mode) == 0 }
}

/// Opens an existing non-regular file (or a descriptor path) for writing and writes `bytes`.
fn write_in_place(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| WriteError::io(path, e))?;
    match file.write_all(bytes).and_then(|()| file.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(|e| WriteError::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_paths() {
        for p in ["/dev/stdout", "/dev/stderr", "/dev/fd/1", "/proc/self/fd/7"] {
            assert!(names_descriptor(Path::new(p)), "{p}");
        }
        for p in [
            "/dev/null",
            "/dev/fd",
            "/dev/fd/x",
            "dev/stdout",
            "/tmp/dev/stdout",
        ] {
            assert!(!names_descriptor(Path::new(p)), "{p}");
        }
    }

    #[test]
    fn dash_is_stdout_and_folders_are_refused() {
        assert_eq!(check(Path::new("-")).ok(), Some(Target::Stdout));
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            check(dir.path()),
            Err(WriteError::IsDirectory { .. })
        ));
        let missing = dir.path().join("nope/x.json");
        let err = check(&missing).unwrap_err();
        assert!(matches!(err, WriteError::NoDirectory { .. }), "{err}");
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn a_link_chain_resolves_to_its_end_and_a_loop_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let end = dir.path().join("end.txt");
        std::os::unix::fs::symlink("end.txt", dir.path().join("b")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("b"), dir.path().join("a")).unwrap();
        match check(&dir.path().join("a")).unwrap() {
            Target::Replace { file, exists, .. } => {
                assert_eq!(file, end);
                assert!(!exists);
            }
            other => panic!("{other:?}"),
        }
        std::os::unix::fs::symlink("loop2", dir.path().join("loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", dir.path().join("loop2")).unwrap();
        assert!(matches!(
            check(&dir.path().join("loop1")),
            Err(WriteError::LinkLoop { .. })
        ));
    }
}
