//! `dualpipe train`: flags ([`TrainArgs`]) → [`TrainArgs::job`], the job's configuration
//! built once → [`Job::run`] (local threads, or this process's rank under MPI, feature `mpi`)
//! → the summary and the files it asks for, printed or written. Everything else (the resume
//! point, the checkpoints, the watch, which MPI process reports and how a failing one leaves)
//! is `dualpipe_train::job`'s; this module maps its failures to exit codes and prints.

use std::collections::HashSet;
use std::io::Write;
use std::sync::OnceLock;

use dualpipe_metrics::RunWatch;
use dualpipe_train::job::{Failure, Finished, Job, JobConfig, Transport};

use crate::train_args::{Format, TrainArgs};

use super::output::{check_paths, write_together};
use super::{Interrupted, UsageError};

/// Runs `dualpipe train`.
pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    match execute(&args)? {
        Some((job, finished)) => write(&args, &job, &finished),
        // `--profile`'s run, or a process of an MPI run other than rank 0 (which reports).
        None => Ok(()),
    }
}

/// Trains and returns what to write (`None`: nothing). Every output path is checked first,
/// so a bad one is found before training.
fn execute(args: &TrainArgs) -> anyhow::Result<Option<(JobConfig, Finished)>> {
    check_train_paths(args)?;
    let (job, given) = args.job().map_err(UsageError::from)?;
    if let Some(profile) = args.profile_run(&job.train).map_err(error)? {
        write_together(vec![(Some(profile.path), profile.text.into_bytes())])?;
        if let Some(note) = profile.note {
            say(&note);
        }
        return Ok(None);
    }
    // After this no flag is read: the job is its configuration.
    match job.transport {
        Transport::Local => Job::run(&job, given, RunWatch::start, &mut say),
        Transport::Mpi => run_rank(&job, given),
    }
    .map(|finished| finished.map(|f| (job, f)))
    .map_err(error)
}

/// The one check of `train`'s paths before any work (even before `--schedule-file` or
/// `--init-from` is read): no output (`--output` or standard output, `--log`, `--save`,
/// `--trace`, `--svg`, `--profile`) is the same file as an input (`--data`, `--init-from`,
/// `--plan`, `--schedule-file`, and the checkpoint files a resume or `--init-from` reads:
/// `latest` and the files of each `step-*` folder of `--checkpoint-dir`, `--resume-from` and a
/// folder given as `--init-from`) or as another output.
fn check_train_paths(args: &TrainArgs) -> anyhow::Result<()> {
    let mut inputs = vec![
        ("--data", args.data.as_deref()),
        ("--init-from", args.init_from.as_deref()),
        ("--plan", args.layout.plan.as_deref()),
        ("--schedule-file", args.schedule_file.as_deref()),
    ];
    let folders = [
        ("--checkpoint-dir (a checkpoint file)", &args.checkpoint_dir),
        ("--resume-from (a checkpoint file)", &args.resume_from),
        ("--init-from (a checkpoint file)", &args.init_from),
    ];
    let held: Vec<(&str, std::path::PathBuf)> = folders
        .iter()
        .filter_map(|(name, dir)| dir.as_deref().map(|d| (*name, d)))
        .flat_map(|(name, dir)| checkpoint_files(dir).into_iter().map(move |f| (name, f)))
        .collect();
    inputs.extend(held.iter().map(|(name, f)| (*name, Some(f.as_path()))));
    let side = [
        ("--log", args.observe.log.as_deref()),
        ("--save", args.save.as_deref()),
        ("--trace", args.trace.as_deref()),
        ("--svg", args.svg.as_deref()),
        ("--profile", args.layout.profile.as_deref()),
    ];
    // `--profile` runs print no summary: standard output is then not an output.
    match (&args.layout.profile, &args.output) {
        (Some(_), None) => check_paths(
            &inputs,
            ("--profile", args.layout.profile.as_deref()),
            &side[..4],
        ),
        _ => check_paths(&inputs, ("--output", args.output.as_deref()), &side),
    }
}

/// The files of a checkpoint folder a resume reads: its `latest`, and the files of the folder
/// itself and of each `step-*` folder in it (one descriptor at a time; a path that is not a
/// folder gives none).
fn checkpoint_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let files_of = |d: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(d)
            .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let mut files = Vec::new();
    for entry in files_of(dir) {
        let step = entry
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("step-"));
        if step && entry.is_dir() {
            files.extend(files_of(&entry));
        }
        files.push(entry);
    }
    files
}

/// Writes the weights, the trace and the picture (when asked) and the summary, all or
/// nothing.
fn write(args: &TrainArgs, job: &JobConfig, finished: &Finished) -> anyhow::Result<()> {
    let mut files: Vec<_> = finished
        .files(&job.outputs)
        .into_iter()
        .map(|(p, b)| (Some(p), b))
        .collect();
    // The summary as --format asks (the table without its loss lines with --quiet).
    let text = match args.format {
        Format::Json => finished.summary.json(),
        Format::Table => finished.summary.table(job.observe.quiet),
    };
    files.push((args.output.clone(), text.into_bytes()));
    write_together(files)
}

/// Prints one line on stderr in one write (launchers that tag each write with its rank would
/// split a line written in pieces), a backquoted field named by its flag as `main` does.
fn say(line: &str) {
    static FLAGS: OnceLock<HashSet<String>> = OnceLock::new();
    let flags = FLAGS.get_or_init(crate::wording::flags_of::<TrainArgs>);
    let line = crate::wording::in_flags(line, flags);
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// A failure as `main` reports it: a usage error exits with code 2, a run a signal stopped
/// with `128 + signal`.
fn error(failure: Failure) -> anyhow::Error {
    if failure.signal.is_some() {
        let code = failure.exit_code();
        return Interrupted {
            message: failure.message,
            code,
        }
        .into();
    }
    if failure.usage {
        UsageError(failure.message).into()
    } else {
        anyhow::anyhow!(failure.message)
    }
}

#[cfg(feature = "mpi")]
fn run_rank(
    job: &JobConfig,
    given: Option<dualpipe_schedule::Schedule>,
) -> Result<Option<Finished>, Failure> {
    Job::run(job, given, RunWatch::start, &mut say)
}

#[cfg(not(feature = "mpi"))]
fn run_rank(
    _job: &JobConfig,
    _given: Option<dualpipe_schedule::Schedule>,
) -> Result<Option<Finished>, Failure> {
    Err(Failure::usage(
        "--transport mpi: this dualpipe was built without MPI; rebuild it with \
         `cargo build --release --features mpi` (needs an MPI such as MPICH with its headers, \
         and libclang), then start it with `mpirun -n RANKS dualpipe train --transport mpi ...`",
    ))
}
