//! The state of standard output when the process started, recorded before Rust's runtime
//! reopens a closed descriptor 0, 1 or 2 on `/dev/null` (which it does in `main`'s prologue,
//! after the loader has run the constructors of `.init_array`).

use std::sync::atomic::{AtomicU8, Ordering};

/// What descriptor 1 was when the process started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtStart {
    /// Open (to anything: a terminal, a file, a pipe, `/dev/null`).
    Open,
    /// Closed (`>&-`); the runtime has since put `/dev/null` there.
    Closed,
    /// Not recorded: no constructor ran on this platform.
    Unknown,
}

const UNKNOWN: u8 = 0;
const OPEN: u8 = 1;
const CLOSED: u8 = 2;

/// Descriptor 1 at start, written once by [`record_stdout_at_start`].
static STDOUT_AT_START: AtomicU8 = AtomicU8::new(UNKNOWN);

/// The state recorded at start.
pub(crate) fn stdout_at_start() -> AtStart {
    match STDOUT_AT_START.load(Ordering::Relaxed) {
        OPEN => AtStart::Open,
        CLOSED => AtStart::Closed,
        _ => AtStart::Unknown,
    }
}

/// Records whether descriptor 1 is open. Run by the loader before `main` (and, in a shared
/// library, when it is loaded): it calls only `fcntl`, which is safe that early.
#[allow(dead_code)] // on a Unix without a known constructor section nothing refers to it
extern "C" fn record_stdout_at_start() {
    // SAFETY: fcntl F_GETFD on a descriptor number only reads its descriptor flags.
    let open = unsafe { libc::fcntl(libc::STDOUT_FILENO, libc::F_GETFD) } != -1;
    STDOUT_AT_START.store(if open { OPEN } else { CLOSED }, Ordering::Relaxed);
}

/// The constructor's entry in the list the ELF loader runs before `main`.
#[cfg(any(
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd",
    target_os = "netbsd",
    target_os = "openbsd",
    target_os = "dragonfly",
    target_os = "illumos",
    target_os = "solaris"
))]
#[used]
#[link_section = ".init_array"]
static RECORD_AT_START: extern "C" fn() = record_stdout_at_start;

/// The constructor's entry in the list dyld runs before `main`.
#[cfg(target_vendor = "apple")]
#[used]
#[link_section = "__DATA,__mod_init_func"]
static RECORD_AT_START: extern "C" fn() = record_stdout_at_start;
