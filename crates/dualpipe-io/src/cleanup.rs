//! Temp files that exist right now, removed if SIGINT, SIGTERM or SIGHUP ends the process.
//!
//! Creating a temp file and registering it happen under one lock, and so do renaming it and
//! unregistering it, so the signal thread (which takes the same lock) never misses a temp file
//! nor removes a file that was already renamed into place.

use std::fs::Permissions;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, Once};

use tempfile::NamedTempFile;

static TEMPS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();

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
                if let Some(signal) = signals.forever().next() {
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

/// Renames `tmp` over `file` and unregisters it; on failure the temp file is removed.
pub(crate) fn persist(tmp: NamedTempFile, file: &Path) -> std::io::Result<()> {
    let mut list = temps();
    let path = tmp.path().to_path_buf();
    list.retain(|p| p != &path);
    tmp.persist(file).map(drop).map_err(|e| e.error)
}

/// Removes `tmp` (a staged write that will not be committed) and unregisters it.
pub(crate) fn discard(tmp: NamedTempFile) {
    let mut list = temps();
    let path = tmp.path().to_path_buf();
    list.retain(|p| p != &path);
    drop(tmp);
}
