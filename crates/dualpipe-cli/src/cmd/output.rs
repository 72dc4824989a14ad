//! The CLI's thin adapter over [`dualpipe_io`], the one output writer: every `--output`,
//! `--svg` and `--trace` goes through here. See that crate for the rules (atomic replace beside
//! the target, devices / FIFOs / `/dev/fd/N` written in place, links written through,
//! permission bits kept, no temp file left on failure or Ctrl-C, `| head` ends quietly).
//!
//! A path that cannot be written (missing folder, a folder, no permission) is a usage error
//! (exit 2); a failure of the system at write time (disk full) and a closed standard output
//! (`>&-`) are errors with exit 1.

use std::path::{Path, PathBuf};

use dualpipe_io::{Batch, OutputPlan, WriteError};

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

/// Standard output's name in a plan (`--log /dev/stdout` while the summary goes there too).
const STDOUT: &str = "standard output";

/// Checks a command's plan of paths ([`dualpipe_io::OutputPlan`]) before any work: a clash or
/// an output that cannot be written is a usage error naming the flags.
pub fn check_plan(plan: &OutputPlan) -> anyhow::Result<()> {
    plan.check().map_err(|e| {
        if e.is_usage() {
            UsageError(e.to_string()).into()
        } else {
            anyhow::Error::new(e)
        }
    })
}

/// The one check of a command's paths, before any work, through [`check_plan`]: every output
/// can be written, and no output is the same file as an input or as another output. `main` is
/// the main result's flag and path (`None`: standard output, which then takes part in the
/// clash check too); `side` the other outputs; `inputs` every file the command reads.
pub fn check_paths(
    inputs: &[(&str, Option<&Path>)],
    main: (&str, Option<&Path>),
    side: &[(&str, Option<&Path>)],
) -> anyhow::Result<()> {
    check_plan(&plan(inputs, main, side))
}

/// The plan of [`check_paths`], for a command that declares more (files in a folder).
pub fn plan(
    inputs: &[(&str, Option<&Path>)],
    main: (&str, Option<&Path>),
    side: &[(&str, Option<&Path>)],
) -> OutputPlan {
    let mut plan = OutputPlan::new();
    for (flag, path) in inputs {
        plan.input(flag, *path);
    }
    match main.1 {
        Some(path) => plan.output(main.0, Some(path)),
        None => plan.output(STDOUT, Some(Path::new("-"))),
    };
    for (flag, path) in side {
        plan.output(flag, *path);
    }
    plan
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
