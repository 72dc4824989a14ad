//! A checkpoint directory is owned by one run.
//!
//! - Every manifest names the run that wrote it ([`RunIdentity`]); a fresh run refuses a
//!   directory that already holds checkpoints, and a resumed run one that holds another
//!   run's ([`check_owner`]).
//! - While a run writes, it holds an advisory lock on `DIR/.lock` ([`DirLock`]): a second run
//!   into the same directory is refused, naming the holder. The system releases the lock when
//!   the process ends, however it ends, so a killed run never leaves a stale lock.
//! - Temp directories that runs killed mid-write left behind (`.step-NNNNNN.tmp-PID-N`) are
//!   removed when a run starts, but only when process PID is gone ([`remove_stale_temps`]).
//! - Only directories this program wrote (holding our manifest) are ever pruned
//!   ([`is_ours`]), and only those (or ours whose manifest was lost) are replaced by a
//!   checkpoint of the same step ([`replaceable`]): a user's folder, file or link never.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::format::{Manifest, RunIdentity, FORMAT, MANIFEST, STATE};
use super::writer::checkpoint_dirs;
use super::CheckpointError;

/// The lock file's name.
pub const LOCK: &str = ".lock";

/// The manifest of the checkpoint directory `dir` when it is one this program wrote (a
/// regular `manifest.json` of our format), else `None`.
pub fn our_manifest(dir: &Path) -> Option<Manifest> {
    let manifest: Manifest = serde_json::from_slice(&small_file(&dir.join(MANIFEST))?).ok()?;
    (manifest.format == FORMAT).then_some(manifest)
}

/// The bytes of `path` when it is a regular file (never a link), read through the one input
/// path under the manifest's cap.
fn small_file(path: &Path) -> Option<Vec<u8>> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.file_type().is_file() {
        return None;
    }
    dualpipe_io::read_regular(path, dualpipe_io::limits::MANIFEST, MANIFEST).ok()
}

/// Whether publishing a checkpoint may replace `dir`: a directory (not a link) that this
/// program wrote, by its manifest or, when that was lost, by its `state.json` of our format.
/// A user's folder, file or link is never replaceable.
pub fn replaceable(dir: &Path) -> bool {
    let is_dir = std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_dir());
    let our_state = || {
        small_file(&dir.join(STATE))
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v["format"] == FORMAT)
    };
    is_dir && (is_ours(dir) || our_state())
}

/// Whether `dir` is a checkpoint this program wrote (see [`our_manifest`]).
pub fn is_ours(dir: &Path) -> bool {
    our_manifest(dir).is_some()
}

/// Checks that `run` may write into `root`: a fresh run (`resuming` false) only into a
/// directory that holds no checkpoint of ours; a resumed one only where every checkpoint is
/// of the same run (or of a version that did not record runs).
pub fn check_owner(root: &Path, run: &RunIdentity, resuming: bool) -> Result<(), CheckpointError> {
    let mut dirs = checkpoint_dirs(root)?;
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
    for (_, dir) in dirs {
        let Some(manifest) = our_manifest(&dir) else {
            continue;
        };
        let theirs = manifest.run.as_ref().map(|r| r.id.clone());
        let other = match &theirs {
            Some(id) => *id != run.id,
            None => !resuming,
        };
        if other {
            return Err(CheckpointError::Occupied {
                dir: root.to_path_buf(),
                newest: dir,
                run: manifest.run.map(Box::new),
            });
        }
    }
    Ok(())
}

/// The advisory lock a run holds on its checkpoint directory while it writes.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Takes the lock of `root` for `run` (without waiting), recording the holder (process,
    /// run) in the lock file; fails naming the holder when another process holds it.
    pub fn acquire(root: &Path, run: &RunIdentity) -> Result<Self, CheckpointError> {
        let path = root.join(LOCK);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| CheckpointError::io(&path, "open the lock file", &e))?;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                // Our own lock file, already open and bounded: not a user input.
                let mut holder = String::new();
                let _ = (&file).take(512).read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(CheckpointError::InUse {
                    dir: root.to_path_buf(),
                    holder: if holder.is_empty() {
                        "another process".into()
                    } else {
                        holder.to_string()
                    },
                });
            }
            return Err(CheckpointError::io(&path, "lock", &err));
        }
        let line = format!("process {} (run {})\n", std::process::id(), run.id);
        let recorded = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(line.as_bytes()));
        recorded.map_err(|e| CheckpointError::io(&path, "write", &e))?;
        Ok(DirLock { _file: file })
    }
}

/// Whether process `pid` is alive (on this machine).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The process of a temp name this program writes (`.step-NNNNNN.tmp-PID-N`,
/// `.step-NNNNNN.old-PID-N`, `.latest.tmp-PID-N`).
fn temp_pid(name: &str) -> Option<u32> {
    if !name.starts_with(".step-") && !name.starts_with(".latest.") {
        return None;
    }
    let (_, rest) = name
        .split_once(".tmp-")
        .or_else(|| name.split_once(".old-"))?;
    let (pid, n) = rest.split_once('-')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Removes the temp directories and files of `root` that processes which are gone left
/// behind (killed while writing); returns what was removed. A live process's are kept.
pub fn remove_stale_temps(root: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(temp_pid) else {
            continue;
        };
        if pid == std::process::id() || alive(pid) {
            continue;
        }
        let path = entry.path();
        let gone = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path).is_ok(),
            Ok(t) if t.is_file() => std::fs::remove_file(&path).is_ok(),
            _ => false,
        };
        if gone {
            removed.push(path);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str) -> RunIdentity {
        RunIdentity {
            id: id.into(),
            seed: 0,
            task: "markov".into(),
            data_digest: None,
        }
    }

    #[test]
    fn a_second_writer_is_refused_naming_the_holder() {
        let root = tempfile::tempdir().unwrap();
        let lock = DirLock::acquire(root.path(), &run("aaaa")).unwrap();
        let err = DirLock::acquire(root.path(), &run("bbbb")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("in use") && text.contains("run aaaa"),
            "{text}"
        );
        drop(lock);
        DirLock::acquire(root.path(), &run("bbbb")).unwrap();
    }

    #[test]
    fn only_dead_processes_temps_are_removed() {
        let root = tempfile::tempdir().unwrap();
        // A pid that cannot exist (above the kernel's pid_max).
        let dead = root.path().join(".step-000004.tmp-2147483600-77");
        let live = root
            .path()
            .join(format!(".step-000004.tmp-{}-78", std::process::id()));
        let other = root.path().join(".step-000004.tmp-job0000000000000001");
        let users = root.path().join(".step-000004.tmp-notes");
        for d in [&dead, &live, &other, &users] {
            std::fs::create_dir(d).unwrap();
        }
        let removed = remove_stale_temps(root.path());
        assert_eq!(removed, vec![dead.clone()]);
        assert!(!dead.exists() && live.exists() && other.exists() && users.exists());
        assert_eq!(temp_pid(".latest.tmp-12-3"), Some(12));
        assert_eq!(temp_pid(".step-000001.old-12-3"), Some(12));
        assert_eq!(temp_pid("step-000001"), None);
    }

    #[test]
    fn a_users_folder_or_link_at_a_checkpoints_name_is_never_replaced() {
        use crate::checkpoint::writer::{dir_name, write_dir};
        let root = tempfile::tempdir().unwrap();
        let files = vec![("a.safetensors".to_string(), b"abc".to_vec())];
        let users = root.path().join(dir_name(2));
        std::fs::create_dir(&users).unwrap();
        std::fs::write(users.join("notes.txt"), "mine").unwrap();
        let err = write_dir(root.path(), 2, &files, 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("never replaced"), "{err}");
        assert_eq!(
            std::fs::read_to_string(users.join("notes.txt")).unwrap(),
            "mine"
        );
        let link = root.path().join(dir_name(3));
        std::os::unix::fs::symlink(&users, &link).unwrap();
        assert!(write_dir(root.path(), 3, &files, 0).is_err());
        assert!(link.is_symlink() && users.join("notes.txt").is_file());
        // no temp directory left behind; a checkpoint of ours is still replaced
        let names = |p: &Path| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert!(!names(root.path()).iter().any(|n| n.contains(".tmp-")));
        write_dir(root.path(), 4, &files, 0).unwrap();
        write_dir(root.path(), 4, &files, 0).unwrap();
        assert!(is_ours(&root.path().join(dir_name(4))));
        // ours with its manifest lost (damage): still replaced
        std::fs::write(
            root.path().join(dir_name(4)).join(STATE),
            r#"{"format":"dualpipe-checkpoint"}"#,
        )
        .unwrap();
        std::fs::remove_file(root.path().join(dir_name(4)).join(MANIFEST)).unwrap();
        write_dir(root.path(), 4, &files, 0).unwrap();
        assert!(is_ours(&root.path().join(dir_name(4))));
    }
}
