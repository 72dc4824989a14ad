//! Reading checkpoints: verifying one against its manifest ([`Checkpoint::read`]), finding the
//! latest complete one and falling back past damaged ones ([`find_latest`], [`open`]), and
//! listing a directory ([`list`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::format::{
    self, CheckpointState, HostTensor, Manifest, FORMAT, MANIFEST, STATE, VERSION,
};
use super::pointer::{self, Pointer};
use super::writer::{checkpoint_dirs, parse_dir_name};
use super::CheckpointError;
use crate::config::memory;

/// A verified checkpoint, read into host memory.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// Its directory.
    pub path: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its `state.json`.
    pub state: CheckpointState,
    /// Every tensor, by name.
    pub tensors: HashMap<String, HostTensor>,
}

fn damaged(path: &Path, problem: String) -> CheckpointError {
    CheckpointError::Damaged {
        path: path.to_path_buf(),
        problem,
    }
}

/// Reads and checks a manifest (its format and version).
fn read_manifest(dir: &Path) -> Result<Manifest, CheckpointError> {
    let path = dir.join(MANIFEST);
    let text =
        dualpipe_io::read_regular(&path, dualpipe_io::limits::MANIFEST, MANIFEST).map_err(|e| {
            damaged(
                dir,
                format!("{e}: the write was interrupted, or it is not a checkpoint"),
            )
        })?;
    let manifest: Manifest = serde_json::from_slice(&text)
        .map_err(|e| damaged(dir, format!("{MANIFEST} is not valid: {e}")))?;
    if manifest.format != FORMAT || manifest.version != VERSION {
        return Err(damaged(
            dir,
            format!(
                "{MANIFEST} is format {} version {}, this dualpipe reads {FORMAT} version {VERSION}",
                manifest.format, manifest.version
            ),
        ));
    }
    Ok(manifest)
}

/// Reads one listed file, checking its size (before reading) and its hash.
fn read_listed(dir: &Path, entry: &format::FileEntry) -> Result<Vec<u8>, CheckpointError> {
    if entry.name.contains('/') || entry.name.starts_with('.') {
        return Err(damaged(dir, format!("the manifest lists `{}`", entry.name)));
    }
    let path = dir.join(&entry.name);
    // One input path for tensor files: a FIFO or device in the folder is refused before a
    // byte is read; the cap is the tensor cap, lowered to half the memory available.
    let mut limit = dualpipe_io::limits::TENSORS;
    if let Some(available) = memory::available_bytes() {
        limit = limit.at_most(
            u64::try_from(available / 2).unwrap_or(u64::MAX),
            format!("half the {available} bytes of memory available"),
        );
    }
    let file = dualpipe_io::open_regular(&path, limit, &entry.name).map_err(|e| match e {
        dualpipe_io::ReadError::TooLarge { .. } => CheckpointError::Io {
            path: path.clone(),
            message: e.to_string(),
        },
        other => damaged(dir, other.to_string()),
    })?;
    if file.size() != entry.bytes {
        return Err(damaged(
            dir,
            format!(
                "{} has {} bytes, the manifest says {} (truncated?)",
                entry.name,
                file.size(),
                entry.bytes
            ),
        ));
    }
    let bytes = file.read_all().map_err(|e| CheckpointError::Io {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let crc = format::crc32_hex(&bytes);
    if crc != entry.crc32 {
        return Err(damaged(
            dir,
            format!(
                "{} has CRC-32 {crc}, the manifest says {} (the file was changed or damaged)",
                entry.name, entry.crc32
            ),
        ));
    }
    Ok(bytes)
}

impl Checkpoint {
    /// Reads the checkpoint in `dir`, verifying every file against the manifest, every value
    /// finite, and (for the GPT) every parameter of the model its `state.json` describes
    /// present: a checkpoint that fails any of these is damaged.
    pub fn read(dir: &Path) -> Result<Self, CheckpointError> {
        let ckpt = Checkpoint::read_files(dir, |_| true)?;
        let config = &ckpt.state.config;
        if config.model.kind == crate::ModelKind::Gpt {
            let missing = dualpipe_nn::gpt::tensor_names(&config.gpt())
                .into_iter()
                .map(|(name, _)| name)
                .find(|name| !ckpt.tensors.contains_key(name));
            if let Some(name) = missing {
                return Err(damaged(
                    dir,
                    format!(
                        "it holds no tensor {name}, which its {STATE} says the model has (a \
                         file left out of the {MANIFEST}?)"
                    ),
                ));
            }
        }
        Ok(ckpt)
    }

    /// Reads the checkpoint in `dir`, but of its files only `state.json` and those `wanted`
    /// accepts (each verified against the manifest): a process of a multi-process run reads
    /// the layers it holds and nothing else.
    pub fn read_files(dir: &Path, wanted: impl Fn(&str) -> bool) -> Result<Self, CheckpointError> {
        let manifest = read_manifest(dir)?;
        let mut state = None;
        let mut tensors = HashMap::new();
        for entry in &manifest.files {
            if entry.name != STATE && !wanted(&entry.name) {
                continue;
            }
            let bytes = read_listed(dir, entry)?;
            if entry.name == STATE {
                let s: CheckpointState = serde_json::from_slice(&bytes)
                    .map_err(|e| damaged(dir, format!("{STATE} is not valid: {e}")))?;
                state = Some(s);
                continue;
            }
            for t in format::decode_file(&bytes, &entry.name).map_err(|e| damaged(dir, e))? {
                tensors.insert(t.name.clone(), t);
            }
        }
        let state = state.ok_or_else(|| damaged(dir, format!("the manifest lists no {STATE}")))?;
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        if let Some(name) = names.into_iter().find(|n| !tensors[*n].is_finite()) {
            return Err(damaged(
                dir,
                format!(
                    "the tensor {name} holds a value that is not a finite number (inf or NaN): \
                     the run had diverged"
                ),
            ));
        }
        if state.step != manifest.step {
            return Err(damaged(
                dir,
                format!(
                    "{STATE} is of step {}, the manifest of step {}",
                    state.step, manifest.step
                ),
            ));
        }
        Ok(Checkpoint {
            path: dir.to_path_buf(),
            manifest,
            state,
            tensors,
        })
    }

    /// The tensor `name`, or an error saying the checkpoint lacks it.
    pub fn tensor(&self, name: &str) -> Result<&HostTensor, CheckpointError> {
        self.tensors
            .get(name)
            .ok_or_else(|| CheckpointError::Mismatch {
                path: self.path.clone(),
                problem: format!("it holds no tensor `{name}` (a checkpoint of another model?)"),
            })
    }
}

/// A checkpoint found, with the damaged newer ones skipped on the way.
#[derive(Debug)]
pub struct Found {
    /// The checkpoint.
    pub checkpoint: Checkpoint,
    /// Why each newer checkpoint was not used.
    pub skipped: Vec<CheckpointError>,
}

/// The candidates of `root`, newest first: the `latest` pointer's, then every `step-*` by
/// step.
fn candidates(root: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let mut dirs = checkpoint_dirs(root)?;
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
    let mut out: Vec<PathBuf> = Vec::new();
    if let Pointer::Names(name) = pointer::read(root) {
        if root.join(&name).is_dir() {
            out.push(root.join(name));
        }
    }
    for (_, path) in dirs {
        if !out.contains(&path) {
            out.push(path);
        }
    }
    Ok(out)
}

/// The latest complete checkpoint of the checkpoint directory `root` (`None` when it holds
/// none). A damaged one is skipped for the previous one; if every one is damaged, the newest
/// one's damage is the error.
pub fn find_latest(root: &Path) -> Result<Option<Found>, CheckpointError> {
    if !root.is_dir() {
        return Err(CheckpointError::NotFound(format!(
            "{} is not a directory; give the checkpoint directory of an earlier run",
            root.display()
        )));
    }
    let mut skipped = Vec::new();
    for dir in candidates(root)? {
        match Checkpoint::read(&dir) {
            Ok(checkpoint) => {
                return Ok(Some(Found {
                    checkpoint,
                    skipped,
                }))
            }
            Err(e @ CheckpointError::Damaged { .. }) => skipped.push(e),
            Err(e) => return Err(e),
        }
    }
    match skipped.into_iter().next() {
        Some(first) => Err(first),
        None => Ok(None),
    }
}

/// Whether `path` is a checkpoint's own directory (it holds a manifest, or is named
/// `step-NNNNNN`) rather than a checkpoint directory.
fn is_own(path: &Path) -> bool {
    path.join(MANIFEST).exists()
        || path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(parse_dir_name)
            .is_some()
}

/// The directory of checkpoint `step` where `path` is what [`open`] or [`find_latest`] was
/// given: `path` itself when it is a checkpoint's own directory, else its `step-NNNNNN`. The
/// processes of a multi-process run find the checkpoint one of them chose this way.
pub fn step_dir(path: &Path, step: usize) -> PathBuf {
    if is_own(path) {
        path.to_path_buf()
    } else {
        path.join(super::writer::dir_name(step))
    }
}

/// The checkpoint at `path`: a checkpoint's own directory (read as it is: no fallback), or a
/// checkpoint directory (its latest complete one, [`find_latest`]).
pub fn open(path: &Path) -> Result<Found, CheckpointError> {
    if !path.exists() {
        return Err(CheckpointError::NotFound(format!(
            "{} does not exist; give a checkpoint directory or one of its step-NNNNNN \
             checkpoints",
            path.display()
        )));
    }
    if is_own(path) {
        return Ok(Found {
            checkpoint: Checkpoint::read(path)?,
            skipped: Vec::new(),
        });
    }
    find_latest(path)?.ok_or_else(|| {
        CheckpointError::NotFound(format!(
            "{} holds no checkpoint (no step-* directory)",
            path.display()
        ))
    })
}

/// One checkpoint of a directory, as [`list`] finds it.
#[derive(Debug)]
pub struct Listed {
    /// Its step (from the directory's name).
    pub step: usize,
    /// Its directory.
    pub path: PathBuf,
    /// Its state and manifest if it is complete and intact, or why not.
    pub status: Result<(CheckpointState, Manifest), CheckpointError>,
}

/// Every `step-*` checkpoint of `root`, oldest first, each verified.
pub fn list(root: &Path) -> Result<Vec<Listed>, CheckpointError> {
    if !root.is_dir() {
        return Err(CheckpointError::NotFound(format!(
            "{} is not a directory; give a checkpoint directory",
            root.display()
        )));
    }
    let mut dirs = checkpoint_dirs(root)?;
    dirs.sort_by_key(|d| d.0);
    Ok(dirs
        .into_iter()
        .map(|(step, path)| {
            let status = Checkpoint::read(&path).map(|c| (c.state, c.manifest));
            Listed { step, path, status }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::format::encode_files;
    use crate::checkpoint::writer::{dir_name, write_dir};
    use crate::checkpoint::ScheduleShape;
    use crate::TrainConfig;

    fn save(root: &Path, step: usize) -> PathBuf {
        let t = HostTensor::from_f64s("blocks.0.up.weight".into(), &[step as f64; 4]);
        let mut files = encode_files(&[t]).unwrap();
        let shape = ScheduleShape {
            kind: "1f1b".into(),
            ranks: 2,
            micro_batches: 4,
            virtual_stages: 1,
            model_stages: 2,
        };
        let state = CheckpointState::new(&TrainConfig::MLP, shape, step);
        files.push((STATE.into(), serde_json::to_vec(&state).unwrap()));
        write_dir(root, step, &files, 0).unwrap()
    }

    #[test]
    fn a_checkpoint_holding_a_non_finite_value_is_damaged() {
        let root = tempfile::tempdir().unwrap();
        save(root.path(), 1);
        let t = HostTensor::from_f64s("blocks.0.up.weight".into(), &[1.0, f64::NAN]);
        let mut files = encode_files(&[t]).unwrap();
        let shape = ScheduleShape {
            kind: "1f1b".into(),
            ranks: 2,
            micro_batches: 4,
            virtual_stages: 1,
            model_stages: 2,
        };
        let state = CheckpointState::new(&TrainConfig::MLP, shape, 2);
        files.push((STATE.into(), serde_json::to_vec(&state).unwrap()));
        write_dir(root.path(), 2, &files, 0).unwrap();
        let found = find_latest(root.path()).unwrap().unwrap();
        assert_eq!(found.checkpoint.state.step, 1);
        let why = found.skipped[0].to_string();
        assert!(
            why.contains("blocks.0.up.weight") && why.contains("not a finite number"),
            "{why}"
        );
        let listed = list(root.path()).unwrap();
        assert!(listed[1].status.is_err());
    }

    #[test]
    fn damage_is_detected_and_the_previous_checkpoint_used() {
        let root = tempfile::tempdir().unwrap();
        assert!(find_latest(root.path()).unwrap().is_none());
        save(root.path(), 1);
        save(root.path(), 2);
        let third = save(root.path(), 3);
        let found = find_latest(root.path()).unwrap().unwrap();
        assert_eq!(found.checkpoint.state.step, 3);
        assert!(found.skipped.is_empty());
        // A flipped byte: the hash catches it.
        let file = third.join("block-0000.safetensors");
        let mut bytes = std::fs::read(&file).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&file, &bytes).unwrap();
        let found = find_latest(root.path()).unwrap().unwrap();
        assert_eq!(found.checkpoint.state.step, 2);
        assert!(
            found.skipped[0].to_string().contains("CRC-32"),
            "{}",
            found.skipped[0]
        );
        // A truncated file.
        let second = root.path().join(dir_name(2));
        let file = second.join("block-0000.safetensors");
        let bytes = std::fs::read(&file).unwrap();
        std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
        // A missing manifest.
        let first = root.path().join(dir_name(1));
        std::fs::remove_file(first.join(MANIFEST)).unwrap();
        let err = find_latest(root.path()).unwrap_err().to_string();
        assert!(
            err.contains("step-000003") && err.contains("damaged"),
            "{err}"
        );
        let listed = list(root.path()).unwrap();
        assert_eq!(listed.len(), 3);
        let problems: Vec<String> = listed
            .iter()
            .map(|l| l.status.as_ref().unwrap_err().to_string())
            .collect();
        assert!(problems[0].contains(MANIFEST), "{}", problems[0]);
        assert!(problems[1].contains("truncated"), "{}", problems[1]);
        // Asking for one directory reads it as it is.
        assert!(open(&third).is_err());
        assert!(open(&root.path().join("missing")).is_err());
    }
}
