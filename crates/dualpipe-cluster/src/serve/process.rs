//! The jobs' processes: the [`Launcher`] that knows the training command, and the spawning,
//! signalling and finding of processes.
//!
//! Each process runs in a process group of its own (a Ctrl-C on the scheduler's terminal
//! reaches only the scheduler, which stops its jobs in order) and is asked to receive
//! SIGTERM when the scheduler dies (`PR_SET_PDEATHSIG`), so a killed scheduler leaves no job
//! running: each writes its final checkpoint and ends, and the restarted scheduler resumes it.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::spec::JobRecord;

/// The files of one job in the state directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobPaths {
    /// The job's own directory.
    pub dir: PathBuf,
    /// Its checkpoint directory (kept across moves).
    pub checkpoints: PathBuf,
    /// Its JSONL run log (one record per step, kept across moves).
    pub log: PathBuf,
    /// Its processes' standard output and error, appended.
    pub output: PathBuf,
}

impl JobPaths {
    /// The paths of job `id` under `state`.
    pub fn new(state: &Path, id: &str) -> Self {
        let dir = state.join("jobs").join(id);
        JobPaths {
            checkpoints: dir.join("checkpoints"),
            log: dir.join("run.jsonl"),
            output: dir.join("output.log"),
            dir,
        }
    }
}

/// A program and its arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

/// What knows the training command: its checks and its command line.
pub trait Launcher: Send {
    /// Checks a job's arguments on each rank count in `min_ranks..=max_ranks`: the counts
    /// it runs on (the same model on each) and the steps it trains, or one line saying
    /// what is wrong.
    fn check(
        &self,
        args: &[String],
        min_ranks: usize,
        max_ranks: usize,
    ) -> Result<(Vec<usize>, usize), String>;
    /// The command that runs `job` on `ranks` ranks, resuming from its checkpoints if any,
    /// with its files at `paths` and its metrics served at `metrics_addr`.
    fn command(
        &self,
        job: &JobRecord,
        ranks: usize,
        paths: &JobPaths,
        metrics_addr: &str,
    ) -> Launch;
}

/// Starts `launch` with its output appended to `output`, in a process group of its own,
/// asked to receive SIGTERM when this thread's process dies.
///
/// Call it from the thread that lives as long as the scheduler: the kernel sends the
/// signal when the *thread* that spawned the child ends.
pub fn spawn(launch: &Launch, output: &Path) -> io::Result<Child> {
    let out = OpenOptions::new().create(true).append(true).open(output)?;
    let err = out.try_clone()?;
    let parent = std::process::id() as libc::pid_t;
    let mut cmd = Command::new(&launch.program);
    cmd.args(&launch.args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    // SAFETY: the closure only makes async-signal-safe system calls (prctl, getppid).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(io::Error::other("the scheduler ended"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Sends `signal` to process `pid` (errors ignored: it may have ended).
pub fn signal(pid: u32, signal: i32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) with a positive pid touches no memory of ours.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// Whether process `pid` exists and its command line mentions `marker` (so a reused pid
/// of another program is not taken for a job's process).
pub fn alive(pid: u32, marker: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let marker = marker.as_os_str().as_encoded_bytes();
    !marker.is_empty() && cmdline.windows(marker.len()).any(|w| w == marker)
}

/// The processes whose command line mentions `marker` (this process excluded).
pub fn holders(marker: &Path) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && alive(pid, marker))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawned_process_is_found_signalled_and_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("out.log");
        let marker = dir.path().join("marker-for-this-test");
        let launch = Launch {
            program: "sh".into(),
            args: vec![
                "-c".into(),
                "echo started; exec sleep 30".into(),
                marker.display().to_string(),
            ],
        };
        let mut child = spawn(&launch, &output).unwrap();
        let pid = child.id();
        // sh execs sleep, whose command line no longer holds the marker: wait for `started`.
        for _ in 0..100 {
            if std::fs::read_to_string(&output)
                .unwrap_or_default()
                .contains("started")
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!alive(pid, &dir.path().join("another")));
        assert_eq!(holders(&dir.path().join("another")), Vec::<u32>::new());
        signal(pid, libc::SIGTERM);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        assert!(!alive(pid, &marker));
        assert!(std::fs::read_to_string(&output)
            .unwrap()
            .contains("started"));
    }
}
