//! A checkpoint several processes write together (one process per worker under MPI), over
//! a filesystem they share.
//!
//! Every process writes the files of the layers it holds (one writer per layer: the copy of
//! the lowest direction; with data parallelism replica 0's) and its own error-feedback file
//! (`feedback-WWWW.safetensors`, `WWWW` its process number) into one temp directory,
//! `.step-NNNNNN.tmp-jobJJJJ` (`JJJJ` the job's number, the same in every process, so a
//! killed job's leftovers are never mixed in), each file synced; then its *part-manifest*
//! `.part-WWWWW.json` (its files with their sizes and CRC-32s), written under a temp name,
//! synced and renamed: a part-manifest that exists says its files are on disk. Process 0
//! waits for every part-manifest, merges them into `manifest.json` (written last, synced),
//! and moves the directory into place as [`write_dir`](super::writer::write_dir) does. The
//! result is the same checkpoint a one-process run writes (the same tensor names), so
//! either kind resumes the other.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::format::{self, FileEntry, Manifest, FEEDBACK_FILE, STATE};
use super::writer::{
    dir_name, encode_parts, publish, put, state_file, sync_dir, write_files, write_manifest,
};
use super::{CheckpointError, CheckpointPart, SaveRecord};

/// How long process 0 waits for the other processes' parts of a checkpoint by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);

/// This process's place among the processes that write a checkpoint together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    /// This process (0 writes the manifest and publishes).
    pub process: usize,
    /// Processes writing a part of every checkpoint.
    pub processes: usize,
    /// The job's number, the same in every process (process 0's, broadcast): it names the
    /// temp directory.
    pub job: u64,
    /// How long process 0 waits for the others' parts before it gives up.
    pub wait: Duration,
}

/// Where the processes of job `job` write checkpoint `step` before it is published.
pub fn temp_dir(root: &Path, step: usize, job: u64) -> PathBuf {
    root.join(format!(".{}.tmp-job{job:016x}", dir_name(step)))
}

/// Process `process`'s part-manifest's name.
fn part_name(process: usize) -> String {
    format!(".part-{process:05}.json")
}

/// Process `process`'s error-feedback file.
pub fn feedback_file(process: usize) -> String {
    format!("feedback-{process:04}.safetensors")
}

/// A part-manifest: what one process wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct PartManifest {
    step: usize,
    process: usize,
    files: Vec<FileEntry>,
}

/// Removes the temp directories other jobs left in `root` (killed before they published).
pub(crate) fn remove_stale(root: &Path, job: u64) {
    let ours = format!(".tmp-job{job:016x}");
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let theirs = name.starts_with(".step-") && name.contains(".tmp-job");
        if theirs && !name.ends_with(&ours) && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Writes this process's share of checkpoint `step` (its `parts`, one); process 0 then waits
/// for the others', writes the manifest and publishes (keeping `keep`).
pub fn save_share(
    root: &Path,
    step: usize,
    parts: Vec<CheckpointPart>,
    keep: usize,
    share: &Share,
    run: Option<&super::RunIdentity>,
) -> Result<SaveRecord, CheckpointError> {
    let began = Instant::now();
    let (mut files, state, host_bytes) = encode_parts(parts)?;
    for (name, _) in &mut files {
        if name == FEEDBACK_FILE {
            *name = feedback_file(share.process);
        }
    }
    if share.process == 0 {
        let state = state.ok_or_else(|| {
            CheckpointError::Writer(format!("step {step}: process 0's part held no state"))
        })?;
        files.push(state_file(&state)?);
    }
    let tmp = temp_dir(root, step, share.job);
    std::fs::create_dir_all(&tmp).map_err(|e| CheckpointError::io(&tmp, "create", &e))?;
    write_files(&tmp, &files)?;
    let part = PartManifest {
        step,
        process: share.process,
        files: Manifest::of(step, &files).files,
    };
    let text = serde_json::to_vec(&part)
        .map_err(|e| CheckpointError::Writer(format!("encoding the part-manifest: {e}")))?;
    let name = part_name(share.process);
    let pending = format!("{name}.pending");
    put(&tmp, &pending, &text)?;
    std::fs::rename(tmp.join(&pending), tmp.join(&name))
        .map_err(|e| CheckpointError::io(&tmp.join(&name), "rename", &e))?;
    sync_dir(&tmp)?;
    let mut bytes: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    let path = root.join(dir_name(step));
    if share.process == 0 {
        let manifest = merge(&tmp, step, share)?.by(run.cloned());
        bytes = manifest.bytes();
        write_manifest(&tmp, &manifest)?;
        publish(root, step, &tmp, keep)?;
    }
    Ok(SaveRecord {
        step,
        path,
        bytes,
        seconds: began.elapsed().as_secs_f64(),
        host_bytes,
    })
}

/// Waits for every process's part-manifest of `step` in `tmp`, removes them, and returns
/// the manifest of all their files (sorted by name, `state.json` last).
fn merge(tmp: &Path, step: usize, share: &Share) -> Result<Manifest, CheckpointError> {
    let began = Instant::now();
    let mut missing: Vec<usize> = (0..share.processes).collect();
    while !missing.is_empty() {
        missing.retain(|&p| !tmp.join(part_name(p)).is_file());
        if missing.is_empty() {
            break;
        }
        if began.elapsed() > share.wait {
            let names: Vec<String> = missing.iter().map(usize::to_string).collect();
            return Err(CheckpointError::Writer(format!(
                "step {step}: process(es) {} did not write their part of the checkpoint \
                 within {} s (stopped, or not sharing the filesystem of {}?)",
                names.join(", "),
                share.wait.as_secs(),
                tmp.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut files: Vec<FileEntry> = Vec::new();
    for p in 0..share.processes {
        let path = tmp.join(part_name(p));
        let text = dualpipe_io::read_regular(&path, dualpipe_io::limits::MANIFEST, "the part")
            .map_err(|e| CheckpointError::Writer(e.to_string()))?;
        let part: PartManifest = serde_json::from_slice(&text).map_err(|e| {
            CheckpointError::Writer(format!("{}: not a part-manifest: {e}", path.display()))
        })?;
        if part.step != step || part.process != p {
            return Err(CheckpointError::Writer(format!(
                "{}: the part of process {} at step {}, expected process {p} at step {step}",
                path.display(),
                part.process,
                part.step
            )));
        }
        for entry in part.files {
            if files.iter().any(|f| f.name == entry.name) {
                return Err(CheckpointError::Writer(format!(
                    "step {step}: two processes wrote {} (one writer per layer expected)",
                    entry.name
                )));
            }
            files.push(entry);
        }
        std::fs::remove_file(&path).map_err(|e| CheckpointError::io(&path, "remove", &e))?;
    }
    files.sort_by(|a, b| (a.name == STATE, &a.name).cmp(&(b.name == STATE, &b.name)));
    Ok(Manifest {
        format: format::FORMAT.into(),
        version: format::VERSION,
        step,
        files,
        run: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::format::HostTensor;
    use crate::checkpoint::{Checkpoint, CheckpointState, ScheduleShape};
    use crate::TrainConfig;

    fn part(step: usize, layer: usize, state: bool) -> CheckpointPart {
        let shape = ScheduleShape {
            kind: "1f1b".into(),
            ranks: 2,
            micro_batches: 4,
            virtual_stages: 1,
            model_stages: 2,
        };
        CheckpointPart {
            step,
            tensors: vec![
                HostTensor::from_f64s(format!("blocks.{layer}.up.bias"), &[layer as f64; 3]),
                HostTensor::from_f64s(
                    format::feedback_name(layer, 0, 0, false),
                    &[0.5 + layer as f64],
                ),
            ],
            state: state.then(|| CheckpointState::new(&TrainConfig::MLP, shape, step)),
        }
    }

    #[test]
    fn processes_write_one_checkpoint_that_reads_back_whole() {
        let root = tempfile::tempdir().unwrap();
        // A killed job's leftovers: removed, never mixed in.
        let stale = temp_dir(root.path(), 4, 7);
        std::fs::create_dir_all(&stale).unwrap();
        std::fs::write(stale.join(part_name(1)), "{}").unwrap();
        let share = |process| Share {
            process,
            processes: 2,
            job: 9,
            wait: Duration::from_secs(20),
        };
        remove_stale(root.path(), 9);
        assert!(!stale.exists());
        let r = root.path().to_path_buf();
        let other = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            save_share(&r, 4, vec![part(4, 1, true)], 0, &share(1), None).unwrap()
        });
        let record =
            save_share(root.path(), 4, vec![part(4, 0, true)], 0, &share(0), None).unwrap();
        other.join().unwrap();
        let ckpt = Checkpoint::read(&record.path).unwrap();
        assert_eq!(ckpt.state.step, 4);
        let names: Vec<&str> = ckpt
            .manifest
            .files
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "block-0000.safetensors",
                "block-0001.safetensors",
                "feedback-0000.safetensors",
                "feedback-0001.safetensors",
                "state.json"
            ]
        );
        assert_eq!(ckpt.tensor("blocks.1.up.bias").unwrap().to_f64s(), [1.0; 3]);
        assert!(ckpt
            .tensors
            .contains_key(&format::feedback_name(1, 0, 0, false)));
        assert_eq!(record.bytes, ckpt.manifest.bytes());
        // Only what was asked for is read.
        let some = Checkpoint::read_files(&record.path, |f| f == "block-0001.safetensors").unwrap();
        assert!(some.tensors.contains_key("blocks.1.up.bias"));
        assert!(!some.tensors.contains_key("blocks.0.up.bias"));
        let latest =
            std::fs::read_to_string(root.path().join(crate::checkpoint::writer::LATEST)).unwrap();
        assert_eq!(latest.trim(), "step-000004");
        // No temp directory or part-manifest is left.
        let left: Vec<String> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
    }

    #[test]
    fn a_missing_part_is_an_error_naming_the_process() {
        let root = tempfile::tempdir().unwrap();
        let share = Share {
            process: 0,
            processes: 3,
            job: 1,
            wait: Duration::from_millis(50),
        };
        let err = save_share(root.path(), 2, vec![part(2, 0, true)], 0, &share, None).unwrap_err();
        assert!(err.to_string().contains("process(es) 1, 2"), "{err}");
        assert!(!root.path().join(dir_name(2)).exists());
    }
}
