//! Checkpoints: the whole training state every N steps, written in the background, read back
//! by any grid shape.
//!
//! A checkpoint is a directory `step-NNNNNN/` (the steps done) under the checkpoint
//! directory, holding:
//! - safetensors files named by model layer, never by rank (`embedding.safetensors`,
//!   `block-0003.safetensors`, `head.safetensors`): each parameter under its model name
//!   (`blocks.3.attn.qkv.weight`) and beside it its optimizer state (`….optim.m`,
//!   `….optim.v` for AdamW, `….optim.momentum` for SGD), so any schedule, rank count or
//!   layers-per-stage finds what it holds by name;
//! - `feedback.safetensors`: the gradient compression's error-feedback buffers of every
//!   (model stage, replica), when a lossy compression kept any;
//! - `state.json` ([`CheckpointState`]): the step, the configuration, the schedule's shape,
//!   the data position and the random streams;
//! - `manifest.json` ([`Manifest`]), written last: every file with its size and CRC-32.
//!
//! The directory is written under a temp name, every file and the directory fsynced, then
//! renamed into place; the `latest` pointer (a one-line regular file of the directory,
//! [`pointer`]) moves after. Weights or optimizer state holding a value that is not a finite
//! number are never published. Only the newest `keep` checkpoints this program wrote are
//! kept; nothing else in the checkpoint directory is touched. The directory is owned by one
//! run ([`owner`]): its identity in every manifest, a lock while it writes.
//!
//! - [`format`](mod@format) — names, host tensors, the safetensors files, `state.json` and the manifest;
//! - [`writer`] — the directory's atomic write, the `latest` pointer, pruning, and
//!   [`CheckpointWriter`], the background thread the trainers hand their state to;
//! - [`load`] — finding the latest complete checkpoint (damaged ones are reported and
//!   skipped), verifying it, reading it ([`Checkpoint`]), and listing ([`list`]);
//! - [`shared`] — a checkpoint several processes write together (one process per rank
//!   under MPI): each its own layers' files and a part-manifest, process 0 the manifest;
//! - [`pointer`] — the `latest` pointer, read and written;
//! - [`owner`] — the run that owns a directory: its lock, the refusal of another run's
//!   directory, the removal of dead runs' temp directories;
//! - [`weights`] — a checkpoint's GPT weights alone (`--init-from`);
//! - [`session`] — [`Checkpointing`]: a run's writer from its start to the note of what it
//!   saved.

pub mod format;
pub mod load;
pub mod owner;
pub mod pointer;
mod resume;
pub mod session;
pub mod shared;
pub(crate) mod trainer;
pub mod weights;
pub mod writer;

pub use format::{CheckpointState, HostTensor, Manifest, RunIdentity, ScheduleShape};
pub use load::{find_latest, list, open, step_dir, Checkpoint, Found, Listed};
pub use session::Checkpointing;
pub use shared::Share;
pub use trainer::Restored;
pub use weights::gpt_weights;
pub use writer::{
    CheckpointPart, CheckpointSink, CheckpointWriter, OnSaved, SaveRecord, WriteScope,
};

use std::path::PathBuf;

/// Steps between checkpoints when a directory is given and no interval is.
pub const DEFAULT_EVERY: usize = 500;
/// Checkpoints kept when no count is given.
pub const DEFAULT_KEEP: usize = 3;

/// Where and how often a run saves checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointOptions {
    /// The checkpoint directory (created when missing).
    pub dir: PathBuf,
    /// Save after every this many steps (a positive number).
    pub every: usize,
    /// Keep the newest this many checkpoints (0: keep all).
    pub keep: usize,
    /// The run that writes (named in every manifest; `None`: not recorded).
    pub run: Option<RunIdentity>,
    /// Whether the run continues a checkpoint (then the directory may hold that run's
    /// checkpoints); a fresh run refuses a directory that holds any.
    pub resuming: bool,
}

impl CheckpointOptions {
    /// Checkpoints in `dir` every [`DEFAULT_EVERY`] steps, keeping [`DEFAULT_KEEP`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CheckpointOptions {
            dir: dir.into(),
            every: DEFAULT_EVERY,
            keep: DEFAULT_KEEP,
            run: None,
            resuming: false,
        }
    }
}

/// What can go wrong with a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file or directory could not be read or written.
    #[error("{path}: {message}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What failed, and how to fix it.
        message: String,
    },
    /// A checkpoint is damaged (a missing manifest, a truncated file, a wrong hash).
    #[error("checkpoint {path} is damaged: {problem}")]
    Damaged {
        /// The checkpoint's directory.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// No usable checkpoint where one was asked for.
    #[error("{0}")]
    NotFound(String),
    /// The checkpoint does not fit this run (another model, a missing tensor).
    #[error("checkpoint {path} does not fit this run: {problem}")]
    Mismatch {
        /// The checkpoint's directory.
        path: PathBuf,
        /// What disagrees, and how to fix it.
        problem: String,
    },
    /// The background writer failed or stopped.
    #[error("the checkpoint writer failed: {0}")]
    Writer(String),
    /// Something other than a pointer is where the `latest` pointer goes.
    #[error(
        "{path} is {what}; it is not replaced: move it away, or use another checkpoint directory"
    )]
    ForeignPointer {
        /// The `latest` path.
        path: PathBuf,
        /// What is there.
        what: String,
    },
    /// Another process holds the checkpoint directory's lock.
    #[error("the checkpoint directory {dir} is in use by {holder}")]
    InUse {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Who holds it, as its lock file says.
        holder: String,
    },
    /// The checkpoint directory holds checkpoints of another run (or any, for a fresh run).
    #[error("the checkpoint directory {dir} already holds checkpoints ({} of {})", newest.display(), run_words(run))]
    Occupied {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The newest checkpoint that is in the way.
        newest: PathBuf,
        /// The run that wrote it, when recorded.
        run: Option<Box<RunIdentity>>,
    },
    /// Weights or optimizer state hold a value that is not a finite number.
    #[error("after step {step} the tensor {tensor} holds a value that is not a finite number (inf or NaN): training diverged, and this state is not saved")]
    NonFinite {
        /// Steps done.
        step: usize,
        /// The first such tensor (in name order).
        tensor: String,
    },
}

fn run_words(run: &Option<Box<RunIdentity>>) -> String {
    match run {
        Some(r) => format!("run {}, seed {}, task {}", r.id, r.seed, r.task),
        None => "an earlier run".into(),
    }
}

impl CheckpointError {
    pub(crate) fn io(path: &std::path::Path, what: &str, err: &std::io::Error) -> Self {
        CheckpointError::Io {
            path: path.to_path_buf(),
            message: format!("cannot {what}: {err}"),
        }
    }
}
