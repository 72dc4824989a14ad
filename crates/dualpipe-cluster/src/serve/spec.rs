//! The jobs of the real mode: what a user submits ([`JobRequest`]) and what the scheduler
//! records of each ([`JobRecord`], journaled whole).

use serde::{Deserialize, Serialize};

use crate::names::is_format_char;

/// A job as submitted: the training command's arguments (without the ones the scheduler
/// sets) and the rank counts it may run on.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    /// A name for people (the id is the scheduler's).
    #[serde(default)]
    pub name: Option<String>,
    /// The training command's arguments.
    pub args: Vec<String>,
    /// The fewest ranks (slots) the job runs on.
    pub min_ranks: usize,
    /// The most ranks (slots) the job runs on; equal to `min_ranks` for a rigid job.
    pub max_ranks: usize,
    /// The client's id for this submission (1 to 64 of `A-Za-z0-9._-`): a request sent again
    /// with the same id is answered with the job it queued, never queues a second one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// The longest job name, in characters.
pub const MAX_NAME_CHARS: usize = 100;

impl JobRequest {
    /// Checks what needs no knowledge of the training command or of the scheduler: the
    /// rank counts' order, the name (at most [`MAX_NAME_CHARS`] characters, none a control or
    /// format character such as a right-to-left override), the request id, and arguments
    /// without a NUL byte. The error is one line.
    pub fn check(&self) -> Result<(), String> {
        if self.min_ranks == 0 || self.max_ranks < self.min_ranks {
            return Err(format!(
                "min_ranks {} and max_ranks {}: give 1 <= min_ranks <= max_ranks",
                self.min_ranks, self.max_ranks
            ));
        }
        if let Some(name) = &self.name {
            if name.chars().count() > MAX_NAME_CHARS
                || name.chars().any(|c| c.is_control() || is_format_char(c))
            {
                return Err(format!(
                    "name: give at most {MAX_NAME_CHARS} printable characters (no control or \
                     format characters such as U+202E)"
                ));
            }
        }
        if let Some(id) = &self.request_id {
            let ok = (1..=64).contains(&id.len())
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !ok {
                return Err("request_id: give 1 to 64 of A-Z, a-z, 0-9, '.', '_', '-'".into());
            }
        }
        if let Some(i) = self.args.iter().position(|a| a.contains('\0')) {
            return Err(format!(
                "args[{i}] holds a NUL byte, which no command line can carry; remove it"
            ));
        }
        Ok(())
    }
}

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Waiting for slots (a new job, or one to resume).
    Queued,
    /// A process runs it.
    Running,
    /// Its process was asked to stop (SIGTERM) and has not ended yet.
    Stopping,
    /// Its process finished every step.
    Done,
    /// It cannot run: its command was refused, or it crashed more often than allowed.
    Failed,
    /// Cancelled by a user.
    Cancelled,
}

impl Phase {
    /// The phase's name, as the API and the metrics spell it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Queued => "queued",
            Phase::Running => "running",
            Phase::Stopping => "stopping",
            Phase::Done => "done",
            Phase::Failed => "failed",
            Phase::Cancelled => "cancelled",
        }
    }

    /// Whether the job has ended for good.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Done | Phase::Failed | Phase::Cancelled)
    }
}

/// Why a process was asked to stop.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A hot migration or a resize: resume on `target`.
    Move,
    /// A user cancelled the job.
    Cancel,
    /// The scheduler is shutting down: resume when it starts again.
    Shutdown,
}

/// What a pause is waiting for: the first step after a move or after a crash.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PauseKind {
    /// Stopped for a migration or a resize.
    Move,
    /// The process crashed and is being resumed from its last checkpoint.
    Crash,
}

/// An open pause: since when (Unix seconds) and why.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Pause {
    /// Unix seconds at which the job stopped making progress.
    pub since: f64,
    /// Why.
    pub kind: PauseKind,
}

/// Everything the scheduler knows of one job (journaled in the state file).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobRecord {
    /// The scheduler's id (`job-0001`, ...).
    pub id: String,
    /// Submission order (first come, first served).
    pub seq: u64,
    /// The user's name for it.
    pub name: Option<String>,
    /// The training command's arguments, as submitted.
    pub args: Vec<String>,
    /// The fewest ranks.
    pub min_ranks: usize,
    /// The most ranks.
    pub max_ranks: usize,
    /// The rank counts in `min_ranks..=max_ranks` whose shape the training command accepts.
    pub allowed: Vec<usize>,
    /// The steps the job trains in all.
    pub steps: usize,
    /// Where it is.
    pub phase: Phase,
    /// The slots its process holds (running or stopping).
    pub slots: Vec<usize>,
    /// Where a job stopping for a move resumes.
    pub target: Vec<usize>,
    /// Why its process is stopping.
    pub stop_reason: Option<StopReason>,
    /// The process id of its current process (also its process group's id).
    pub pid: Option<u32>,
    /// That process's start time (`/proc/PID/stat` field 22, clock ticks after boot): with
    /// the pid, what proves a process is this job's after a restart.
    #[serde(default)]
    pub pid_start: Option<u64>,
    /// The client's id of the submission that queued it.
    #[serde(default)]
    pub request_id: Option<String>,
    /// Where its current process serves its metrics.
    pub metrics_addr: Option<String>,
    /// Processes started for it.
    pub attempts: u32,
    /// Processes that ended without being asked to (each resumed from its checkpoint).
    pub crashes: u32,
    /// Moves to other slots on the same rank count.
    pub migrations: u32,
    /// Moves to another rank count.
    pub resizes: u32,
    /// Unix seconds of submission.
    pub submitted_at: f64,
    /// Unix seconds its first process started.
    pub started_at: Option<f64>,
    /// Unix seconds it ended.
    pub finished_at: Option<f64>,
    /// Seconds a process of it was alive.
    pub run_s: f64,
    /// Seconds lost to moves: from the stop request to the first step after the resume.
    pub move_pause_s: f64,
    /// Each move's pause, in seconds.
    pub move_pauses: Vec<f64>,
    /// Each crash's recovery, in seconds: from the crash seen to the first step after it.
    pub recoveries: Vec<f64>,
    /// The open pause, if the job waits for its first step after a move or a crash.
    pub pause: Option<Pause>,
    /// The last step finished (from its run log).
    pub step: usize,
    /// The mean seconds per step of its current process (scraped).
    pub step_seconds: Option<f64>,
    /// The last training loss (scraped).
    pub loss: Option<f64>,
    /// Why it failed, or the last thing that went wrong.
    pub message: Option<String>,
}

impl JobRecord {
    /// A new queued job.
    pub fn new(
        id: String,
        seq: u64,
        request: JobRequest,
        allowed: Vec<usize>,
        steps: usize,
        now: f64,
    ) -> Self {
        JobRecord {
            id,
            seq,
            name: request.name,
            args: request.args,
            min_ranks: request.min_ranks,
            max_ranks: request.max_ranks,
            allowed,
            steps,
            phase: Phase::Queued,
            slots: Vec::new(),
            target: Vec::new(),
            stop_reason: None,
            pid: None,
            pid_start: None,
            request_id: request.request_id,
            metrics_addr: None,
            attempts: 0,
            crashes: 0,
            migrations: 0,
            resizes: 0,
            submitted_at: now,
            started_at: None,
            finished_at: None,
            run_s: 0.0,
            move_pause_s: 0.0,
            move_pauses: Vec::new(),
            recoveries: Vec::new(),
            pause: None,
            step: 0,
            step_seconds: None,
            loss: None,
            message: None,
        }
    }

    /// The slots the job keeps from others now: its own, and a move's target.
    pub fn held(&self) -> impl Iterator<Item = usize> + '_ {
        self.slots.iter().chain(self.target.iter()).copied()
    }

    /// Seconds its remaining steps take at the scraped rate (`None` before a scrape).
    pub fn remaining_s(&self) -> Option<f64> {
        self.step_seconds
            .map(|s| s * self.steps.saturating_sub(self.step) as f64)
    }

    /// The pause a move of this job is expected to cost: the mean of its measured ones, or
    /// `default_s` before the first.
    pub fn expected_pause(&self, default_s: f64) -> f64 {
        if self.move_pauses.is_empty() {
            default_s
        } else {
            self.move_pauses.iter().sum::<f64>() / self.move_pauses.len() as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str, args: &[&str]) -> JobRequest {
        JobRequest {
            name: Some(name.into()),
            args: args.iter().map(|a| a.to_string()).collect(),
            min_ranks: 1,
            max_ranks: 1,
            request_id: None,
        }
    }

    #[test]
    fn names_count_characters_and_refuse_format_characters() {
        assert_eq!(request(&"\u{e9}".repeat(100), &[]).check(), Ok(()));
        assert!(request(&"\u{e9}".repeat(101), &[]).check().is_err());
        for bad in ["evil\u{202e}gnp.exe", "a\u{200b}b", "x\u{1b}[31m", "a\nb"] {
            let e = request(bad, &[]).check().unwrap_err();
            assert!(e.contains("format characters"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_nul_in_an_argument_and_a_bad_request_id_are_refused() {
        let e = request("a", &["--steps", "3", "a\0b"]).check().unwrap_err();
        assert!(e.contains("args[2]") && e.contains("NUL"), "{e}");
        let mut r = request("a", &[]);
        r.request_id = Some("id with spaces".into());
        assert!(r.check().unwrap_err().contains("request_id"));
        r.request_id = Some("a".repeat(65));
        assert!(r.check().is_err());
        r.request_id = Some("cli-1234.5_x".into());
        assert_eq!(r.check(), Ok(()));
    }
}
