//! The run report: a JSONL run log read back ([`read_log`]), its summary ([`RunReport`],
//! [`RunReport::text`]) and its pictures ([`RunReport::svg`]: loss and validation loss,
//! throughput, bubble ratio over the steps).

mod svg;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use crate::error::MetricsError;
use crate::record::StepRecord;

/// The largest run log read (1 GiB: about three million steps).
pub const MAX_LOG_BYTES: u64 = dualpipe_io::limits::RUN_LOG_BYTES;

/// A run log read back: its records, and what was skipped on the way.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogRead {
    /// The step records, in the file's order (their steps increase).
    pub records: Vec<StepRecord>,
    /// What was skipped, one sentence each (an incomplete last line).
    pub warnings: Vec<String>,
}

/// Reads a JSONL run log (`-` for standard input): one [`StepRecord`] per line; blank lines
/// are skipped. Errors name the line and what is wrong with it ([`read_log_checked`], without
/// its warnings).
pub fn read_log(path: &Path) -> Result<Vec<StepRecord>, MetricsError> {
    read_log_checked(path).map(|read| read.records)
}

/// Reads a JSONL run log (`-` for standard input), one [`StepRecord`] per line:
///
/// - blank lines and a UTF-8 byte-order mark at the start are skipped;
/// - a last line without its newline that is not a whole record (the run was killed, or its
///   disk filled, while writing it) is skipped with a warning;
/// - any other line that is not a step record is an error naming the line;
/// - steps must increase from line to line (gaps are fine: a resumed run whose log was
///   dropped for a while): a step that repeats or goes back means two runs in one file (logs
///   concatenated, or a run restarted without `--resume` into a copy), whose sums would mean
///   nothing, and is an error naming both lines;
/// - a FIFO, a device or a folder is refused before a byte is read (never blocking); at most
///   [`MAX_LOG_BYTES`] are read.
pub fn read_log_checked(path: &Path) -> Result<LogRead, MetricsError> {
    let fail = |reason: String| MetricsError::LogRead {
        path: path.to_path_buf(),
        reason,
    };
    let reader: Box<dyn Read> = if path == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(open_log(path).map_err(fail)?)
    };
    // Read at most one byte past the cap, so an endless stream stops too.
    let mut reader = BufReader::new(reader.take(MAX_LOG_BYTES + 1));
    let mut read = LogRead::default();
    let (mut total, mut buf, mut previous) = (0u64, Vec::new(), None::<(usize, usize)>);
    for number in 1.. {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| fail(format!("line {number}: {}", dualpipe_io::os_reason(&e))))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > MAX_LOG_BYTES {
            return Err(fail(format!(
                "larger than {MAX_LOG_BYTES} bytes, the most a run log may be; report on a part \
                 of it (e.g. `tail -n 100000`)"
            )));
        }
        let complete = buf.last() == Some(&b'\n');
        let mut line: &[u8] = &buf;
        if number == 1 {
            line = line.strip_prefix("\u{feff}".as_bytes()).unwrap_or(line);
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let record: StepRecord = match serde_json::from_slice(line) {
            Ok(record) => record,
            Err(_) if !complete => {
                read.warnings.push(format!(
                    "line {number} is an incomplete last line ({n} bytes, no newline: the run \
                     was stopped while writing it); skipped"
                ));
                break;
            }
            Err(e) => {
                return Err(fail(format!(
                    "line {number}: not a step record of `dualpipe train --log` ({e})"
                )))
            }
        };
        if let Some((step, at)) = previous.filter(|(step, _)| record.step <= *step) {
            return Err(fail(format!(
                "line {number}: step {} follows step {step} (line {at}): the steps do not \
                 increase, so these are two runs in one file (logs concatenated, or a run \
                 restarted); report on each run's lines alone",
                record.step
            )));
        }
        previous = Some((record.step, number));
        read.records.push(record);
    }
    if read.records.is_empty() {
        return Err(fail(
            "holds no step record; give the JSONL file written by `dualpipe train --log`".into(),
        ));
    }
    Ok(read)
}

/// Opens a log file through the one input path ([`dualpipe_io::open_regular`]): a regular
/// file of at most [`MAX_LOG_BYTES`]; a FIFO, a device or a folder is refused before a byte is
/// read (a FIFO never blocks the open).
fn open_log(path: &Path) -> Result<dualpipe_io::Regular, String> {
    dualpipe_io::open_regular(path, dualpipe_io::limits::RUN_LOG, "the run log")
        .map_err(|e| format!("{e} (the JSONL file of `train --log`)"))
}

/// The summary of a run, from its log.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RunReport {
    /// Steps logged.
    pub steps: usize,
    /// Seconds from the first step's start to the last step's end.
    pub total_seconds: f64,
    /// Loss of the first logged step.
    pub first_loss: f64,
    /// Loss of the last logged step.
    pub final_loss: f64,
    /// The lowest loss and its step.
    pub best_loss: (f64, usize),
    /// The last validation loss and its step, if any was measured.
    pub final_validation_loss: Option<(f64, usize)>,
    /// Tokens trained on over the run.
    pub tokens_total: u64,
    /// Tokens per second over the whole run.
    pub tokens_per_second: f64,
    /// Median step time, in seconds.
    pub step_seconds_median: f64,
    /// 90th-percentile step time, in seconds.
    pub step_seconds_p90: f64,
    /// Median measured bubble ratio (message waits only).
    pub bubble_ratio_median: f64,
    /// The simulator's bubble ratio at the last step, if known.
    pub bubble_ratio_simulated: Option<f64>,
    /// Median core-wait ratio.
    pub core_wait_ratio_median: f64,
    /// Rank threads and cores (of the last step).
    pub rank_threads: usize,
    /// Cores the process could use (of the last step).
    pub cores: usize,
    /// Median share of the step spent in the data-parallel gradient exchange.
    pub communication_overhead_ratio_median: f64,
    /// Bytes sent over the run: activation, gradient, expert, data-parallel.
    pub bytes_sent: [u64; 4],
    /// The records, for the pictures.
    #[serde(skip)]
    pub records: Vec<StepRecord>,
}

/// The `q`-quantile (0-1) of the finite values, nearest rank (NaN when there are none).
fn quantile(values: impl IntoIterator<Item = f64>, q: f64) -> f64 {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let at = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[at]
}

impl RunReport {
    /// The report of `records` (at least one; [`read_log`] never returns none).
    pub fn new(records: Vec<StepRecord>) -> Self {
        let first = records.first();
        let last = records.last();
        let best_loss = records
            .iter()
            .filter(|r| r.loss.is_finite())
            .map(|r| (r.loss, r.step))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap_or((f64::NAN, 0));
        let final_validation_loss = records
            .iter()
            .rev()
            .find_map(|r| r.validation_loss.map(|v| (v, r.step)));
        let start = first.map_or(0.0, |r| r.elapsed_seconds - r.step_seconds);
        let total_seconds = last.map_or(0.0, |r| r.elapsed_seconds) - start.max(0.0);
        let tokens_total: u64 = records.iter().map(|r| r.tokens).sum();
        let mut bytes = [0u64; 4];
        for r in &records {
            let b = r.bytes_sent;
            let kinds = [b.activation, b.gradient, b.expert, b.data_parallel];
            for (slot, v) in bytes.iter_mut().zip(kinds) {
                *slot = slot.saturating_add(v);
            }
        }
        RunReport {
            steps: records.len(),
            total_seconds,
            first_loss: first.map_or(f64::NAN, |r| r.loss),
            final_loss: last.map_or(f64::NAN, |r| r.loss),
            best_loss,
            final_validation_loss,
            tokens_total,
            tokens_per_second: tokens_total as f64 / total_seconds.max(1e-9),
            step_seconds_median: quantile(records.iter().map(|r| r.step_seconds), 0.5),
            step_seconds_p90: quantile(records.iter().map(|r| r.step_seconds), 0.9),
            bubble_ratio_median: quantile(records.iter().map(|r| r.bubble_ratio), 0.5),
            bubble_ratio_simulated: last.and_then(|r| r.bubble_ratio_simulated),
            core_wait_ratio_median: quantile(records.iter().map(|r| r.core_wait_ratio), 0.5),
            communication_overhead_ratio_median: quantile(
                records.iter().map(|r| r.communication_overhead_ratio),
                0.5,
            ),
            rank_threads: last.map_or(0, |r| r.rank_threads),
            cores: last.map_or(0, |r| r.cores),
            bytes_sent: bytes,
            records,
        }
    }

    /// The summary as text, one figure a line.
    pub fn text(&self, source: &str) -> String {
        let pct = |x: f64| format!("{:.1}%", 100.0 * x);
        let ms = |s: f64| format!("{:.2} ms", 1e3 * s);
        let validation = self
            .final_validation_loss
            .map_or("- (none measured)".into(), |(v, s)| {
                format!("{v:.6} at step {s}")
            });
        let rows = [
            (
                "loss",
                format!(
                    "{:.6} -> {:.6} (best {:.6} at step {})",
                    self.first_loss, self.final_loss, self.best_loss.0, self.best_loss.1
                ),
            ),
            ("validation loss", validation),
            (
                "throughput",
                format!(
                    "{:.0} tokens/s over the run, {} tokens in all",
                    self.tokens_per_second, self.tokens_total
                ),
            ),
            (
                "step time",
                format!(
                    "median {}, p90 {}",
                    ms(self.step_seconds_median),
                    ms(self.step_seconds_p90)
                ),
            ),
            (
                "bubble ratio",
                format!(
                    "median {} measured (message waits), {} simulated",
                    pct(self.bubble_ratio_median),
                    self.bubble_ratio_simulated.map_or("-".into(), pct)
                ),
            ),
            (
                "core contention",
                format!(
                    "median {} of rank time waiting for a core ({} rank threads on {} cores)",
                    pct(self.core_wait_ratio_median),
                    self.rank_threads,
                    self.cores
                ),
            ),
            (
                "bytes sent",
                format!(
                    "activation {}, gradient {}, expert {}, data-parallel {}",
                    bytes(self.bytes_sent[0]),
                    bytes(self.bytes_sent[1]),
                    bytes(self.bytes_sent[2]),
                    bytes(self.bytes_sent[3])
                ),
            ),
            (
                "data parallelism",
                format!(
                    "median {} of the step in the gradient exchange",
                    pct(self.communication_overhead_ratio_median)
                ),
            ),
        ];
        let mut out = format!(
            "dualpipe report: {source}, {} steps in {:.2} s\n\n",
            self.steps, self.total_seconds
        );
        for (name, value) in rows {
            out.push_str(&format!("  {name:<18}{value}\n"));
        }
        out
    }

    /// The pictures: loss (and validation loss), throughput and bubble ratio over the steps,
    /// as one SVG document.
    pub fn svg(&self, title: &str) -> String {
        svg::render(self, title)
    }
}

/// A byte count in B, kB, MB or GB (powers of 1000).
fn bytes(n: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

#[cfg(test)]
mod tests;
