//! Atomic replacement: a temp file beside the target, written and synced, then renamed over it.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

use crate::cleanup;
use crate::error::WriteError;
use crate::target::parent_of;

/// Permission bits of a new file before the umask, as `open(2)` with `O_CREAT` by most tools.
const NEW_FILE_MODE: u32 = 0o666;

/// A file written completely into its temp file beside the target, not yet renamed into place.
/// Dropped without [`Staged::commit`], the temp file is removed and the target is untouched.
pub(crate) struct Staged {
    path: PathBuf,
    file: PathBuf,
    tmp: Option<NamedTempFile>,
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
        let tmp = cleanup::create(
            &parent_of(file),
            &name,
            std::fs::Permissions::from_mode(NEW_FILE_MODE),
        )
        .map_err(io)?;
        let mut staged = Staged {
            path: path.into(),
            file: file.into(),
            tmp: Some(tmp),
        };
        let handle = staged.tmp.as_mut().expect("just created").as_file_mut();
        if let Some(old) = &old {
            // The owner first: chown clears set-id bits, which set_permissions then restores.
            let _ = std::os::unix::fs::fchown(&*handle, Some(old.uid()), Some(old.gid()));
            handle
                .set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o7777))
                .map_err(io)?;
        }
        handle.write_all(bytes).map_err(io)?;
        handle.sync_all().map_err(io)?;
        Ok(staged)
    }

    /// Renames the temp file over the target.
    pub(crate) fn commit(mut self) -> Result<(), WriteError> {
        let tmp = self.tmp.take().expect("a staged file is committed once");
        cleanup::persist(tmp, &self.file).map_err(|e| WriteError::io(&self.path, e))
    }
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
}
