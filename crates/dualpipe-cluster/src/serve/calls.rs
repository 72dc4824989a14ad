//! The scheduler's answers to the API's calls, on its loop: submit (idempotent by request
//! id), list, cancel and the metrics page. A change that cannot be journaled is refused
//! (`503`) and undone.

use super::api::{Call, Checked, Reply};
use super::process::signal;
use super::scheduler::{unix_now, Scheduler};
use super::spec::{JobRecord, Phase, StopReason};

impl Scheduler<'_> {
    /// Answers one API call.
    pub(super) fn call(&mut self, call: Call) -> Reply {
        match call {
            Call::Submit(checked) => self.submit(checked),
            Call::List => {
                let busy = self.busy();
                Reply::json(
                    200,
                    &serde_json::json!({
                        "slots": self.options.slots,
                        "busy": busy,
                        "totals": self.journal.totals,
                        "journal_error": self.journal_error,
                        "jobs": self.journal.jobs,
                    }),
                )
            }
            Call::Cancel(id) => self.cancel(&id),
            Call::Metrics => Reply {
                status: 200,
                body: super::export::render(
                    &self.journal,
                    self.busy(),
                    self.journal_error.is_none(),
                ),
                content_type: "text/plain; version=0.0.4; charset=utf-8",
            },
        }
    }

    /// Slots held by running or stopping jobs.
    pub(super) fn busy(&self) -> usize {
        self.journal
            .jobs
            .iter()
            .filter(|j| matches!(j.phase, Phase::Running | Phase::Stopping))
            .map(|j| j.slots.len())
            .sum()
    }

    /// A `503` when the journal cannot be written now (tried once more first).
    fn journal_refuses(&mut self) -> Option<Reply> {
        if self.journal_error.is_some() && !self.save() {
            let e = self.journal_error.clone().unwrap_or_default();
            return Some(Reply::error(
                503,
                &format!("the scheduler cannot journal its state ({e}); nothing was changed"),
            ));
        }
        None
    }

    fn submit(&mut self, checked: Checked) -> Reply {
        if let Some(rid) = &checked.request.request_id {
            if let Some(j) = self
                .journal
                .jobs
                .iter()
                .find(|j| j.request_id.as_ref() == Some(rid))
            {
                return Reply::json(200, &serde_json::json!({ "id": j.id, "repeated": true }));
            }
        }
        if let Some(refused) = self.journal_refuses() {
            return refused;
        }
        let Checked {
            request,
            allowed,
            steps,
        } = checked;
        let seq = self.journal.next_seq;
        self.journal.next_seq += 1;
        let id = format!("job-{seq:04}");
        let job = JobRecord::new(id.clone(), seq, request, allowed.clone(), steps, unix_now());
        let name = job
            .name
            .clone()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        self.journal.jobs.push(job);
        if !self.save() {
            self.journal.jobs.pop();
            self.journal.next_seq -= 1;
            let e = self.journal_error.clone().unwrap_or_default();
            return Reply::error(
                503,
                &format!("the scheduler cannot journal its state ({e}); nothing was submitted"),
            );
        }
        self.event(&format!(
            "{id}{name}: submitted, {steps} steps on {allowed:?} ranks"
        ));
        Reply::json(201, &serde_json::json!({ "id": id }))
    }

    fn cancel(&mut self, id: &str) -> Reply {
        let Some(phase) = self.job_mut(id).map(|j| j.phase) else {
            return Reply::error(404, &format!("no job {id}"));
        };
        if phase.is_final() {
            return Reply::error(409, &format!("{id} is already {}", phase.name()));
        }
        if let Some(refused) = self.journal_refuses() {
            return refused;
        }
        let job = self.job_mut(id).expect("found above");
        match job.phase {
            Phase::Queued => {
                job.phase = Phase::Cancelled;
                job.finished_at = Some(unix_now());
            }
            _ => {
                if let Some(pid) = job.pid {
                    // Our own child, not yet reaped: its pid cannot have been reused.
                    signal(pid, libc::SIGTERM);
                }
                job.phase = Phase::Stopping;
                job.stop_reason = Some(StopReason::Cancel);
                job.target.clear();
                job.pause = None;
            }
        }
        self.event(&format!("{id}: cancel requested"));
        self.save();
        Reply::json(200, &serde_json::json!({ "id": id, "cancelled": true }))
    }
}
