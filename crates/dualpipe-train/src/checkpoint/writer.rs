//! Writing checkpoints: one directory, atomically ([`write_dir`]), the `latest` pointer,
//! pruning to the newest `keep`, and [`CheckpointWriter`], the background thread that does it
//! while training goes on.
//!
//! The step that triggers a checkpoint copies the state into host memory
//! ([`CheckpointPart`]) and hands it to a [`CheckpointSink`]; the writer thread waits for
//! every part of that step (one per data-parallel replica of a local run), encodes the files,
//! writes them and moves `latest`. The queue holds at most two checkpoints' parts: a disk
//! slower than the interval makes the training wait rather than fill the memory.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::format::{self, CheckpointState, HostTensor, Manifest, RunIdentity, MANIFEST, STATE};
use super::owner::{self, DirLock};
use super::{pointer, CheckpointError, CheckpointOptions};

pub use super::pointer::LATEST;

/// A checkpoint's directory name: `step-` and the steps done, 6 digits or more.
pub fn dir_name(step: usize) -> String {
    format!("step-{step:06}")
}

/// The step of a checkpoint directory's name (`None` for anything that is not ours).
pub fn parse_dir_name(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("step-")?;
    if digits.len() < 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Syncs the folder `path` (one this program writes into; opened only to sync it, not a user
/// input, so not through `dualpipe_io::open_regular`).
pub(crate) fn sync_dir(path: &Path) -> Result<(), CheckpointError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| CheckpointError::io(path, "sync the directory", &e))
}

/// Writes checkpoint `step` into `root` (created when missing): the files under a temp
/// directory, each synced, the manifest last, the directory synced and renamed to
/// `step-NNNNNN` (replacing an older one of the same step), `latest` moved to it, and all
/// but the newest `keep` `step-*` directories removed (0: none). Returns the checkpoint's
/// directory.
pub fn write_dir(
    root: &Path,
    step: usize,
    files: &[(String, Vec<u8>)],
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    write_dir_by(root, step, files, keep, None)
}

/// [`write_dir`], the manifest naming `run` as the writer.
pub fn write_dir_by(
    root: &Path,
    step: usize,
    files: &[(String, Vec<u8>)],
    keep: usize,
    run: Option<&RunIdentity>,
) -> Result<PathBuf, CheckpointError> {
    create_root(root)?;
    let name = dir_name(step);
    let tmp = root.join(format!(".{name}.tmp-{}-{}", std::process::id(), nonce()));
    std::fs::create_dir(&tmp).map_err(|e| CheckpointError::io(&tmp, "create", &e))?;
    let written = write_files(&tmp, files).and_then(|()| {
        let manifest = Manifest::of(step, files).by(run.cloned());
        write_manifest(&tmp, &manifest)
    });
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    publish(root, step, &tmp, keep)
}

/// Creates the checkpoint directory `root` when missing; a path that exists but is not a
/// directory is an error saying so.
pub(crate) fn create_root(root: &Path) -> Result<(), CheckpointError> {
    if root.exists() && !root.is_dir() {
        return Err(CheckpointError::Io {
            path: root.to_path_buf(),
            message: "is a file, not a directory; give a directory (created when missing)".into(),
        });
    }
    std::fs::create_dir_all(root)
        .map_err(|e| CheckpointError::io(root, "create the checkpoint directory", &e))
}

/// A number that differs from run to run (the clock's nanoseconds), for temp names.
pub(crate) fn nonce() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

/// Moves the complete temp directory `tmp` (its manifest written and synced) into place as
/// checkpoint `step` of `root`, replacing an older one of the same step, syncs `root`, moves
/// `latest` and prunes to `keep`. Something else at that name (a user's folder or file, a
/// link) is never replaced: an error names it, and `tmp` is removed.
pub(crate) fn publish(
    root: &Path,
    step: usize,
    tmp: &Path,
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    let name = dir_name(step);
    let target = root.join(&name);
    let old = root.join(format!(".{name}.old-{}-{}", std::process::id(), nonce()));
    let replaced = std::fs::symlink_metadata(&target).is_ok();
    if replaced && !owner::replaceable(&target) {
        let _ = std::fs::remove_dir_all(tmp);
        return Err(CheckpointError::Io {
            path: target,
            message: "exists and is not a checkpoint of ours (no manifest of ours): it is never \
                      replaced; move it away, or write the checkpoints into another directory"
                .into(),
        });
    }
    if replaced {
        std::fs::rename(&target, &old)
            .map_err(|e| CheckpointError::io(&target, "move the older checkpoint aside", &e))?;
    }
    std::fs::rename(tmp, &target).map_err(|e| CheckpointError::io(&target, "rename", &e))?;
    sync_dir(root)?;
    if replaced {
        let _ = std::fs::remove_dir_all(&old);
    }
    pointer::write(root, &name)?;
    prune(root, keep)?;
    Ok(target)
}

/// Creates `dir/name` (it must not exist) holding `bytes`, synced.
pub(crate) fn put(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
    let path = dir.join(name);
    File::create_new(&path)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        })
        .map_err(|e| CheckpointError::io(&path, "write", &e))
}

/// Writes every file into `dir`, each synced.
pub(crate) fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<(), CheckpointError> {
    for (name, bytes) in files {
        put(dir, name, bytes)?;
    }
    Ok(())
}

/// Writes the manifest into `dir` (last: the files it lists are synced) and syncs `dir`.
pub(crate) fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), CheckpointError> {
    let text = serde_json::to_vec_pretty(manifest)
        .map_err(|e| CheckpointError::Writer(format!("encoding the manifest: {e}")))?;
    put(dir, MANIFEST, &text)?;
    sync_dir(dir)
}

/// Removes all but the newest `keep` checkpoint directories of `root` (0: keeps all). Only
/// `step-NNNNNN` directories this program wrote (holding our manifest) are candidates: a
/// user's own directory of that name is never removed, nor counted.
pub fn prune(root: &Path, keep: usize) -> Result<(), CheckpointError> {
    if keep == 0 {
        return Ok(());
    }
    let mut steps = checkpoint_dirs(root)?;
    steps.retain(|(_, path)| owner::is_ours(path));
    steps.sort_by_key(|d| std::cmp::Reverse(d.0));
    for (_, path) in steps.into_iter().skip(keep) {
        std::fs::remove_dir_all(&path)
            .map_err(|e| CheckpointError::io(&path, "remove an old checkpoint", &e))?;
    }
    Ok(())
}

/// The `step-NNNNNN` directories of `root` with their steps (unsorted).
pub fn checkpoint_dirs(root: &Path) -> Result<Vec<(usize, PathBuf)>, CheckpointError> {
    let entries = std::fs::read_dir(root).map_err(|e| CheckpointError::io(root, "list", &e))?;
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(step) = entry.file_name().to_str().and_then(parse_dir_name) else {
            continue;
        };
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push((step, entry.path()));
        }
    }
    Ok(out)
}

/// What one process (or one data-parallel replica of a local run) contributes to the
/// checkpoint of a step.
#[derive(Clone, Debug)]
pub struct CheckpointPart {
    /// Steps done.
    pub step: usize,
    /// Its tensors, copied to host memory.
    pub tensors: Vec<HostTensor>,
    /// `state.json`, from the part that reports (one per checkpoint).
    pub state: Option<CheckpointState>,
}

impl CheckpointPart {
    /// Bytes of tensor data it holds (the host copy's cost).
    pub fn bytes(&self) -> usize {
        self.tensors.iter().map(|t| t.data.len()).sum()
    }
}

/// One checkpoint the writer saved.
#[derive(Clone, Debug, PartialEq)]
pub struct SaveRecord {
    /// Steps done.
    pub step: usize,
    /// Its directory.
    pub path: PathBuf,
    /// Bytes written.
    pub bytes: u64,
    /// Seconds to encode and write it (on the writer thread).
    pub seconds: f64,
    /// Bytes of the host copy its parts held.
    pub host_bytes: usize,
}

/// A trainer's handle on the writer: hands it parts, says when one is due.
#[derive(Clone, Debug)]
pub struct CheckpointSink {
    tx: SyncSender<CheckpointPart>,
    failed: Arc<Mutex<Option<String>>>,
    every: usize,
}

impl CheckpointSink {
    /// Whether a checkpoint is due after `done` steps.
    pub fn due(&self, done: usize) -> bool {
        self.every > 0 && done > 0 && done.is_multiple_of(self.every)
    }

    /// Hands `part` to the writer (waiting only when two checkpoints are already queued);
    /// fails when the writer has failed.
    pub fn send(&self, part: CheckpointPart) -> Result<(), CheckpointError> {
        if let Some(message) = self.failed.lock().ok().and_then(|f| f.clone()) {
            return Err(CheckpointError::Writer(message));
        }
        self.tx
            .send(part)
            .map_err(|_| CheckpointError::Writer("the writer thread stopped".into()))
    }
}

/// The background writer of a run's checkpoints (see the [module](self) documentation).
#[derive(Debug)]
pub struct CheckpointWriter {
    sink: Option<CheckpointSink>,
    handle: Option<JoinHandle<Vec<SaveRecord>>>,
    failed: Arc<Mutex<Option<String>>>,
    /// The directory's lock, held until the writer finishes (by the process that publishes).
    _lock: Option<DirLock>,
    /// The temp directories of dead runs removed at the start.
    removed: Vec<PathBuf>,
}

impl CheckpointWriter {
    /// Starts the writer thread for `options`, expecting `parts` parts per checkpoint (the
    /// data-parallel replicas of a local run; 1 otherwise).
    pub fn start(options: &CheckpointOptions, parts: usize) -> Result<Self, CheckpointError> {
        CheckpointWriter::start_with(options, WriteScope::Whole { parts }, None)
    }

    /// Starts the writer thread for `options` in `scope` (the whole checkpoint from this
    /// process's parts, or this process's share of one several processes write); `on_saved`
    /// is told of every checkpoint written (on the writer thread; e.g. for metrics).
    pub fn start_with(
        options: &CheckpointOptions,
        scope: WriteScope,
        on_saved: Option<OnSaved>,
    ) -> Result<Self, CheckpointError> {
        create_root(&options.dir)?;
        let publishes = match &scope {
            WriteScope::Whole { .. } => true,
            WriteScope::Shared(share) => share.process == 0,
        };
        let mut lock = None;
        let mut removed = Vec::new();
        if publishes {
            let run = options.run.clone().unwrap_or_else(|| RunIdentity {
                id: format::random_id(),
                seed: 0,
                task: String::new(),
                data_digest: None,
            });
            lock = Some(DirLock::acquire(&options.dir, &run)?);
            if options.run.is_some() {
                owner::check_owner(&options.dir, &run, options.resuming)?;
            }
            pointer::check_replaceable(&options.dir)?;
            removed = owner::remove_stale_temps(&options.dir);
        }
        if let WriteScope::Shared(share) = &scope {
            if share.process == 0 {
                super::shared::remove_stale(&options.dir, share.job);
            }
        }
        let run = options.run.clone();
        let parts = match &scope {
            WriteScope::Whole { parts } => (*parts).max(1),
            WriteScope::Shared(_) => 1,
        };
        let (tx, rx) = mpsc::sync_channel(2 * parts);
        let failed = Arc::new(Mutex::new(None));
        let root = options.dir.clone();
        let keep = options.keep;
        let flag = Arc::clone(&failed);
        let handle = std::thread::Builder::new()
            .name("checkpoint-writer".into())
            .spawn(move || {
                let save = |step: usize, group: Vec<CheckpointPart>| match &scope {
                    WriteScope::Whole { .. } => save(&root, step, group, keep, run.as_ref()),
                    WriteScope::Shared(share) => {
                        super::shared::save_share(&root, step, group, keep, share, run.as_ref())
                    }
                };
                writer_loop(&rx, parts, &flag, save, on_saved.as_deref())
            })
            .map_err(|e| CheckpointError::Writer(format!("cannot start the thread: {e}")))?;
        Ok(CheckpointWriter {
            sink: Some(CheckpointSink {
                tx,
                failed: Arc::clone(&failed),
                every: options.every,
            }),
            handle: Some(handle),
            failed,
            _lock: lock,
            removed,
        })
    }

    /// The temp directories of runs that were killed while writing, removed at the start.
    pub fn removed(&self) -> &[PathBuf] {
        &self.removed
    }

    /// A handle for a trainer.
    pub fn sink(&self) -> Option<CheckpointSink> {
        self.sink.clone()
    }

    /// Waits for every queued checkpoint to be written and stops the thread: what it saved,
    /// or its first error. Call it after the trainers (and their sinks) are done.
    pub fn finish(mut self) -> Result<Vec<SaveRecord>, CheckpointError> {
        self.sink = None;
        let records = match self.handle.take() {
            Some(h) => h
                .join()
                .map_err(|_| CheckpointError::Writer("the writer thread panicked".into()))?,
            None => Vec::new(),
        };
        match self.failed.lock().ok().and_then(|f| f.clone()) {
            Some(message) => Err(CheckpointError::Writer(message)),
            None => Ok(records),
        }
    }
}

/// A callback told of every checkpoint the writer saved.
pub type OnSaved = Box<dyn Fn(&SaveRecord) + Send>;

/// What a writer writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteScope {
    /// The whole checkpoint, from `parts` parts per step (the data-parallel replicas of a
    /// local run; 1 otherwise).
    Whole {
        /// Parts per checkpoint.
        parts: usize,
    },
    /// This process's share of a checkpoint several processes write
    /// ([`shared`](super::shared)), one part per step.
    Shared(super::shared::Share),
}

fn writer_loop(
    rx: &Receiver<CheckpointPart>,
    parts: usize,
    failed: &Mutex<Option<String>>,
    save: impl Fn(usize, Vec<CheckpointPart>) -> Result<SaveRecord, CheckpointError>,
    on_saved: Option<&(dyn Fn(&SaveRecord) + Send)>,
) -> Vec<SaveRecord> {
    let mut pending: BTreeMap<usize, Vec<CheckpointPart>> = BTreeMap::new();
    let mut records = Vec::new();
    while let Ok(part) = rx.recv() {
        let step = part.step;
        let got = pending.entry(step).or_default();
        got.push(part);
        if got.len() < parts {
            continue;
        }
        let Some(group) = pending.remove(&step) else {
            continue;
        };
        match save(step, group) {
            Ok(record) => {
                if let Some(tell) = on_saved {
                    tell(&record);
                }
                records.push(record);
            }
            Err(e) => {
                if let Ok(mut f) = failed.lock() {
                    *f = Some(e.to_string());
                }
                break;
            }
        }
    }
    records
}

/// A checkpoint's files: names and bytes.
pub(super) type Files = Vec<(String, Vec<u8>)>;

/// The parts' tensors encoded as safetensors files, the state one of them reports, and the
/// bytes of tensor data they held in host memory.
pub(super) fn encode_parts(
    parts: Vec<CheckpointPart>,
) -> Result<(Files, Option<CheckpointState>, usize), CheckpointError> {
    let tensors = parts.iter().flat_map(|p| &p.tensors);
    if let Some(tensor) = format::first_non_finite(tensors) {
        return Err(CheckpointError::NonFinite {
            step: parts.first().map_or(0, |p| p.step),
            tensor: tensor.to_string(),
        });
    }
    let host_bytes = parts.iter().map(CheckpointPart::bytes).sum();
    let mut state = None;
    let mut tensors = Vec::new();
    for part in parts {
        state = state.or(part.state);
        tensors.extend(part.tensors);
    }
    let files = format::encode_files(&tensors)?;
    Ok((files, state, host_bytes))
}

/// `state.json` of `state`.
pub(super) fn state_file(state: &CheckpointState) -> Result<(String, Vec<u8>), CheckpointError> {
    let text = serde_json::to_vec_pretty(state)
        .map_err(|e| CheckpointError::Writer(format!("encoding {STATE}: {e}")))?;
    Ok((STATE.into(), text))
}

fn save(
    root: &Path,
    step: usize,
    parts: Vec<CheckpointPart>,
    keep: usize,
    run: Option<&RunIdentity>,
) -> Result<SaveRecord, CheckpointError> {
    let began = Instant::now();
    let (mut files, state, host_bytes) = encode_parts(parts)?;
    let state = state
        .ok_or_else(|| CheckpointError::Writer(format!("step {step}: no part held the state")))?;
    files.push(state_file(&state)?);
    let bytes = files.iter().map(|(_, b)| b.len() as u64).sum();
    let path = write_dir_by(root, step, &files, keep, run)?;
    Ok(SaveRecord {
        step,
        path,
        bytes,
        seconds: began.elapsed().as_secs_f64(),
        host_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> Vec<(String, Vec<u8>)> {
        vec![("a.safetensors".into(), vec![1, 2, 3])]
    }

    #[test]
    fn directories_appear_whole_and_only_ours_are_pruned() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("notes.txt"), "mine").unwrap();
        std::fs::create_dir(root.path().join("step-old")).unwrap();
        for step in [100, 200, 300, 400] {
            write_dir(root.path(), step, &files(), 2).unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "latest",
                "notes.txt",
                "step-000300",
                "step-000400",
                "step-old"
            ]
        );
        let latest = std::fs::read_to_string(root.path().join(LATEST)).unwrap();
        assert_eq!(latest, "step-000400\n");
        assert!(root.path().join("step-000400").join(MANIFEST).is_file());
        // The same step again replaces it.
        write_dir(root.path(), 400, &files(), 2).unwrap();
        assert!(root
            .path()
            .join("step-000400")
            .join("a.safetensors")
            .is_file());
    }

    #[test]
    fn a_users_step_directory_is_never_pruned_nor_counted() {
        let root = tempfile::tempdir().unwrap();
        let users = root.path().join("step-000001");
        std::fs::create_dir(&users).unwrap();
        std::fs::write(users.join("notes.txt"), "my own file").unwrap();
        for step in [2, 4, 6] {
            write_dir(root.path(), step, &files(), 1).unwrap();
        }
        assert!(users.join("notes.txt").is_file());
        assert!(root.path().join("step-000006").is_dir());
        assert!(!root.path().join("step-000004").exists());
    }

    #[test]
    fn non_finite_state_is_never_published() {
        let root = tempfile::tempdir().unwrap();
        let options = CheckpointOptions {
            every: 1,
            keep: 1,
            ..CheckpointOptions::new(root.path())
        };
        let writer = CheckpointWriter::start(&options, 1).unwrap();
        let sink = writer.sink().unwrap();
        let part = |step: usize, x: f64| CheckpointPart {
            step,
            tensors: vec![HostTensor::from_f64s(
                "blocks.0.up.weight".into(),
                &[x, 1.0],
            )],
            state: Some(CheckpointState::new(
                &crate::TrainConfig::MLP,
                super::super::ScheduleShape {
                    kind: "1f1b".into(),
                    ranks: 2,
                    micro_batches: 4,
                    virtual_stages: 1,
                    model_stages: 2,
                },
                step,
            )),
        };
        sink.send(part(1, 0.5)).unwrap();
        sink.send(part(2, f64::INFINITY)).unwrap();
        drop(sink);
        let err = writer.finish().unwrap_err().to_string();
        assert!(
            err.contains("blocks.0.up.weight") && err.contains("not a finite number"),
            "{err}"
        );
        assert!(root.path().join("step-000001").join(MANIFEST).is_file());
        assert!(!root.path().join("step-000002").exists());
        assert_eq!(
            std::fs::read_to_string(root.path().join(LATEST)).unwrap(),
            "step-000001\n"
        );
    }

    #[test]
    fn names_parse_back() {
        assert_eq!(parse_dir_name(&dir_name(42)), Some(42));
        assert_eq!(parse_dir_name(&dir_name(12_345_678)), Some(12_345_678));
        assert_eq!(parse_dir_name("step-12"), None);
        assert_eq!(parse_dir_name("step-00001x"), None);
    }
}
