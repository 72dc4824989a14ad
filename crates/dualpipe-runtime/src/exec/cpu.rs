//! Where a rank's time goes during a step: its thread's CPU time against the wall clock, so
//! idle time splits into waiting for a message (the pipeline's bubble) and waiting for a core
//! (runnable but not running: more busy threads than cores).

use std::time::Duration;

/// The CPU time this thread has used so far, in seconds (`CLOCK_THREAD_CPUTIME_ID`); `None`
/// where the platform has no per-thread CPU clock.
pub fn thread_cpu_seconds() -> Option<f64> {
    thread_cpu()
}

#[cfg(unix)]
fn thread_cpu() -> Option<f64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID is a clock id every supported unix defines.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    (rc == 0).then_some(now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9)
}

#[cfg(not(unix))]
fn thread_cpu() -> Option<f64> {
    None
}

/// Seconds this thread has spent runnable but waiting on a run queue so far (Linux's
/// `/proc/thread-self/schedstat`, second field); `None` where the kernel does not keep it.
/// It is exactly "runnable but not running", including the wait for a core after a message
/// woke the thread.
pub fn thread_run_delay_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(nanos as f64 * 1e-9)
}

/// The cores this process may run on (`std::thread::available_parallelism`, 1 if unknown).
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Where one rank's time went during one step, in seconds from the common step start.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankTime {
    /// Wall time from the step start until the rank's program ended.
    pub active_seconds: f64,
    /// CPU time of the rank's thread while its program ran (when the platform has no thread
    /// CPU clock: the active time less the message waits, i.e. no core wait is assumed).
    pub cpu_seconds: f64,
    /// Wall time the rank was blocked waiting for a message from another rank. Where the
    /// kernel keeps a run delay (Linux), the time the thread was blocked (neither running nor
    /// runnable), so the wait for a core after the message came is a core wait; elsewhere the
    /// wall time of the blocking receives.
    pub message_wait_seconds: f64,
    /// Runnable but not running: the kernel's run delay where it keeps one, else the active
    /// time that was neither CPU time nor a message wait (never negative).
    pub core_wait_seconds: f64,
    /// Whether `cpu_seconds` was measured (`false` where no thread CPU clock exists).
    pub cpu_measured: bool,
}

impl RankTime {
    /// The split of a rank that ran `active` seconds, used `cpu` seconds of CPU and waited
    /// `run_delay` seconds on a run queue (the kernel's count): the rest of the time it was
    /// blocked, i.e. waiting for a message.
    pub fn from_run_delay(active: f64, cpu: f64, run_delay: f64) -> Self {
        let active = active.max(0.0);
        let cpu = cpu.clamp(0.0, active);
        let core = run_delay.clamp(0.0, active - cpu);
        RankTime {
            active_seconds: active,
            cpu_seconds: cpu,
            message_wait_seconds: active - cpu - core,
            core_wait_seconds: core,
            cpu_measured: true,
        }
    }

    /// The split of a rank that ran `active` seconds, blocked `message_wait` of them on
    /// receives and used `cpu` seconds of CPU (`None`: not measured), where no run delay is
    /// known: the core wait is what is left.
    pub fn new(active: f64, message_wait: f64, cpu: Option<f64>) -> Self {
        let active = active.max(0.0);
        let message_wait = message_wait.clamp(0.0, active);
        match cpu {
            Some(cpu) => {
                let cpu = cpu.clamp(0.0, active);
                RankTime {
                    active_seconds: active,
                    cpu_seconds: cpu,
                    message_wait_seconds: message_wait,
                    core_wait_seconds: (active - message_wait - cpu).max(0.0),
                    cpu_measured: true,
                }
            }
            None => RankTime {
                active_seconds: active,
                cpu_seconds: active - message_wait,
                message_wait_seconds: message_wait,
                core_wait_seconds: 0.0,
                cpu_measured: false,
            },
        }
    }
}

/// Every rank's [`RankTime`] of one step, with how many rank threads this process ran at once
/// and how many cores it had.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankTimes {
    /// `ranks[r]`: rank r's split.
    pub ranks: Vec<RankTime>,
    /// Rank threads this process ran at the same time (every rank with local threads, one per
    /// process under MPI).
    pub threads: usize,
    /// Cores this process could use.
    pub cores: usize,
}

/// A step's time over every rank, as fractions of `ranks × makespan` (they add up to 1).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TimeSplit {
    /// Share of the time the rank threads ran on a core.
    pub busy_ratio: f64,
    /// Share of the time ranks had nothing to run because a message had not arrived (or their
    /// program was done while others still ran): the pipeline bubble.
    pub bubble_ratio: f64,
    /// Share of the time ranks were runnable but waited for a core (core contention).
    pub core_wait_ratio: f64,
}

impl RankTimes {
    /// Whether this process ran more busy rank threads than it had cores.
    pub fn oversubscribed(&self) -> bool {
        self.threads > self.cores
    }

    /// The step's split over `makespan` seconds: the core waits are each rank's
    /// [`RankTime::core_wait_seconds`], the busy time its CPU time, and the bubble all the
    /// rest of the makespan (message waits, and the time before a rank's first op or after its
    /// last one). All zero when there are no ranks or the makespan is not positive.
    pub fn split(&self, makespan: f64) -> TimeSplit {
        if self.ranks.is_empty() || makespan.is_nan() || makespan <= 0.0 {
            return TimeSplit::default();
        }
        let total = makespan * self.ranks.len() as f64;
        let (mut busy, mut core) = (0.0, 0.0);
        for r in &self.ranks {
            let rank_busy = r.cpu_seconds.min(makespan);
            busy += rank_busy;
            core += r.core_wait_seconds.min(makespan - rank_busy);
        }
        let bubble = (total - busy - core).max(0.0);
        TimeSplit {
            busy_ratio: busy / total,
            bubble_ratio: bubble / total,
            core_wait_ratio: core / total,
        }
    }

    /// The rank threads' CPU time as a duration (all ranks together).
    pub fn cpu_total(&self) -> Duration {
        Duration::from_secs_f64(self.ranks.iter().map(|r| r.cpu_seconds.max(0.0)).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_counts_work_and_not_sleep() {
        let Some(before) = thread_cpu_seconds() else {
            return;
        };
        std::thread::sleep(Duration::from_millis(30));
        let slept = thread_cpu_seconds().unwrap() - before;
        let mut x = 0u64;
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let worked = thread_cpu_seconds().unwrap() - before - slept;
        assert!(slept < 0.015, "sleeping used {slept} s of CPU");
        assert!(worked > 0.005, "spinning used only {worked} s of CPU");
    }

    #[test]
    fn the_run_delay_only_grows() {
        let Some(first) = thread_run_delay_seconds() else {
            return;
        };
        std::thread::yield_now();
        let second = thread_run_delay_seconds().unwrap();
        assert!(first >= 0.0 && second >= first, "{first} then {second}");
    }

    #[test]
    fn idle_time_splits_into_message_and_core_waits() {
        let r = RankTime::new(1.0, 0.25, Some(0.5));
        assert_eq!(r.core_wait_seconds, 0.25);
        let kernel = RankTime::from_run_delay(1.0, 0.5, 0.125);
        assert_eq!(
            (kernel.message_wait_seconds, kernel.core_wait_seconds),
            (0.375, 0.125)
        );
        assert_eq!(
            RankTime::from_run_delay(1.0, 0.5, 0.75).core_wait_seconds,
            0.5
        );
        let unmeasured = RankTime::new(1.0, 0.25, None);
        assert_eq!(
            (unmeasured.cpu_seconds, unmeasured.core_wait_seconds),
            (0.75, 0.0)
        );
        // CPU time over the active time (clock granularity) is clamped.
        assert_eq!(RankTime::new(1.0, 0.0, Some(1.1)).cpu_seconds, 1.0);
        let times = RankTimes {
            ranks: vec![r, RankTime::new(0.5, 0.0, Some(0.5))],
            threads: 2,
            cores: 1,
        };
        assert!(times.oversubscribed());
        let split = times.split(1.0);
        assert_eq!(split.busy_ratio, 0.5);
        assert_eq!(split.core_wait_ratio, 0.125);
        // Rank 0's message wait (0.25) and rank 1's idle tail (0.5), out of 2 s.
        assert_eq!(split.bubble_ratio, 0.375);
        assert_eq!(RankTimes::default().split(1.0), TimeSplit::default());
    }
}
