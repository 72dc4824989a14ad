//! The jobs' processes: the [`Launcher`] that knows the training command, and the spawning,
//! signalling and identifying of processes.
//!
//! Each process runs in a process group of its own (a Ctrl-C on the scheduler's terminal
//! reaches only the scheduler, which stops its jobs in order) and is asked to receive
//! SIGTERM when the scheduler dies (`PR_SET_PDEATHSIG`), so a killed scheduler leaves no job
//! running: each writes its final checkpoint and ends, and the restarted scheduler resumes it.
//!
//! A process is known by its [`Identity`] (pid, start time and process group, from
//! `/proc/PID/stat`), journaled when it starts: a restarted scheduler waits for, or signals,
//! only a process whose identity is the journaled one, never one found by its command line.

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
    /// The folder of the job's own files: its processes' working directory, where relative
    /// paths in its flags point, and the only place its outputs may go.
    pub files: PathBuf,
}

impl JobPaths {
    /// The paths of job `id` under `state`.
    pub fn new(state: &Path, id: &str) -> Self {
        let dir = state.join("jobs").join(id);
        JobPaths {
            checkpoints: dir.join("checkpoints"),
            log: dir.join("run.jsonl"),
            output: dir.join("output.log"),
            files: dir.join("files"),
            dir,
        }
    }
}

/// A program, its arguments and its working directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its working directory.
    pub cwd: PathBuf,
}

/// What knows the training command: its checks and its command line. The checks run on the
/// API's threads, off the scheduler's loop, so they must be bounded in time and memory.
pub trait Launcher: Send + Sync {
    /// Checks a job's arguments on each rank count in `min_ranks..=max_ranks`: the counts
    /// it runs on (the same model on each) and the steps it trains, or one line saying
    /// what is wrong (a path outside what a job may read or write among them).
    fn check(
        &self,
        args: &[String],
        min_ranks: usize,
        max_ranks: usize,
    ) -> Result<(Vec<usize>, usize), String>;
    /// The command that runs `job` on `ranks` ranks, resuming from its checkpoints if any,
    /// with its files at `paths` and its metrics served at `metrics_addr`; or why it cannot
    /// run (its paths checked again: a data root may have changed since the submission).
    fn command(
        &self,
        job: &JobRecord,
        ranks: usize,
        paths: &JobPaths,
        metrics_addr: &str,
    ) -> Result<Launch, String>;
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
        .current_dir(&launch.cwd)
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

/// What proves a process is the one started: its pid, its start time (`/proc/PID/stat`
/// field 22, clock ticks after boot; a reused pid has another) and its process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The process id.
    pub pid: u32,
    /// Its start time, in clock ticks after boot.
    pub start: u64,
    /// Its process group.
    pub pgid: u32,
}

impl Identity {
    /// The identity of the live process `pid` (`None` when there is none, or it is a zombie).
    pub fn of(pid: u32) -> Option<Identity> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command's name (field 2) is in parentheses and may hold anything: read after
        // its last ')'. Then field 3 is the state, 5 the process group, 22 the start time.
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            return None;
        }
        Some(Identity {
            pid,
            pgid: fields.get(2)?.parse().ok()?,
            start: fields.get(19)?.parse().ok()?,
        })
    }

    /// Whether the process this identity names still runs (the same pid, start time and
    /// process group).
    pub fn alive(&self) -> bool {
        Identity::of(self.pid) == Some(*self)
    }

    /// Sends `signal` to this identity's process group, if its leader is still this very
    /// process (never to a pid that has been reused since).
    pub fn signal_group(&self, signal: i32) {
        if !self.alive() {
            return;
        }
        if let Ok(pgid) = libc::pid_t::try_from(self.pgid) {
            // SAFETY: kill(2) with a negative pid (a process group) touches no memory of ours.
            unsafe {
                libc::kill(-pgid, signal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawned_process_is_identified_signalled_and_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("out.log");
        let launch = Launch {
            program: "sh".into(),
            args: vec!["-c".into(), "pwd; echo started; exec sleep 30".into()],
            cwd: dir.path().to_path_buf(),
        };
        let mut child = spawn(&launch, &output).unwrap();
        let pid = child.id();
        let me = Identity::of(pid).unwrap();
        // Its own process group, led by itself.
        assert_eq!(me.pgid, pid);
        // Another start time is another process (a reused pid).
        let other = Identity {
            start: me.start + 1,
            ..me
        };
        assert!(me.alive() && !other.alive());
        other.signal_group(libc::SIGTERM);
        assert!(
            me.alive(),
            "a signal to another identity reached the process"
        );
        for _ in 0..100 {
            if std::fs::read_to_string(&output)
                .unwrap_or_default()
                .contains("started")
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        me.signal_group(libc::SIGTERM);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        assert!(!me.alive());
        let text = std::fs::read_to_string(&output).unwrap();
        // It ran in the launch's working directory.
        let cwd = std::fs::canonicalize(dir.path()).unwrap();
        assert!(text.starts_with(&format!("{}\n", cwd.display())), "{text}");
    }
}
