//! Writing results: to stdout, or atomically to a file (temp file, then rename).

use std::io::Write;
use std::path::Path;

use anyhow::Context;

/// Writes `text` to `path` atomically (a temp file beside it, then a rename), or to stdout
/// when `path` is `None`. A failed write never leaves a half-written file behind.
pub fn write_output(path: Option<&Path>, text: &str) -> anyhow::Result<()> {
    match path {
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
            Ok(())
        }
        Some(path) => write_atomic(path, text.as_bytes()),
    }
}

/// Writes `bytes` to `path` through a temp file in the same directory and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path
        .file_name()
        .with_context(|| format!("output path {} has no file name", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(err) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(err).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}

/// Checks, before any long work starts, that `path` can be written later: its directory exists
/// and is a directory. (A first, simple check; the safe-writer work makes it thorough.)
pub fn check_output(path: &Path) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        anyhow::bail!(
            "cannot write {}: directory {} does not exist; create it or choose another path",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}
