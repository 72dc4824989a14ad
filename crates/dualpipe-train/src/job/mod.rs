//! The job: a [`TrainConfig`] run to its end the way a user runs it, on local threads or as
//! one rank per process under MPI, resuming a checkpoint, writing checkpoints and watching the
//! run (progress, metrics, log). A program that builds a [`JobConfig`] gets the whole job
//! from [`Job::run`], not only the loop; the binary builds one from its flags.
//!
//! - [`JobConfig`] — the training configuration and the job's own sections:
//!   [`CheckpointSection`], [`ObserveSection`], [`OutputsSection`], [`Transport`];
//! - `local` — [`Job::run`] on local threads: the resume point, the watch, the checkpoint
//!   session, the run, and what it leaves to write ([`Finished`]);
//! - `mpi` (feature `mpi`) — one process's life under an MPI launcher: which process
//!   reports, how a failing one leaves;
//! - `resume` — the checkpoint to resume and its checks, the checkpoint options;
//! - `failure` — [`Failure`]: a failed job in its user's words, usage error or not;
//! - `observe` — [`rank_addr`]: the metrics address of each process.
//!
//! Messages name the configuration's fields as [`JobConfig::naming`] says ([`Naming::Fields`]
//! for a program, [`Naming::Flags`] for the command line). The library never prints: what a
//! user is told goes through a `say` callback, one line at a time.

use std::path::PathBuf;

use dualpipe_schedule::Schedule;

use crate::checkpoint::DEFAULT_KEEP;
use crate::job::watch::{Watch, WatchError, WatchPlan};
use crate::{Field, Naming, TrainConfig};

mod failure;
mod local;
pub mod local_run;
#[cfg(feature = "mpi")]
mod mpi;
mod observe;
pub mod plan_file;
#[cfg(feature = "mpi")]
pub mod process_grid;
pub mod watch;

pub use failure::{divergence, schedule_settings, Failure};
pub use local::Finished;
#[cfg(feature = "mpi")]
pub use mpi::LINGER;
pub use observe::rank_addr;

/// Where a job's ranks run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// One thread per rank (and replica) in this process.
    #[default]
    Local,
    /// One process per worker, started by an MPI launcher (needs the `mpi` feature).
    Mpi,
}

/// Which checkpoint a job continues from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Resume {
    /// A fresh run.
    #[default]
    No,
    /// The latest complete checkpoint in [`CheckpointSection::dir`] (none yet: a fresh run;
    /// a directory that does not exist is refused, as a mistyped path would be).
    Latest,
    /// The latest complete checkpoint in [`CheckpointSection::dir`] if there is one, else a
    /// fresh run, said so, the directory created if missing: one command line serves a job's
    /// first run and every requeue (Slurm's `--requeue`, a preempted job).
    IfPresent,
    /// The checkpoint at this path: a `step-NNNNNN` directory, or a checkpoint directory
    /// (its latest complete checkpoint).
    From(PathBuf),
}

/// The job's checkpoints: where they are written, how often, how many are kept, and which
/// one the job continues from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSection {
    /// Write checkpoints into this directory (`None`: none written).
    pub dir: Option<PathBuf>,
    /// Steps between checkpoints (positive).
    pub every: usize,
    /// The newest checkpoints kept in `dir` (0: every one).
    pub keep: usize,
    /// The checkpoint to continue from.
    pub resume: Resume,
    /// Continue although the seed, task, data, order or held-out share differ from the
    /// resumed checkpoint's (refused otherwise, naming each).
    pub allow_changed_settings: bool,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            dir: None,
            every: crate::checkpoint::DEFAULT_EVERY,
            keep: DEFAULT_KEEP,
            resume: Resume::No,
            allow_changed_settings: false,
        }
    }
}

impl CheckpointSection {
    /// Whether the job continues a checkpoint.
    pub fn resuming(&self) -> bool {
        self.resume != Resume::No
    }
}

/// What the job shows and exports while it trains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObserveSection {
    /// Serve Prometheus metrics on this `HOST:PORT` (under MPI, each process on PORT + its
    /// rank; port 0: a free one each).
    pub metrics_addr: Option<String>,
    /// Write one JSON line per step into this file (the reporting process).
    pub log: Option<PathBuf>,
    /// No progress and no notes beyond warnings.
    pub quiet: bool,
}

/// What the job leaves to write when it ends (the caller writes it: [`Finished::files`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputsSection {
    /// The final weights as safetensors (the GPT).
    pub save: Option<PathBuf>,
    /// The last step's measured timeline as a Chrome / Perfetto trace.
    pub trace: Option<PathBuf>,
    /// The last step's measured timeline as an SVG picture.
    pub svg: Option<PathBuf>,
}

/// One failure made on purpose, for tests of a multi-process job: rank `rank` fails at step
/// `step` (1-based) by `how`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Injection {
    /// The rank that fails.
    pub rank: usize,
    /// The step it fails at, counting from 1.
    pub step: usize,
    /// How it fails.
    pub how: How,
}

/// How an [`Injection`] makes a rank fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// A clean error, reported to the other ranks.
    Error,
    /// `exit(3)` without a word to anyone (a crash that MPI sees as a lost process).
    Exit,
    /// Death by SIGABRT.
    Abort,
}

/// Everything a job depends on: the training configuration and the job's own sections.
#[derive(Clone, Debug, PartialEq)]
pub struct JobConfig {
    /// What is trained, and how ([`TrainConfig::check`] checked it).
    pub train: TrainConfig,
    /// Checkpoints written and resumed.
    pub checkpoint: CheckpointSection,
    /// Progress, metrics and run log.
    pub observe: ObserveSection,
    /// What the job leaves to write.
    pub outputs: OutputsSection,
    /// Where the ranks run.
    pub transport: Transport,
    /// The initial weights as given (a file, or a checkpoint directory whose latest weights
    /// [`ModelSection::init_from`](crate::ModelSection::init_from) names), for the notes.
    pub init_from: Option<PathBuf>,
    /// For tests of multi-process jobs: a rank made to fail.
    pub inject_failure: Option<Injection>,
    /// How messages name fields.
    pub naming: Naming,
}

impl JobConfig {
    /// A job of `train` on local threads, without checkpoints, watch or outputs, its
    /// messages in field names.
    pub fn new(train: TrainConfig) -> Self {
        JobConfig {
            train,
            checkpoint: CheckpointSection::default(),
            observe: ObserveSection::default(),
            outputs: OutputsSection::default(),
            transport: Transport::Local,
            init_from: None,
            inject_failure: None,
            naming: Naming::Fields,
        }
    }

    /// `field` as this job's messages call it.
    pub fn name(&self, field: Field) -> String {
        field.name(self.naming)
    }

    /// Checks what the training configuration cannot: the checkpoint period, and an
    /// injected failure outside a multi-process job. ([`TrainConfig::check`] checks the rest.)
    pub fn check(&self) -> Result<(), crate::TrainError> {
        if self.checkpoint.every == 0 {
            return Err(crate::TrainError::Config(format!(
                "{} 0: give a positive number of steps, such as 500",
                self.name(Field::CheckpointEvery)
            )));
        }
        if self.transport == Transport::Local && self.inject_failure.is_some() {
            return Err(crate::TrainError::Config(format!(
                "{} needs {} mpi (it stops one process of a multi-process run)",
                self.name(Field::InjectFailure),
                self.name(Field::Transport)
            )));
        }
        Ok(())
    }
}

/// Runs jobs.
pub struct Job;

impl Job {
    /// Runs `config` (on `given`, a schedule read from a file, when set; its shape is the
    /// configuration's) to its end: every rank on a thread of this process, or this process's
    /// rank under MPI. Resumes as [`CheckpointSection::resume`] asks, watches the run with the
    /// watch `start` makes (given the plan and `say`), writes the checkpoints, and tells `say`
    /// what a user is told on the way. `Ok(Some)`: the process that reports (every local job;
    /// rank 0 under MPI); `Ok(None)`: another process of an MPI job. Under MPI a failure after
    /// MPI started ends the process (see `job::mpi`).
    pub fn run<W: Watch>(
        config: &JobConfig,
        given: Option<Schedule>,
        start: impl FnOnce(WatchPlan<'_>, &mut dyn FnMut(&str)) -> Result<W, WatchError>,
        say: &mut dyn FnMut(&str),
    ) -> Result<Option<Finished>, Failure> {
        config
            .check()
            .map_err(|e| Failure::setup(e, config.naming))?;
        match config.transport {
            Transport::Local => local::run_local(config, given, start, say).map(Some),
            #[cfg(feature = "mpi")]
            Transport::Mpi => mpi::run_rank(config, given, start, say),
            #[cfg(not(feature = "mpi"))]
            Transport::Mpi => Err(Failure::usage(format!(
                "{} mpi: this build has no MPI (the `mpi` feature); rebuild with it (needs an \
                 MPI such as MPICH with its headers, and libclang)",
                config.name(Field::Transport)
            ))),
        }
    }
}
