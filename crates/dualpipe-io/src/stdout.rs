//! Standard output: a reader that went away ends quietly; a closed descriptor is an error.

use std::io::Write;
use std::path::Path;

use crate::error::WriteError;
use crate::startup::{stdout_at_start, AtStart};

/// Checks that standard output is open, so a command run with `>&-` fails before its work
/// instead of losing the result.
///
/// Rust's runtime reopens a descriptor 0, 1 or 2 that is closed at start on `/dev/null`,
/// read-write, before `main` runs (and its standard library drops writes to a closed standard
/// output silently), so by then a closed standard output looks like a read-write `/dev/null`,
/// which is also what a parent gives on purpose (Python's `subprocess.DEVNULL`). The state of
/// descriptor 1 is therefore recorded before the runtime starts, by a constructor the loader
/// runs before `main` (`.init_array` on Linux and the BSDs, `__mod_init_func` on Apple
/// systems): closed then is refused, open then (`/dev/null` included) is accepted as long as
/// it is still open now. Where no such record exists (another Unix), a read-write `/dev/null`
/// is taken as closed at start.
pub fn check_stdout() -> Result<(), WriteError> {
    if !is_open_now(libc::STDOUT_FILENO) {
        return Err(WriteError::StdoutClosed);
    }
    match stdout_at_start() {
        AtStart::Closed => Err(WriteError::StdoutClosed),
        AtStart::Open => Ok(()),
        AtStart::Unknown if is_read_write_dev_null(libc::STDOUT_FILENO) => {
            Err(WriteError::StdoutClosed)
        }
        AtStart::Unknown => Ok(()),
    }
}

/// Whether descriptor `fd` is open at this moment.
fn is_open_now(fd: libc::c_int) -> bool {
    // SAFETY: fcntl F_GETFL on a descriptor number only reads its status flags.
    unsafe { libc::fcntl(fd, libc::F_GETFL) != -1 }
}

/// Whether descriptor `fd` is the character device of `/dev/null`, opened read-write (the
/// way Rust's runtime reopens a descriptor that was closed at start).
fn is_read_write_dev_null(fd: libc::c_int) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: fcntl F_GETFL on a descriptor number only reads its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags == -1 || flags & libc::O_ACCMODE != libc::O_RDWR {
        return false;
    }
    let Ok(null) = std::fs::metadata("/dev/null") else {
        return false;
    };
    // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable `stat` for the duration of the call.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    (st.st_mode & libc::S_IFMT) == libc::S_IFCHR && st.st_rdev as u64 == null.rdev()
}

/// Writes `bytes` to standard output and flushes.
///
/// A closed pipe (the reader exited, as `| head` does) is not an error: the write stops and
/// `Ok` is returned, as Unix tools end quietly. A closed standard output is
/// [`WriteError::StdoutClosed`]; other failures (a full disk behind `> FILE`) are
/// [`WriteError::Io`].
pub fn write_stdout(bytes: &[u8]) -> Result<(), WriteError> {
    check_stdout()?;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(|e| WriteError::io(Path::new("-"), e)),
    }
}
