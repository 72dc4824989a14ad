//! `cluster simulate`'s progress on standard error: a bar on a terminal; otherwise one line
//! every few seconds, so a batch run's log shows it moving; nothing with `--quiet`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use dualpipe_cluster::Tick;
use indicatif::ProgressBar;

use crate::cmd::progress_bar;

/// Seconds between two lines when standard error is not a terminal.
const EVERY: Duration = Duration::from_secs(5);

/// Where the progress goes.
enum Sink {
    /// Nothing (`--quiet`).
    Quiet,
    /// A bar on the terminal.
    Bar(ProgressBar),
    /// A line every `every` to `out`, the next one due at `due`.
    Lines {
        out: Box<dyn Write>,
        every: Duration,
        due: Instant,
    },
}

/// Tells a simulation's progress (module documentation).
pub(super) struct Reporter {
    sink: Sink,
    started: Instant,
}

impl Reporter {
    /// The reporter for a run of `jobs` jobs: quiet, a bar when standard error is a terminal,
    /// lines otherwise.
    pub(super) fn new(quiet: bool, jobs: usize) -> Reporter {
        if quiet {
            return Reporter::with(Sink::Quiet);
        }
        if std::io::stderr().is_terminal() {
            let bar = progress_bar(
                false,
                "simulating: {pos}/{len} jobs finished, {msg} [{elapsed_precise}, about {eta} left]",
            );
            bar.set_length(jobs as u64);
            return Reporter::with(Sink::Bar(bar));
        }
        Reporter::lines(Box::new(std::io::stderr()), EVERY)
    }

    /// Lines to `out`, one every `every` at most.
    fn lines(out: Box<dyn Write>, every: Duration) -> Reporter {
        Reporter::with(Sink::Lines {
            out,
            every,
            due: Instant::now() + every,
        })
    }

    fn with(sink: Sink) -> Reporter {
        Reporter {
            sink,
            started: Instant::now(),
        }
    }

    /// Takes one tick of the run.
    pub(super) fn tick(&mut self, tick: Tick) {
        match &mut self.sink {
            Sink::Quiet => {}
            Sink::Bar(bar) => {
                bar.set_position(tick.finished as u64);
                bar.set_message(format!("sim time {:.1} h", tick.sim_s / 3600.0));
            }
            Sink::Lines { out, every, due } => {
                let now = Instant::now();
                if now >= *due {
                    *due = now + *every;
                    // A log that cannot be written to loses the line, not the run.
                    let _ = writeln!(out, "{}", line(&tick, now - self.started));
                }
            }
        }
    }

    /// Clears the bar.
    pub(super) fn finish(self) {
        if let Sink::Bar(bar) = self.sink {
            bar.finish_and_clear();
        }
    }
}

/// `simulated 52,341 of 200,000 jobs (26%), sim time 3.1 h, 12 s`.
fn line(tick: &Tick, elapsed: Duration) -> String {
    let share = (100 * tick.finished).checked_div(tick.jobs).unwrap_or(100);
    format!(
        "simulated {} of {} jobs ({share}%), sim time {:.1} h, {} s",
        grouped(tick.finished),
        grouped(tick.jobs),
        tick.sim_s / 3600.0,
        elapsed.as_secs()
    )
}

/// `n` with a comma between groups of three digits.
fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn tick(finished: usize) -> Tick {
        Tick {
            finished,
            jobs: 200_000,
            sim_s: 11_160.0,
        }
    }

    #[test]
    fn a_line_says_jobs_share_and_times() {
        assert_eq!(
            line(&tick(52_341), Duration::from_millis(12_400)),
            "simulated 52,341 of 200,000 jobs (26%), sim time 3.1 h, 12 s"
        );
        assert_eq!(
            [0, 7, 999, 1000, 12_345, 1_000_000].map(grouped),
            ["0", "7", "999", "1,000", "12,345", "1,000,000"]
        );
    }

    #[test]
    fn lines_come_when_due_and_never_when_quiet() {
        let out = Shared::default();
        let mut every_tick = Reporter::lines(Box::new(out.clone()), Duration::ZERO);
        every_tick.tick(tick(1));
        every_tick.tick(tick(2));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.starts_with("simulated 1 of 200,000 jobs (0%)"),
            "{text}"
        );
        // Not due yet: nothing.
        let out = Shared::default();
        let mut hourly = Reporter::lines(Box::new(out.clone()), Duration::from_secs(3600));
        hourly.tick(tick(1));
        assert!(out.0.lock().unwrap().is_empty());
        let mut quiet = Reporter::new(true, 10);
        quiet.tick(tick(1));
        assert!(matches!(quiet.sink, Sink::Quiet));
    }
}
