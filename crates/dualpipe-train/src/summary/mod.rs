//! [`RunSummary`]: what a run did and how the measured pipeline compares with the simulator's
//! prediction from the measured op times; as JSON ([`RunSummary::json`]), as a table
//! ([`RunSummary::table`]), and the last step's timeline as a trace or a picture.
//!
//! - [`builder`] — [`SummaryBuilder`]: the run's figures, one step at a time;
//! - `table` — [`RunSummary::table`]'s rendering.

use dualpipe_sim::svg::{self, SvgOptions};
use dualpipe_sim::{trace, Metrics, OpTimes, Timeline};
use serde::Serialize;

use crate::model::{Evaluation, Sample};

pub mod builder;
pub mod experts;
pub mod report;
mod table;

pub use builder::{median, SummaryBuilder};
pub use report::{StepEvent, StepExchange, StepReport};

/// The gradient bytes of the steps of one wire format ([`RunSummary::grad_bytes_by_format`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FormatBytes {
    /// The wire format (`none`, `bf16`, `int8`, `1bit`).
    pub compression: String,
    /// Steps exchanged in it.
    pub steps: u64,
    /// Bytes the replica sent on those steps (bodies and headers).
    pub bytes_sent: u64,
    /// What their bodies would have carried uncompressed.
    pub bytes_uncompressed: u64,
}

/// The summary of a finished run (the JSON output of `dualpipe train --format json`).
#[derive(Serialize, Debug, Clone)]
pub struct RunSummary {
    /// The model: `"gpt"` or `"mlp"`.
    pub model: String,
    /// The GPT's width, heads and sequence length (`null` for the MLP).
    pub d_model: Option<usize>,
    /// The GPT's attention heads.
    pub heads: Option<usize>,
    /// The GPT's tokens per sequence.
    pub seq_len: Option<usize>,
    /// What the GPT learned: the data file, or `"the markov task"` / `"the addition task"`
    /// (`null` for the MLP).
    pub data: Option<String>,
    /// Schedule kind.
    pub schedule: String,
    /// Pipeline ranks.
    pub ranks: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Rows per micro-batch.
    pub micro_batch_size: usize,
    /// Model width.
    pub hidden: usize,
    /// Blocks per model stage (of an even split).
    pub layers_per_stage: usize,
    /// The blocks of each model stage when they are not split evenly (`--partition`, a plan),
    /// as configured at the start of the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<Vec<usize>>,
    /// The activation recomputation when some stage recomputes (`"full"`, or one value per
    /// model stage, `"none,selective"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute: Option<String>,
    /// Whether the attention projections ran in the mixed-precision format too
    /// (`--half-projections`; written only when they did).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub half_projections: bool,
    /// Model stages along one pipeline.
    pub model_stages: usize,
    /// Optimizer name.
    pub optimizer: String,
    /// Learning rate (the schedule's peak).
    pub lr: f64,
    /// The learning-rate schedule when it is not constant, e.g. `"warm-up 30, cosine to
    /// 0.0003"` (`--lr-warmup`, `--lr-decay`, `--lr-min`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_schedule: Option<String>,
    /// Element type.
    pub dtype: String,
    /// Seed.
    pub seed: u64,
    /// Steps run.
    pub steps: usize,
    /// The number (1-based) of the first step this run ran: 1 for a fresh run, `N + 1` after
    /// resuming from a checkpoint of step `N`; `losses[i]` is step `first_step + i`'s.
    pub first_step: usize,
    /// The loss of every step (mean over its micro-batches).
    pub losses: Vec<f64>,
    /// The last step's loss.
    pub final_loss: f64,
    /// Training samples (rows, or sequences for the GPT) per second over the whole run.
    pub samples_per_second: f64,
    /// Training tokens per second over the whole run (the GPT; `null` for the MLP).
    pub tokens_per_second: Option<f64>,
    /// The last validation loss (mean next-token cross-entropy on the held-out text, nats).
    pub eval_loss: Option<f64>,
    /// The last validation's exact-match accuracy on held-out problems (the addition task
    /// only).
    pub accuracy: Option<f64>,
    /// The best possible validation loss, when the text's entropy is known (the Markov task).
    pub best_loss: Option<f64>,
    /// Every validation of the run, in order.
    pub evaluations: Vec<Evaluation>,
    /// Greedy continuations by the final model (the GPT).
    pub samples: Vec<Sample>,
    /// Wall-clock seconds of the whole run (steps only, not set-up).
    pub total_seconds: f64,
    /// Median wall-clock time of one step (data, pipeline, gradient sum, optimizer).
    pub step_seconds_median: f64,
    /// Median measured pipeline makespan (first op start to last op end).
    pub pipeline_seconds_median: f64,
    /// Measured bubble ratio: the share of rank time spent waiting for a message (or with
    /// the rank's program done while others still ran), out of ranks × pipeline time; time a
    /// rank waited for a core is not counted (see `core_wait_ratio`). Median over steps.
    pub bubble_ratio: f64,
    /// Share of rank time a rank was runnable but waited for a core (thread CPU time against
    /// wall time; median over steps). Above zero when busy threads outnumber cores.
    pub core_wait_ratio: f64,
    /// Share of rank time not inside a compute op on the measured timelines (the simulator's
    /// bubble metric applied to them; it counts core waits between ops as idle; median).
    pub timeline_idle_ratio: f64,
    /// Rank threads this process ran at the same time.
    pub rank_threads: usize,
    /// Cores this process could use.
    pub cores: usize,
    /// Seconds per step a rank's compute thread waited for messages (mean over ranks,
    /// median over steps).
    pub comm_wait_seconds: f64,
    /// Mean measured duration of each compute op kind, in seconds.
    pub op_seconds: OpTimes,
    /// The simulator's makespan for this schedule with the measured op durations.
    pub simulated_pipeline_seconds: Option<f64>,
    /// The simulator's bubble ratio with the measured op durations.
    pub simulated_bubble_ratio: Option<f64>,
    /// The last step's measured timeline and its metrics (not in the JSON; see
    /// [`RunSummary::trace`] and [`RunSummary::svg`]).
    #[serde(skip)]
    pub last_step: Option<(Timeline, Metrics)>,
    /// Data-parallel replicas of the pipeline.
    pub data_parallel: usize,
    /// The gradient exchange's wire format after the warm-up.
    pub gradient_compression: String,
    /// How the gradients moved with more than one replica: `"point-to-point"` (our
    /// exchange, every compression) or `"mpi-allreduce"` (MPI's own all-reduce, uncompressed
    /// under MPI); absent with one replica.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_exchange: Option<String>,
    /// Where the reporting worker's stage exchanges started: `"in-pipeline"` (each from the
    /// executor's hook, as soon as its gradients were final), `"after-pipeline"` or
    /// `"partly-in-pipeline"`; absent with one replica.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_exchange_started: Option<String>,
    /// Gradient bytes the exchange's transports sent over the run, all workers (0 with one
    /// replica).
    pub grad_bytes_sent: u64,
    /// What the same messages would have carried uncompressed.
    pub grad_bytes_uncompressed: u64,
    /// With a compression and more than one replica: the steps exchanged uncompressed first
    /// (`TrainConfig::compression_warmup_steps`, the default resolved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression_warmup: Option<u64>,
    /// Under 1-bit Adam: the step after which AdamW's variance is frozen and the momentum
    /// is exchanged in 1 bit (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_bit_adam_from: Option<u64>,
    /// Under f16 mixed precision: the loss scale of the last step (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// Under f16 mixed precision: steps whose optimizer step was skipped because their
    /// gradients overflowed (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_steps: Option<usize>,
    /// Under 1-bit Adam: the variance refresh period (0: frozen after the warm-up; absent
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variance_refresh: Option<u64>,
    /// Under 1-bit Adam: whether the refresh steps double (`variance_refresh` times a power
    /// of two) instead of recurring every `variance_refresh` steps (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variance_refresh_doubling: Option<bool>,
    /// With a compression: the L2 norm of the reporting replica's error-feedback residuals
    /// after each step (what compression still owes the model).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub feedback_norms: Vec<f64>,
    /// With a compression: the reporting replica's gradient bytes by the wire format of the
    /// step (1-bit Adam's int8 warm-up and refresh steps apart from its 1-bit steps).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub grad_bytes_by_format: Vec<FormatBytes>,
    /// The share of the run's time spent in the gradient exchange that compute did not hide
    /// (mean over replicas; the exchange follows the pipeline, so none of it is hidden).
    pub communication_overhead: f64,
    /// With MoE: every step's router load (tokens per block and expert, the worst block's
    /// max/mean); absent from the JSON for a dense model.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub expert_load_imbalance: Vec<crate::summary::experts::ExpertLoad>,
    /// With expert parallelism: EPLB's re-placements over the run (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eplb_rebalances: Option<usize>,
    /// With expert parallelism: expert replicas that changed worker over the run's
    /// re-placements.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts_moved: Option<usize>,
    /// With expert parallelism: the replicas the same re-placements would have moved had each
    /// been planned from scratch (without the placement in force).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts_moved_from_scratch: Option<u64>,
    /// With expert parallelism: bytes of expert weights and optimizer state the group's
    /// workers sent each other in the run's re-placements (in the model's float type).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_bytes_moved: Option<u64>,
    /// With an emulated expert link: the measured waits around the all-to-alls (absent
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_waits: Option<crate::summary::experts::ExpertWaits>,
}

impl RunSummary {
    /// The summary as pretty JSON, with a final newline.
    pub fn json(&self) -> String {
        let text = serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
        format!("{text}\n")
    }

    /// The last step's timeline as a Chrome / Perfetto trace (JSON), if a step ran.
    pub fn trace(&self) -> Option<String> {
        self.last_step
            .as_ref()
            .map(|(timeline, _)| trace::render_trace(timeline))
    }

    /// The last step's timeline as an SVG picture, titled with the run, if a step ran.
    pub fn svg(&self) -> Option<String> {
        self.last_step.as_ref().map(|(timeline, measured)| {
            let options = SvgOptions {
                title: Some(format!(
                    "measured: {} · {} ranks · {} micro-batches · step {}",
                    self.schedule, self.ranks, self.micro_batches, self.steps
                )),
                caption: vec![svg::caption(measured)],
            };
            svg::render_svg(timeline, &options)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::ScheduleSection;
    use std::time::Duration;

    use super::report::StepReport;
    use super::*;
    use crate::config::TrainConfig;

    #[test]
    fn the_bubble_counts_message_waits_and_core_waits_are_reported_apart() {
        use dualpipe_runtime::{RankTime, RankTimes};
        use dualpipe_schedule::{Chunk, Op, ScheduleKind};
        use dualpipe_sim::ComputeInterval;

        let config = TrainConfig {
            schedule: ScheduleSection {
                kind: ScheduleKind::OneFOneB,
                ranks: 2,
                micro_batches: 2,
                ..TrainConfig::DEFAULT.schedule
            },
            ..TrainConfig::default()
        };
        let schedule = dualpipe_schedule::build(ScheduleKind::OneFOneB, 2, 2, 1).unwrap();
        let mut timeline = Timeline::new(2);
        for rank in 0..2 {
            timeline.compute[rank].push(ComputeInterval {
                op: Op::F(Chunk::new(0, rank, 0)),
                start: 0.0,
                end: 0.5,
            });
        }
        timeline.compute[0][0].end = 1.0;
        let mut builder = SummaryBuilder::new(&config, &schedule);
        builder.add(StepReport {
            step: 0,
            losses: vec![1.0, 1.0],
            loss: 1.0,
            timeline: Some(timeline),
            wall: Duration::from_secs(1),
            rank_times: RankTimes {
                // Rank 0: 0.5 s of CPU, 0.5 s waiting for a core; rank 1: 0.5 s of CPU, then
                // 0.5 s blocked on a message.
                ranks: vec![
                    RankTime::new(1.0, 0.0, Some(0.5)),
                    RankTime::new(1.0, 0.5, Some(0.5)),
                ],
                threads: 4,
                cores: 2,
            },
            exchange: None,
            grad_norm: None,
            loss_scale: None,
            skipped: false,
            evaluation: None,
            expert_load: None,
        });
        let summary = builder.finish(Duration::from_secs(1), Vec::new());
        assert_eq!(summary.bubble_ratio, 0.25);
        assert_eq!(summary.core_wait_ratio, 0.25);
        assert_eq!(summary.timeline_idle_ratio, 0.25);
        assert_eq!((summary.rank_threads, summary.cores), (4, 2));
        let table = summary.table(true);
        assert!(table.contains("25.0% measured (message waits)"), "{table}");
        assert!(table.contains("25.0% of rank time waiting for a core (4 rank threads on 2 cores)"));
        assert!(
            table.contains("note: 4 busy rank threads share 2 cores"),
            "{table}"
        );
        assert!(
            !table.contains("expert load") && !table.contains("eplb"),
            "{table}"
        );
        let json = summary.json();
        for key in [
            "\"bubble_ratio\"",
            "\"core_wait_ratio\"",
            "\"timeline_idle_ratio\"",
            "\"cores\"",
        ] {
            assert!(json.contains(key), "{key}");
        }
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![f64::NAN, 1.0]), 1.0);
        assert!(median(Vec::new()).is_nan());
    }

    #[test]
    fn an_moe_run_shows_its_expert_load_and_re_placements() {
        use dualpipe_runtime::RankTimes;
        use dualpipe_schedule::ScheduleKind;

        let config = TrainConfig {
            schedule: ScheduleSection {
                kind: ScheduleKind::OneFOneB,
                ranks: 2,
                micro_batches: 2,
                ..TrainConfig::DEFAULT.schedule
            },
            ..TrainConfig::default()
        };
        let schedule = dualpipe_schedule::build(ScheduleKind::OneFOneB, 2, 2, 1).unwrap();
        let mut builder = SummaryBuilder::new(&config, &schedule);
        for (step, counts, rows) in [(0, [9, 1, 1, 1], [12, 2]), (1, [4, 3, 3, 2], [6, 6])] {
            builder.add(StepReport {
                step,
                losses: vec![1.0, 1.0],
                loss: 1.0,
                timeline: None,
                wall: Duration::from_secs(1),
                rank_times: RankTimes::default(),
                exchange: None,
                grad_norm: None,
                loss_scale: None,
                skipped: false,
                evaluation: None,
                expert_load: Some(
                    crate::summary::experts::ExpertLoad::new(step, vec![(0, counts.to_vec())])
                        .with_worker_rows(vec![(0, rows.to_vec())]),
                ),
            });
        }
        let mut summary = builder.finish(Duration::from_secs(2), Vec::new());
        summary.eplb_rebalances = Some(1);
        summary.experts_moved = Some(2);
        summary.experts_moved_from_scratch = Some(5);
        let table = summary.table(true);
        for row in [
            "max/mean tokens per expert 3.000 in the first step, 1.333 in the last",
            "max/mean rows per worker 1.714 in the first step, 1.000 in the last",
            "1 re-placements, 2 expert replicas moved (5 had each plan been made from scratch)",
        ] {
            assert!(table.contains(row), "{row} in {table}");
        }
    }
}
