//! Temp files that exist right now, removed if SIGINT, SIGTERM or SIGHUP ends the process.
//!
//! A long-running command can ask ([`defer_signals`]) that the first such signal be only
//! recorded ([`interrupted`]), so it stops at a point of its choosing and finishes its writes;
//! a second SIGINT or SIGHUP then ends the process at once, as before. A repeated SIGTERM does
//! not: cluster managers send it more than once (Slurm twice within milliseconds when it
//! preempts a job) and follow it with SIGKILL when their grace period ends.
//!
//! Creating a temp file and registering it happen under one lock, and so do renaming it and
//! unregistering it, so the signal thread (which takes the same lock) never misses a temp file
//! nor removes a file that was already renamed into place.

use std::fs::Permissions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

use tempfile::{NamedTempFile, TempPath};

static TEMPS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();
/// Whether the first signal is only recorded ([`defer_signals`]).
static DEFER: AtomicBool = AtomicBool::new(false);
/// The first signal recorded while deferred (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

/// From now on, the first SIGINT, SIGTERM or SIGHUP is recorded instead of ending the
/// process: the caller polls [`interrupted`] and stops where it can. A second SIGINT or SIGHUP
/// ends the process at once (temp files removed, exit code `128 + signal`); a second SIGTERM
/// is ignored (a cluster manager's repeated request to stop, its SIGKILL to follow).
pub fn defer_signals() {
    DEFER.store(true, Ordering::SeqCst);
    install();
}

/// The signal that asked the process to stop while signals were deferred, if one did.
pub fn interrupted() -> Option<i32> {
    match PENDING.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

fn temps() -> MutexGuard<'static, Vec<PathBuf>> {
    TEMPS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Starts the thread that waits for SIGINT, SIGTERM and SIGHUP, removes every registered temp
/// file and exits with `128 + signal`. Done once per process; later calls do nothing.
fn install() {
    INSTALL.call_once(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("dualpipe-io-signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    let first =
                        PENDING.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
                    if DEFER.load(Ordering::SeqCst) && (first.is_ok() || signal == SIGTERM) {
                        continue;
                    }
                    let list = temps();
                    for path in list.iter() {
                        let _ = std::fs::remove_file(path);
                    }
                    std::process::exit(128 + signal);
                }
            });
        drop(spawned);
    });
}

/// Creates a temp file in `dir` named `.{name}.XXXXXX.tmp` (random letters; created with
/// `O_CREAT | O_EXCL`, so nothing already there, link or file, is ever opened) with
/// `permissions` (the umask applies), and registers it for removal on a signal.
pub(crate) fn create(
    dir: &Path,
    name: &str,
    permissions: Permissions,
) -> std::io::Result<NamedTempFile> {
    install();
    let mut list = temps();
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(permissions)
        .tempfile_in(dir)?;
    list.push(tmp.path().to_path_buf());
    Ok(tmp)
}

/// Renames the closed temp file `tmp` over `file` and unregisters it; on failure the temp
/// file is removed.
pub(crate) fn persist(tmp: TempPath, file: &Path) -> std::io::Result<()> {
    let mut list = temps();
    let path = tmp.to_path_buf();
    list.retain(|p| p != &path);
    tmp.persist(file).map_err(|e| e.error)
}

/// Removes the closed temp file `tmp` (a staged write that will not be committed) and
/// unregisters it.
pub(crate) fn discard(tmp: TempPath) {
    let mut list = temps();
    let path = tmp.to_path_buf();
    list.retain(|p| p != &path);
    drop(tmp);
}
