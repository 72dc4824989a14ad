//! A restarted scheduler's first act: the jobs its journal says were running. Their
//! processes were asked to stop when the previous scheduler died (`PR_SET_PDEATHSIG`); those
//! proven to be theirs (the journaled pid, start time and process group, [`Identity`]) are
//! waited for up to `stop_grace`, then their process group is killed. No other process is
//! waited for or signalled, whatever its command line says. Then each job is queued to
//! resume (or recorded cancelled, if that was asked).

use std::time::{Duration, Instant};

use super::process::Identity;
use super::scheduler::{unix_now, Scheduler};
use super::spec::{JobRecord, Phase, StopReason};

/// How long a killed process group may take to be gone.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// The identity journaled for a job's process, if any (its process group is its own pid).
pub fn journaled(job: &JobRecord) -> Option<Identity> {
    Some(Identity {
        pid: job.pid?,
        start: job.pid_start?,
        pgid: job.pid?,
    })
}

impl Scheduler<'_> {
    /// Waits for the proven processes of the jobs a killed scheduler left running, kills
    /// those still there after `stop_grace`, and queues their jobs to resume.
    pub(super) fn recover(&mut self) {
        let deadline = Instant::now() + self.options.stop_grace;
        let left: Vec<(String, Option<Identity>)> = self
            .journal
            .jobs
            .iter()
            .filter(|j| matches!(j.phase, Phase::Running | Phase::Stopping))
            .map(|j| (j.id.clone(), journaled(j)))
            .collect();
        let proven: Vec<Identity> = left.iter().filter_map(|(_, i)| *i).collect();
        while proven.iter().any(Identity::alive) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for (id, identity) in &left {
            if let Some(i) = identity.filter(Identity::alive) {
                let text = format!(
                    "{id}: its process {} is still running after `stop_grace`; killing its \
                     process group",
                    i.pid
                );
                self.event(&text);
                i.signal_group(libc::SIGKILL);
            }
        }
        let killed = Instant::now() + KILL_WAIT;
        while proven.iter().any(Identity::alive) && Instant::now() < killed {
            std::thread::sleep(Duration::from_millis(20));
        }
        for (id, _) in left {
            let job = self.job_mut(&id).expect("listed");
            let cancelled = job.stop_reason == Some(StopReason::Cancel);
            job.phase = if cancelled {
                Phase::Cancelled
            } else {
                Phase::Queued
            };
            if cancelled {
                job.finished_at = Some(unix_now());
            }
            job.slots.clear();
            job.target.clear();
            job.stop_reason = None;
            job.pid = None;
            job.pid_start = None;
            job.metrics_addr = None;
            job.pause = None;
            let text = if cancelled {
                format!("{id}: cancelled (its process ended while the scheduler was down)")
            } else {
                format!("{id}: found running from before a restart; queued to resume from its last checkpoint")
            };
            self.event(&text);
        }
    }
}
