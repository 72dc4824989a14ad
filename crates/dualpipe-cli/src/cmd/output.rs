//! The CLI's thin adapter over [`dualpipe_io`], the one output writer: every `--output`,
//! `--svg` and `--trace` goes through here. See that crate for the rules (atomic replace beside
//! the target, devices / FIFOs / `/dev/fd/N` written in place, links written through,
//! permission bits kept, no temp file left on failure or Ctrl-C, `| head` ends quietly).
//!
//! A path that cannot be written (missing folder, a folder, no permission) is a usage error
//! (exit 2); a failure of the system at write time (disk full) and a closed standard output
//! (`>&-`) are errors with exit 1.

use std::path::{Path, PathBuf};

use dualpipe_io::{Batch, Named, WriteError};

use super::UsageError;

/// Maps a writer error to the CLI's: a usage error (exit 2) for a path that cannot be written,
/// a plain error (exit 1) otherwise.
fn cli_error(err: WriteError) -> anyhow::Error {
    if err.is_usage() {
        UsageError(err.to_string()).into()
    } else {
        anyhow::Error::new(err)
    }
}

/// Writes `text` to `path` (atomically for a regular file; `-` is stdout), or to stdout when
/// `path` is `None`. A failed write never leaves a half-written file behind.
pub fn write_output(path: Option<&Path>, text: &str) -> anyhow::Result<()> {
    match path {
        None => dualpipe_io::write_stdout(text.as_bytes()).map_err(cli_error),
        Some(path) => write_atomic(path, text.as_bytes()),
    }
}

/// Writes `bytes` to `path` by the writer's rules (the name is historical: devices, FIFOs and
/// descriptor paths are written in place, regular files replaced atomically).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    dualpipe_io::write(path, bytes).map_err(cli_error)
}

/// Checks, before any long work starts, that `path` can be written later: its folder exists
/// and is writable, it is not a folder, an existing file is writable, a device or FIFO is
/// writable, a `/dev/fd/N` is open. Refusals are usage errors naming the path.
pub fn check_output(path: &Path) -> anyhow::Result<()> {
    dualpipe_io::check(path).map(drop).map_err(cli_error)
}

/// Checks every output of a command before its work: each given path, and standard output when
/// the main result goes there (`main` is `None`), so `>&-` fails before the work.
pub fn check_outputs(main: Option<&Path>, side: &[Option<&Path>]) -> anyhow::Result<()> {
    match main {
        Some(path) => check_output(path)?,
        None => dualpipe_io::check_stdout().map_err(cli_error)?,
    }
    for path in side.iter().flatten() {
        check_output(path)?;
    }
    Ok(())
}

/// Standard output's name in a clash (`--log /dev/stdout` while the summary goes there too).
const STDOUT: &str = "standard output";

/// The one check of a command's paths, before any work: every output can be written
/// ([`check_outputs`]), and no output is the same file as an input or as another output
/// ([`dualpipe_io::check_clashes`]; a clash is a usage error naming both flags). `main` is the
/// main result's flag and path (`None`: standard output, which then takes part in the clash
/// check too); `side` the other outputs; `inputs` every file the command reads.
pub fn check_paths(
    inputs: &[(&str, Option<&Path>)],
    main: (&str, Option<&Path>),
    side: &[(&str, Option<&Path>)],
) -> anyhow::Result<()> {
    let present = |list: &[(&str, Option<&Path>)]| -> Vec<(String, PathBuf)> {
        list.iter()
            .filter_map(|(f, p)| p.map(|p| (f.to_string(), p.to_path_buf())))
            .collect()
    };
    let ins = present(inputs);
    let mut outs = vec![match main.1 {
        Some(path) => (main.0.to_string(), path.to_path_buf()),
        None => (STDOUT.to_string(), PathBuf::from("-")),
    }];
    outs.extend(present(side));
    let ins: Vec<Named> = ins.iter().map(|(f, p)| Named::new(f, p)).collect();
    let outs: Vec<Named> = outs.iter().map(|(f, p)| Named::new(f, p)).collect();
    dualpipe_io::check_clashes(&ins, &outs).map_err(|e| UsageError(e.to_string()))?;
    let side: Vec<Option<&Path>> = side.iter().map(|(_, p)| *p).collect();
    check_outputs(main.1, &side)
}

/// Writes several results together, all or nothing: every file is staged before any is put in
/// place (`None` as a path is stdout, written after the files).
pub fn write_together(files: Vec<(Option<PathBuf>, Vec<u8>)>) -> anyhow::Result<()> {
    let mut batch = Batch::new();
    let mut stdout = Vec::new();
    for (path, bytes) in files {
        match path {
            Some(path) => batch.add(&path, bytes).map_err(cli_error)?,
            None => stdout.push(bytes),
        }
    }
    batch.commit().map_err(cli_error)?;
    for bytes in stdout {
        dualpipe_io::write_stdout(&bytes).map_err(cli_error)?;
    }
    Ok(())
}
