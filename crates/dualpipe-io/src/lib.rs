//! The one output writer of dualpipe: every `--output`, `--svg`, `--trace` and every file the
//! project writes goes through here.
//!
//! What a write does depends on the target ([`Target`], found by [`check`]):
//!
//! * `-` is standard output. A reader that went away (`dualpipe ... | head`) ends the write
//!   quietly ([`write_stdout`] returns `Ok`), as Unix tools do; a *closed* standard output
//!   (`>&-`) is an error ([`WriteError::StdoutClosed`]), so output is never lost silently.
//! * A path that names an open file descriptor (`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`,
//!   `/proc/self/fd/N`) and an existing target that is not a regular file (a character or block
//!   device such as `/dev/null`, a FIFO, a socket) are opened and written in place; they are
//!   never replaced.
//! * Anything else is replaced atomically: the bytes go into a temp file created beside the
//!   target with an unpredictable name, exclusively (`O_CREAT | O_EXCL`, so a planted link is
//!   never followed), synced, given the permission bits (and, where allowed, the owner) of the
//!   file it replaces, then renamed over the target. A reader sees the old file or the new
//!   one, never a half-written one; a failed write leaves the old file untouched.
//! * A target that is itself a symbolic link is written *through*, as `cp` does: the link stays
//!   and the file it points to (followed to the end of the chain) is replaced.
//!
//! Temp files are registered while they exist; Ctrl-C (SIGINT), SIGTERM and SIGHUP during a
//! write remove them before the process exits with `128 + signal` (130, 143, 129). The handler is
//! installed on the first write to a file and stays for the rest of the process. A long
//! command (training) may defer the first signal ([`defer_signals`]) and poll for it
//! ([`interrupted`]) to stop cleanly; a second signal still ends the process at once.
//!
//! Before any work, a command also checks its output paths against its input paths and against
//! each other ([`check_clashes`]): an output that is the same file as an input (same device and
//! inode, or the same resolved path for a file not yet there) or as another output is refused,
//! naming both flags. Inputs the user names are read with [`read_regular`]: regular files only
//! (a FIFO or `/dev/zero` is refused before any read, and never blocks the open), under a cap.
//!
//! A command that writes several files checks every path first ([`check`]) before its long work,
//! then writes them together with [`Batch`], which stages every file before renaming any, so a
//! failure leaves none of them behind.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("plan.json");
//! dualpipe_io::check(&path).unwrap();
//! dualpipe_io::write(&path, b"{}\n").unwrap();
//! assert_eq!(std::fs::read(&path).unwrap(), b"{}\n");
//! ```

#![cfg(unix)]
#![warn(missing_docs)]

mod batch;
mod clash;
mod cleanup;
mod error;
mod input;
pub mod limits;
mod plan;
mod replace;
mod startup;
mod stdout;
mod target;

pub use batch::Batch;
pub use clash::{check_clashes, Named, PathClash};
pub use cleanup::{defer_signals, interrupted};
pub use error::WriteError;
pub use input::{
    kind, open_regular, os_reason, read_regular, read_stdin_text, read_text, ReadError, Regular,
};
pub use plan::{OutputPlan, PlanError};
pub use stdout::{check_stdout, write_stdout};
pub use target::{check, Target};

use std::path::Path;

/// Writes `bytes` to `path` by the rules of the crate documentation (`-` is standard output).
///
/// The path is checked first ([`check`]); the error names the path and how to fix it.
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    check(path)?.write(bytes)
}
