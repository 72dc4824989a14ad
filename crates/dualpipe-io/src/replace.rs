//! Atomic replacement: a temp file beside the target, written and synced, then renamed over it.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tempfile::TempPath;

use crate::cleanup;
use crate::error::WriteError;
use crate::target::parent_of;

/// Permission bits of a new file before the umask, as `open(2)` with `O_CREAT` by most tools.
const NEW_FILE_MODE: u32 = 0o666;

/// A file written completely into its temp file beside the target, not yet renamed into place.
/// Dropped without [`Staged::commit`], the temp file is removed and the target is untouched.
/// The temp file is closed once written: a stage keeps its name only, so a batch of any
/// number of files holds no descriptor per file.
pub(crate) struct Staged {
    path: PathBuf,
    file: PathBuf,
    tmp: Option<TempPath>,
}

impl Staged {
    /// Writes `bytes` into a new temp file beside `file` (`path` as given, for messages), synced,
    /// with the permission bits, and where allowed the owner, of the `file` it will replace.
    pub(crate) fn new(path: &Path, file: &Path, bytes: &[u8]) -> Result<Staged, WriteError> {
        let io = |e| WriteError::io(path, e);
        let name = file
            .file_name()
            .ok_or_else(|| WriteError::IsDirectory { path: path.into() })?
            .to_string_lossy()
            .into_owned();
        let old = std::fs::metadata(file).ok().filter(|m| m.is_file());
        let mut tmp = cleanup::create(
            &parent_of(file),
            &name,
            std::fs::Permissions::from_mode(NEW_FILE_MODE),
        )
        .map_err(io)?;
        let written = write_synced(tmp.as_file_mut(), old.as_ref(), bytes);
        // Closed here, kept by name (removed on drop, and by the signal handler meanwhile).
        let staged = Staged {
            path: path.into(),
            file: file.into(),
            tmp: Some(tmp.into_temp_path()),
        };
        written.map_err(io)?;
        Ok(staged)
    }

    /// Renames the temp file over the target.
    pub(crate) fn commit(mut self) -> Result<(), WriteError> {
        let tmp = self.tmp.take().expect("a staged file is committed once");
        cleanup::persist(tmp, &self.file).map_err(|e| WriteError::io(&self.path, e))
    }
}

/// Writes `bytes` into `handle` and syncs it, with the permission bits (and, where allowed,
/// the owner) of `old`, the file it will replace.
fn write_synced(
    handle: &mut std::fs::File,
    old: Option<&std::fs::Metadata>,
    bytes: &[u8],
) -> std::io::Result<()> {
    if let Some(old) = old {
        // The owner first: chown clears set-id bits, which set_permissions then restores.
        let _ = std::os::unix::fs::fchown(&*handle, Some(old.uid()), Some(old.gid()));
        handle.set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o7777))?;
    }
    handle.write_all(bytes)?;
    handle.sync_all()
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            cleanup::discard(tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_stage_leaves_nothing_and_a_commit_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("out.txt");
        std::fs::write(&file, "old").unwrap();
        let staged = Staged::new(&file, &file, b"new").unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
        drop(staged);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        Staged::new(&file, &file, b"new").unwrap().commit().unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// Open descriptors of this process.
    fn open_descriptors() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    #[test]
    fn a_stage_holds_no_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let before = open_descriptors();
        let staged: Vec<Staged> = (0..64)
            .map(|i| {
                let file = dir.path().join(format!("f{i}"));
                Staged::new(&file, &file, b"x").unwrap()
            })
            .collect();
        // Other tests' threads may open a few files meanwhile, never 64.
        assert!(
            open_descriptors() < before + 32,
            "a descriptor per staged file"
        );
        for stage in staged {
            stage.commit().unwrap();
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 64);
    }
}
