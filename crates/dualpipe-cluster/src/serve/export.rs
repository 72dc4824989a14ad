//! The scheduler's own Prometheus metrics (`GET /metrics` on its address).

use std::fmt::Write;

use super::journal::Journal;
use super::spec::Phase;

/// The Prometheus text page of the scheduler's state: slots, queue, utilisation,
/// fragmentation, moves, recoveries, jobs by phase, and whether the journal is written
/// (`journal_ok`).
pub fn render(journal: &Journal, busy_slots: usize, journal_ok: bool) -> String {
    let t = &journal.totals;
    let queued = journal
        .jobs
        .iter()
        .filter(|j| j.phase == Phase::Queued)
        .count();
    let share = |x: f64| if t.slot_s > 0.0 { x / t.slot_s } else { 0.0 };
    let pause: f64 = journal.jobs.iter().map(|j| j.move_pause_s).sum();
    let run: f64 = journal.jobs.iter().map(|j| j.run_s).sum();
    let recovery: f64 = journal.jobs.iter().flat_map(|j| j.recoveries.iter()).sum();
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    metric(
        "dualpipe_cluster_journal_ok",
        "gauge",
        "1 while the scheduler's last journal write succeeded, 0 while it cannot journal (it then refuses submissions and cancels).",
        if journal_ok { 1.0 } else { 0.0 },
    );
    metric(
        "dualpipe_cluster_slots",
        "gauge",
        "Slots (one rank each) the scheduler runs jobs on.",
        journal.slots as f64,
    );
    metric(
        "dualpipe_cluster_slots_busy",
        "gauge",
        "Slots held by a job's process now.",
        busy_slots as f64,
    );
    metric(
        "dualpipe_cluster_queue_length",
        "gauge",
        "Jobs waiting for slots now.",
        queued as f64,
    );
    metric(
        "dualpipe_cluster_utilization",
        "gauge",
        "Busy slot-seconds over slot-seconds since the state was created.",
        share(t.busy_slot_s),
    );
    metric(
        "dualpipe_cluster_fragmentation",
        "gauge",
        "Slot-seconds free while a job waited, over slot-seconds since the state was created.",
        share(t.stranded_slot_s),
    );
    metric(
        "dualpipe_cluster_migrations_total",
        "counter",
        "Running jobs moved to other slots on the same rank count.",
        t.migrations as f64,
    );
    metric(
        "dualpipe_cluster_resizes_total",
        "counter",
        "Running jobs moved to another rank count.",
        t.resizes as f64,
    );
    metric(
        "dualpipe_cluster_recoveries_total",
        "counter",
        "Crashed jobs resumed from their last checkpoint.",
        t.recoveries as f64,
    );
    metric(
        "dualpipe_cluster_move_pause_seconds_total",
        "counter",
        "Seconds jobs spent between a move's stop request and their first step after it.",
        pause,
    );
    metric(
        "dualpipe_cluster_recovery_seconds_total",
        "counter",
        "Seconds from a crash seen to the job's first step after it.",
        recovery,
    );
    metric(
        "dualpipe_cluster_migration_overhead",
        "gauge",
        "Move pauses over the jobs' run time.",
        if run > 0.0 { pause / run } else { 0.0 },
    );
    let _ = writeln!(
        out,
        "# HELP dualpipe_cluster_jobs Jobs by phase.\n# TYPE dualpipe_cluster_jobs gauge"
    );
    for phase in [
        Phase::Queued,
        Phase::Running,
        Phase::Stopping,
        Phase::Done,
        Phase::Failed,
        Phase::Cancelled,
    ] {
        let n = journal.jobs.iter().filter(|j| j.phase == phase).count();
        let _ = writeln!(
            out,
            "dualpipe_cluster_jobs{{phase=\"{}\"}} {n}",
            phase.name()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_holds_every_metric_with_its_type() {
        let mut j = Journal::new(4);
        j.totals.slot_s = 100.0;
        j.totals.busy_slot_s = 75.0;
        j.totals.migrations = 2;
        let page = render(&j, 3, true);
        assert!(render(&j, 3, false).contains("dualpipe_cluster_journal_ok 0\n"));
        for needle in [
            "dualpipe_cluster_slots 4\n",
            "dualpipe_cluster_journal_ok 1\n",
            "dualpipe_cluster_slots_busy 3\n",
            "dualpipe_cluster_utilization 0.75\n",
            "# TYPE dualpipe_cluster_migrations_total counter\n",
            "dualpipe_cluster_migrations_total 2\n",
            "dualpipe_cluster_queue_length 0\n",
            "dualpipe_cluster_jobs{phase=\"queued\"} 0\n",
        ] {
            assert!(page.contains(needle), "missing {needle:?} in\n{page}");
        }
    }
}
