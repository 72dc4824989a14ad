//! Standard output: a reader that went away ends quietly; a closed descriptor is an error.

use std::io::Write;
use std::path::Path;

use crate::error::WriteError;

/// Checks that standard output is open (descriptor 1 exists), so a command run with `>&-`
/// fails before its work instead of losing the result. (Rust's standard library silently
/// drops writes to a closed standard output; this check is what catches it.)
pub fn check_stdout() -> Result<(), WriteError> {
    // SAFETY: F_GETFD on a descriptor number only reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(libc::STDOUT_FILENO, libc::F_GETFD) };
    if flags == -1 {
        return Err(WriteError::StdoutClosed);
    }
    Ok(())
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
