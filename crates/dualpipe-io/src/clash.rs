//! Output paths checked against a command's inputs and against each other, before any work.
//!
//! Two paths are the same file when both exist and have the same device and inode (hard links,
//! symbolic links, `./x` and `x`, `/dev/stdout` and a redirected standard output alike), or when
//! the output does not exist yet and its resolved form (symbolic links of its last component
//! followed, its folder made canonical) equals the other's. `-` stands for standard input (as an
//! input) or standard output (as an output) and is compared by the file its descriptor is open
//! on.
//!
//! Only regular files (and outputs that do not exist yet) clash: two outputs on `/dev/null`, a
//! terminal or a pipe are streams, not files one of them would replace.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::target::parent_of;

/// Most symbolic links followed from a path before giving up (as the kernel's `ELOOP`).
const MAX_LINKS: usize = 40;

/// One path a command reads or writes, with the setting (a field, a flag) or role that named it.
#[derive(Clone, Copy, Debug)]
pub struct Named<'a> {
    /// The setting as the caller words it (`log`; the command line, `--log`), or a role
    /// (`standard output (the summary)`).
    pub name: &'a str,
    /// The path as given (`-`: standard input for an input, standard output for an output).
    pub path: &'a Path,
}

impl<'a> Named<'a> {
    /// `path`, named by `name`.
    pub fn new(name: &'a str, path: &'a Path) -> Named<'a> {
        Named { name, path }
    }
}

/// An output that would overwrite an input, or two outputs that would overwrite each other.
#[derive(Debug, thiserror::Error)]
pub enum PathClash {
    /// An output is the same file as an input: writing it would destroy the input.
    #[error(
        "{} is the same file as {}: writing it would destroy the input; give {output_name} \
         another path",
        show(output_name, output),
        show(input_name, input)
    )]
    OutputIsInput {
        /// The output's name.
        output_name: String,
        /// The output's path as given.
        output: PathBuf,
        /// The input's name.
        input_name: String,
        /// The input's path as given.
        input: PathBuf,
    },
    /// Two outputs are the same file: one would replace the other.
    #[error(
        "{} and {} are the same file: one would replace the other; give each its own path",
        show(first_name, first),
        show(second_name, second)
    )]
    SameOutput {
        /// The first output's name.
        first_name: String,
        /// The first output's path as given.
        first: PathBuf,
        /// The second output's name.
        second_name: String,
        /// The second output's path as given.
        second: PathBuf,
    },
}

/// `name path`, or the name alone for `-` (standard input or output, named by it).
fn show(name: &str, path: &Path) -> String {
    if path.as_os_str() == "-" {
        name.to_string()
    } else {
        format!("{name} {}", path.display())
    }
}

/// What identifies a file: its device and inode when it exists, its resolved path when not.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Identity {
    /// An existing regular file.
    Inode(u64, u64),
    /// A file that does not exist yet, by its resolved path.
    Path(PathBuf),
}

/// Checks that no output in `outputs` is the same file as an input in `inputs` or as another
/// output (module documentation: what "the same" means). Nothing is read or written. Paths that
/// cannot be resolved (a missing folder, a loop of links) are left to the reader or the writer,
/// which say what is wrong with them.
///
/// ```
/// use dualpipe_io::{check_clashes, Named};
/// let dir = tempfile::tempdir().unwrap();
/// let data = dir.path().join("data.txt");
/// std::fs::write(&data, "corpus").unwrap();
/// let err = check_clashes(&[Named::new("--data", &data)], &[Named::new("--log", &data)]);
/// assert!(err.unwrap_err().to_string().contains("--log"));
/// ```
pub fn check_clashes(inputs: &[Named<'_>], outputs: &[Named<'_>]) -> Result<(), PathClash> {
    // By identity, so a command with many outputs (a manifest per job) is checked in linear
    // time.
    let mut ins: HashMap<Identity, Named> = HashMap::new();
    for n in inputs {
        if let Some(id) = identity(n.path, Side::Input) {
            ins.entry(id).or_insert(*n);
        }
    }
    let mut seen: HashMap<Identity, Named> = HashMap::new();
    for out in outputs {
        let Some(id) = identity(out.path, Side::Output) else {
            continue;
        };
        if let Some(input) = ins.get(&id) {
            return Err(PathClash::OutputIsInput {
                output_name: out.name.to_string(),
                output: out.path.to_path_buf(),
                input_name: input.name.to_string(),
                input: input.path.to_path_buf(),
            });
        }
        if let Some(first) = seen.get(&id) {
            return Err(PathClash::SameOutput {
                first_name: first.name.to_string(),
                first: first.path.to_path_buf(),
                second_name: out.name.to_string(),
                second: out.path.to_path_buf(),
            });
        }
        seen.insert(id, *out);
    }
    Ok(())
}

/// Whether a path is read or written (what `-` means).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Input,
    Output,
}

/// The identity of `path`, or `None` when it is not a file that can be clobbered (a device, a
/// FIFO, a folder) or cannot be resolved.
fn identity(path: &Path, side: Side) -> Option<Identity> {
    if path.as_os_str() == "-" {
        let fd = match side {
            Side::Input => libc::STDIN_FILENO,
            Side::Output => libc::STDOUT_FILENO,
        };
        return descriptor_identity(fd);
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Some(Identity::Inode(meta.dev(), meta.ino())),
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && side == Side::Output => {
            resolved(path).map(Identity::Path)
        }
        Err(_) => None,
    }
}

/// The device and inode of the regular file descriptor `fd` is open on.
fn descriptor_identity(fd: libc::c_int) -> Option<Identity> {
    // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable `stat` for the duration of the call.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    ((st.st_mode & libc::S_IFMT) == libc::S_IFREG)
        .then_some(Identity::Inode(st.st_dev as u64, st.st_ino as u64))
}

/// A path that does not exist yet, resolved: the links of its last component followed, its
/// folder made canonical.
fn resolved(path: &Path) -> Option<PathBuf> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let dest = std::fs::read_link(&current).ok()?;
                current = if dest.is_absolute() {
                    dest
                } else {
                    parent_of(&current).join(dest)
                };
            }
            _ => {
                let dir = parent_of(&current).canonicalize().ok()?;
                return Some(dir.join(current.file_name()?));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named<'a>(name: &'a str, path: &'a Path) -> Named<'a> {
        Named::new(name, path)
    }

    #[test]
    fn an_output_on_an_input_is_refused_by_inode_and_by_link() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data.txt");
        std::fs::write(&data, "corpus").unwrap();
        let hard = dir.path().join("hard.txt");
        std::fs::hard_link(&data, &hard).unwrap();
        let soft = dir.path().join("soft.txt");
        std::os::unix::fs::symlink("data.txt", &soft).unwrap();
        let dotted = dir.path().join(".").join("data.txt");
        for out in [&data, &hard, &soft, &dotted] {
            let err = check_clashes(&[named("data", &data)], &[named("log", out)])
                .unwrap_err()
                .to_string();
            assert!(err.contains("log") && err.contains("data"), "{err}");
        }
        let other = dir.path().join("run.jsonl");
        check_clashes(&[named("data", &data)], &[named("log", &other)]).unwrap();
    }

    #[test]
    fn two_outputs_on_one_new_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("out.json");
        let b = dir.path().join("sub/../out.json");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let err = check_clashes(&[], &[named("log", &a), named("save", &b)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("log") && err.contains("save"), "{err}");
        // A link to a file that does not exist yet is the file it would create.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("out.json", &link).unwrap();
        assert!(check_clashes(&[], &[named("log", &a), named("svg", &link)]).is_err());
    }

    #[test]
    fn devices_and_folders_never_clash() {
        let null = Path::new("/dev/null");
        check_clashes(
            &[named("data", null)],
            &[named("output", null), named("svg", null)],
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        check_clashes(
            &[named("init-from", dir.path())],
            &[named("log", dir.path())],
        )
        .unwrap();
    }
}
