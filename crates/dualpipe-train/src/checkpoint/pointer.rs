//! The `latest` pointer: a one-line regular file inside the checkpoint directory naming the
//! newest checkpoint (`step-NNNNNN`).
//!
//! It is only ever created or replaced as a regular file of the directory itself: the line
//! goes into a temp file created beside it (exclusively, so a planted link is never opened),
//! synced, and renamed over the name `latest` (a rename replaces the name, never what a link
//! there points to). An existing `latest` that is not a regular file holding a pointer (a
//! symbolic link, a directory, a FIFO, a user's own file) is never replaced: writing is an
//! error naming it. Reading opens nothing but a regular file, without following a link or
//! waiting on a FIFO, and reads at most [`MAX_BYTES`].

use std::fs::File;
use std::io::Write;
use std::path::Path;

use super::writer::{nonce, parse_dir_name, sync_dir};
use super::CheckpointError;

/// The pointer's file name.
pub const LATEST: &str = "latest";
/// The most bytes read of a pointer (a pointer is one short line).
pub const MAX_BYTES: u64 = 256;

/// What is at `root/latest`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pointer {
    /// Nothing.
    Absent,
    /// A pointer naming this checkpoint directory (`step-NNNNNN`).
    Names(String),
    /// Something that is not a pointer, and what it is.
    Foreign(String),
}

/// Reads `root/latest` (see the [module](self) documentation).
pub fn read(root: &Path) -> Pointer {
    let path = root.join(LATEST);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Pointer::Absent,
        Err(e) => return Pointer::Foreign(format!("cannot be examined ({e})")),
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Pointer::Foreign("a symbolic link".into());
    }
    if kind.is_dir() {
        return Pointer::Foreign("a directory".into());
    }
    if !kind.is_file() {
        return Pointer::Foreign("not a regular file (a FIFO, socket or device)".into());
    }
    if meta.len() > MAX_BYTES {
        return Pointer::Foreign(format!("a file of {} bytes, not a pointer", meta.len()));
    }
    // The one input path (the link was refused above, so no link is followed here).
    let limit = dualpipe_io::limits::Limit::new(MAX_BYTES, "the cap of a checkpoint pointer");
    let text = match dualpipe_io::read_regular(&path, limit, LATEST) {
        Ok(text) => text,
        Err(e) => return Pointer::Foreign(format!("cannot be read ({e})")),
    };
    let name = std::str::from_utf8(&text)
        .ok()
        .map(|t| t.trim_end_matches('\n'));
    match name {
        Some(name) if parse_dir_name(name).is_some() => Pointer::Names(name.to_string()),
        _ => Pointer::Foreign("a file that does not hold a step-NNNNNN pointer".into()),
    }
}

/// Fails when `root/latest` exists and is not a pointer (so it must not be replaced).
pub fn check_replaceable(root: &Path) -> Result<(), CheckpointError> {
    match read(root) {
        Pointer::Foreign(what) => Err(CheckpointError::ForeignPointer {
            path: root.join(LATEST),
            what,
        }),
        Pointer::Absent | Pointer::Names(_) => Ok(()),
    }
}

/// Points `root/latest` at the checkpoint directory `name`, atomically (see the
/// [module](self) documentation).
pub fn write(root: &Path, name: &str) -> Result<(), CheckpointError> {
    check_replaceable(root)?;
    let tmp = root.join(format!(".{LATEST}.tmp-{}-{}", std::process::id(), nonce()));
    let written = File::create_new(&tmp).and_then(|mut f| {
        f.write_all(format!("{name}\n").as_bytes())?;
        f.sync_all()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(CheckpointError::io(&tmp, "write", &e));
    }
    if let Err(e) = check_replaceable(root) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, root.join(LATEST)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        CheckpointError::io(&root.join(LATEST), "replace", &e)
    })?;
    sync_dir(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pointer_is_written_only_as_a_regular_file_of_the_directory() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        assert_eq!(read(r), Pointer::Absent);
        write(r, "step-000002").unwrap();
        assert_eq!(read(r), Pointer::Names("step-000002".into()));
        write(r, "step-000004").unwrap();
        assert_eq!(read(r), Pointer::Names("step-000004".into()));

        // A symbolic link: neither it nor its target is touched.
        let victim = r.join("victim.txt");
        std::fs::write(&victim, "my notes\n").unwrap();
        std::fs::remove_file(r.join(LATEST)).unwrap();
        std::os::unix::fs::symlink(&victim, r.join(LATEST)).unwrap();
        let err = write(r, "step-000006").unwrap_err().to_string();
        assert!(
            err.contains("symbolic link") && err.contains(LATEST),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "my notes\n");
        assert!(matches!(read(r), Pointer::Foreign(_)));

        // A user's own file named `latest`.
        std::fs::remove_file(r.join(LATEST)).unwrap();
        std::fs::write(r.join(LATEST), "my notes: the latest results\n").unwrap();
        let err = write(r, "step-000006").unwrap_err().to_string();
        assert!(err.contains("does not hold"), "{err}");
        assert_eq!(
            std::fs::read_to_string(r.join(LATEST)).unwrap(),
            "my notes: the latest results\n"
        );

        // A FIFO is never opened (this would block), a huge file never read.
        std::fs::remove_file(r.join(LATEST)).unwrap();
        let c = std::ffi::CString::new(r.join(LATEST).to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(read(r), Pointer::Foreign(w) if w.contains("FIFO")));
        assert!(write(r, "step-000006").is_err());
        std::fs::remove_file(r.join(LATEST)).unwrap();
        let big = File::create(r.join(LATEST)).unwrap();
        big.set_len(3 << 30).unwrap();
        assert!(matches!(read(r), Pointer::Foreign(w) if w.contains("bytes")));
        // No temp file is left behind.
        let names: Vec<String> = std::fs::read_dir(r)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
    }
}
