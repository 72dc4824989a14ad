//! [`TrainingMetrics`]: the Prometheus registry of a training run and the handles that update
//! it. Every metric is an atomic (histogram buckets sit behind their own short lock), so the
//! training thread never waits for a scrape and a scrape never waits for a step.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::record::StepRecord;

/// The one prefix of every metric name.
pub const PREFIX: &str = "dualpipe";

/// Why a rank waited (the `reason` label of `dualpipe_rank_wait_seconds_total`).
pub const WAIT_REASONS: [&str; 2] = ["message", "core"];

/// What bytes carried (the `kind` label of `dualpipe_bytes_sent_total`).
pub const BYTE_KINDS: [&str; 4] = ["activation", "gradient", "expert", "data_parallel"];

type Labels = Vec<(String, String)>;
type F64Gauge = Gauge<f64, AtomicU64>;
type F64Counter = Counter<f64, AtomicU64>;

/// The metrics of one training run: `dualpipe_*`, base units, `_total` counters, ratios 0-1,
/// labels `rank`, `reason`, `kind` only. Clones share the same values.
#[derive(Clone)]
pub struct TrainingMetrics {
    registry: std::sync::Arc<Registry>,
    bubble: F64Gauge,
    bubble_simulated: F64Gauge,
    core_wait: F64Gauge,
    overhead: F64Gauge,
    step_duration: Histogram,
    steps: Counter,
    tokens: Counter,
    loss: F64Gauge,
    validation_loss: F64Gauge,
    tokens_per_second: F64Gauge,
    rank_busy: Family<Labels, F64Counter>,
    rank_wait: Family<Labels, F64Counter>,
    bytes_sent: Family<Labels, Counter>,
    checkpoint_save: Histogram,
    checkpoints: Counter,
}

impl std::fmt::Debug for TrainingMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainingMetrics").finish_non_exhaustive()
    }
}

fn label(pairs: &[(&str, String)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

impl TrainingMetrics {
    /// Every metric registered, for a pipeline of `ranks` ranks (each rank's series exist from
    /// the start, at 0). The validation loss and the simulated bubble read NaN until known.
    pub fn new(ranks: usize) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let m = TrainingMetrics {
            registry: Default::default(),
            bubble: Default::default(),
            bubble_simulated: Default::default(),
            core_wait: Default::default(),
            overhead: Default::default(),
            // 1 ms to about 33 s.
            step_duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            steps: Default::default(),
            tokens: Default::default(),
            loss: Default::default(),
            validation_loss: Default::default(),
            tokens_per_second: Default::default(),
            rank_busy: Default::default(),
            rank_wait: Default::default(),
            bytes_sent: Default::default(),
            // 1 ms to about 65 s.
            checkpoint_save: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            checkpoints: Default::default(),
        };
        m.loss.set(f64::NAN);
        m.validation_loss.set(f64::NAN);
        m.bubble_simulated.set(f64::NAN);
        registry.register(
            "pipeline_bubble_ratio",
            "Measured pipeline bubble of the last step: share of rank time spent waiting for a message (0-1)",
            m.bubble.clone(),
        );
        registry.register(
            "pipeline_bubble_ratio_simulated",
            "The simulator's bubble ratio for this schedule with the op times measured so far (0-1)",
            m.bubble_simulated.clone(),
        );
        registry.register(
            "core_wait_ratio",
            "Share of rank time of the last step spent runnable but waiting for a core (0-1)",
            m.core_wait.clone(),
        );
        registry.register(
            "communication_overhead_ratio",
            "Share of the last step this replica spent in the data-parallel gradient exchange (0-1; 0 with one replica)",
            m.overhead.clone(),
        );
        registry.register(
            "step_duration_seconds",
            "Wall-clock time of a training step",
            m.step_duration.clone(),
        );
        registry.register("steps", "Training steps finished", m.steps.clone());
        registry.register(
            "tokens",
            "Tokens trained on (rows for the MLP model)",
            m.tokens.clone(),
        );
        registry.register("loss", "Training loss of the last step", m.loss.clone());
        registry.register(
            "validation_loss",
            "The last validation loss measured (NaN until one is)",
            m.validation_loss.clone(),
        );
        registry.register(
            "tokens_per_second",
            "Tokens per wall-clock second of the last step",
            m.tokens_per_second.clone(),
        );
        registry.register(
            "rank_busy_seconds",
            "CPU time of each rank's thread during the pipeline",
            m.rank_busy.clone(),
        );
        registry.register(
            "rank_wait_seconds",
            "Time each rank waited during the pipeline, by reason: a message, or a core",
            m.rank_wait.clone(),
        );
        registry.register(
            "bytes_sent",
            "Bytes sent between workers, by kind: activation, gradient, expert, data_parallel",
            m.bytes_sent.clone(),
        );
        registry.register(
            "checkpoint_save_seconds",
            "Time the background writer took to encode, write and sync a checkpoint (this process's share under MPI)",
            m.checkpoint_save.clone(),
        );
        registry.register(
            "checkpoints",
            "Checkpoints written (this process's shares under MPI)",
            m.checkpoints.clone(),
        );
        for rank in 0..ranks {
            drop(
                m.rank_busy
                    .get_or_create(&label(&[("rank", rank.to_string())])),
            );
            for reason in WAIT_REASONS {
                drop(m.rank_wait.get_or_create(&label(&[
                    ("rank", rank.to_string()),
                    ("reason", reason.to_string()),
                ])));
            }
        }
        for kind in BYTE_KINDS {
            drop(
                m.bytes_sent
                    .get_or_create(&label(&[("kind", kind.to_string())])),
            );
        }
        TrainingMetrics {
            registry: std::sync::Arc::new(registry),
            ..m
        }
    }

    /// Takes in one finished step.
    pub fn record(&self, step: &StepRecord) {
        self.bubble.set(step.bubble_ratio);
        self.bubble_simulated
            .set(step.bubble_ratio_simulated.unwrap_or(f64::NAN));
        self.core_wait.set(step.core_wait_ratio);
        self.overhead.set(step.communication_overhead_ratio);
        self.step_duration.observe(step.step_seconds);
        self.steps.inc();
        self.tokens.inc_by(step.tokens);
        self.loss.set(step.loss);
        if let Some(v) = step.validation_loss {
            self.validation_loss.set(v);
        }
        self.tokens_per_second.set(step.tokens_per_second);
        for r in &step.ranks {
            let rank = r.rank.to_string();
            self.rank_busy
                .get_or_create(&label(&[("rank", rank.clone())]))
                .inc_by(r.busy_seconds.max(0.0));
            for (reason, seconds) in [
                ("message", r.message_wait_seconds),
                ("core", r.core_wait_seconds),
            ] {
                self.rank_wait
                    .get_or_create(&label(&[
                        ("rank", rank.clone()),
                        ("reason", reason.to_string()),
                    ]))
                    .inc_by(seconds.max(0.0));
            }
        }
        let b = step.bytes_sent;
        for (kind, bytes) in [
            ("activation", b.activation),
            ("gradient", b.gradient),
            ("expert", b.expert),
            ("data_parallel", b.data_parallel),
        ] {
            self.bytes_sent
                .get_or_create(&label(&[("kind", kind.to_string())]))
                .inc_by(bytes);
        }
    }

    /// Takes in one checkpoint written in `seconds` (on the checkpoint writer's thread).
    pub fn record_checkpoint(&self, seconds: f64) {
        self.checkpoint_save.observe(seconds.max(0.0));
        self.checkpoints.inc();
    }

    /// Records a validation loss measured outside a step record.
    pub fn set_validation_loss(&self, loss: f64) {
        self.validation_loss.set(loss);
    }

    /// Steps recorded so far.
    pub fn steps(&self) -> u64 {
        self.steps.get()
    }

    /// The exposition in the OpenMetrics text format (ends with `# EOF`).
    pub fn openmetrics(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }

    /// The exposition in the Prometheus text format 0.0.4.
    pub fn prometheus_text(&self) -> String {
        to_prometheus_text(&self.openmetrics())
    }
}

/// Turns an OpenMetrics text exposition into the Prometheus text format 0.0.4: a counter
/// family is named with its `_total` suffix in `# HELP` / `# TYPE`, and the `# UNIT` and
/// `# EOF` lines go (the older format has neither).
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(name)
                .then(|| format!("{tag}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(l.trim_end()),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{BytesSent, RankRecord};

    fn step(n: usize) -> StepRecord {
        StepRecord {
            step: n,
            elapsed_seconds: n as f64 * 0.1,
            step_seconds: 0.1,
            pipeline_seconds: 0.08,
            loss: 0.5,
            validation_loss: None,
            tokens: 64,
            tokens_total: 64 * n as u64,
            tokens_per_second: 640.0,
            bubble_ratio: 0.2,
            bubble_ratio_simulated: Some(0.1),
            core_wait_ratio: 0.3,
            communication_overhead_ratio: 0.25,
            rank_threads: 2,
            cores: 2,
            ranks: vec![RankRecord {
                rank: 1,
                busy_seconds: 0.05,
                message_wait_seconds: 0.01,
                core_wait_seconds: 0.02,
            }],
            bytes_sent: BytesSent {
                activation: 1000,
                gradient: 500,
                expert: 0,
                data_parallel: 300,
            },
        }
    }

    #[test]
    fn names_follow_the_prometheus_rules() {
        let m = TrainingMetrics::new(2);
        m.record(&step(1));
        m.record(&step(2));
        let text = m.openmetrics();
        for needle in [
            "dualpipe_pipeline_bubble_ratio 0.2",
            "dualpipe_pipeline_bubble_ratio_simulated 0.1",
            "dualpipe_communication_overhead_ratio 0.25",
            "dualpipe_steps_total 2",
            "dualpipe_tokens_total 128",
            "dualpipe_step_duration_seconds_count 2",
            "dualpipe_rank_busy_seconds_total{rank=\"0\"} 0.0",
            "dualpipe_rank_busy_seconds_total{rank=\"1\"} 0.1",
            "dualpipe_rank_wait_seconds_total{rank=\"1\",reason=\"core\"} 0.04",
            "dualpipe_bytes_sent_total{kind=\"activation\"} 2000",
            "dualpipe_bytes_sent_total{kind=\"expert\"} 0",
            "dualpipe_bytes_sent_total{kind=\"data_parallel\"} 600",
            "dualpipe_validation_loss NaN",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("dualpipe_"), "{line}");
        }
        m.set_validation_loss(0.75);
        assert!(m.openmetrics().contains("dualpipe_validation_loss 0.75"));
        assert!(m.openmetrics().contains("dualpipe_checkpoints_total 0\n"));
        let writer = m.clone();
        std::thread::spawn(move || writer.record_checkpoint(0.003))
            .join()
            .unwrap();
        let text = m.openmetrics();
        for needle in [
            "dualpipe_checkpoints_total 1\n",
            "dualpipe_checkpoint_save_seconds_count 1\n",
            "dualpipe_checkpoint_save_seconds_sum 0.003\n",
            "dualpipe_checkpoint_save_seconds_bucket{le=\"0.004\"} 1\n",
            "dualpipe_checkpoint_save_seconds_bucket{le=\"0.002\"} 0\n",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }

    #[test]
    fn the_prometheus_format_names_counters_with_total() {
        let m = TrainingMetrics::new(1);
        let text = m.prometheus_text();
        assert!(text.contains("# TYPE dualpipe_steps_total counter\n"));
        assert!(text.contains("# HELP dualpipe_steps_total Training steps finished.\n"));
        assert!(text.contains("# TYPE dualpipe_loss gauge\n"));
        assert!(text.contains("# TYPE dualpipe_step_duration_seconds histogram\n"));
        assert!(!text.contains("# EOF"));
    }
}
