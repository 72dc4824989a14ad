//! [`RunSummary`]: what a run did and how the measured pipeline compares with the simulator's
//! prediction from the measured op times; as JSON ([`RunSummary::json`]), as a table
//! ([`RunSummary::table`]), and the last step's timeline as a trace or a picture.

use std::time::Duration;

use dualpipe_schedule::Schedule;
use dualpipe_sim::svg::{self, SvgOptions};
use dualpipe_sim::{metrics, simulate, trace, CostModel, Metrics, OpTally, OpTimes, Timeline};
use serde::Serialize;

use crate::config::{ModelKind, TrainConfig};
use crate::trainer::StepReport;
use crate::workload::{Evaluation, Sample};

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
    /// Model stages along one pipeline.
    pub model_stages: usize,
    /// Optimizer name.
    pub optimizer: String,
    /// Learning rate.
    pub lr: f64,
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
    /// Gradient bytes the exchange's transports sent over the run, all workers (0 with one
    /// replica).
    pub grad_bytes_sent: u64,
    /// What the same messages would have carried uncompressed.
    pub grad_bytes_uncompressed: u64,
    /// The share of the run's time spent in the gradient exchange that compute did not hide
    /// (mean over replicas; the exchange follows the pipeline, so none of it is hidden).
    pub communication_overhead: f64,
    /// With MoE: every step's router load (tokens per block and expert, the worst block's
    /// max/mean); absent from the JSON for a dense model.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub expert_load_imbalance: Vec<crate::moe::ExpertLoad>,
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
    /// With an emulated expert link: the measured waits around the all-to-alls (absent
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_waits: Option<crate::moe::ExpertWaits>,
}

/// Builds a [`RunSummary`] one step at a time, keeping a few numbers per step and the last
/// timeline only.
#[derive(Debug)]
pub struct SummaryBuilder {
    config: TrainConfig,
    schedule: Schedule,
    losses: Vec<f64>,
    walls: Vec<f64>,
    makespans: Vec<f64>,
    bubbles: Vec<f64>,
    core_waits: Vec<f64>,
    idles: Vec<f64>,
    threads: usize,
    cores: usize,
    comm_waits: Vec<f64>,
    ops: OpTally,
    evaluations: Vec<Evaluation>,
    last_step: Option<(Timeline, Metrics)>,
    expert_loads: Vec<crate::moe::ExpertLoad>,
    first_step: Option<usize>,
}

impl SummaryBuilder {
    /// An empty summary of a run of `config` on `schedule`.
    pub fn new(config: &TrainConfig, schedule: &Schedule) -> Self {
        dualpipe_nn::gpt::moe::waits::reset();
        SummaryBuilder {
            config: config.clone(),
            schedule: schedule.clone(),
            losses: Vec::new(),
            walls: Vec::new(),
            makespans: Vec::new(),
            bubbles: Vec::new(),
            core_waits: Vec::new(),
            idles: Vec::new(),
            threads: 0,
            cores: 0,
            comm_waits: Vec::new(),
            ops: OpTally::default(),
            evaluations: Vec::new(),
            last_step: None,
            expert_loads: Vec::new(),
            first_step: None,
        }
    }

    /// Adds one step.
    pub fn add(&mut self, report: StepReport) {
        self.first_step.get_or_insert(report.step + 1);
        self.losses.push(report.loss);
        self.walls.push(report.wall.as_secs_f64());
        self.evaluations.extend(report.evaluation);
        self.expert_loads.extend(report.expert_load);
        if let Some(timeline) = report.timeline {
            let measured = metrics(&timeline, &self.schedule.placement);
            self.makespans.push(measured.makespan);
            let split = report.rank_times.split(measured.makespan);
            self.bubbles.push(split.bubble_ratio);
            self.core_waits.push(split.core_wait_ratio);
            self.idles.push(measured.bubble_ratio);
            self.threads = self.threads.max(report.rank_times.threads);
            self.cores = self.cores.max(report.rank_times.cores);
            self.comm_waits.push(
                timeline.comm_wait.iter().sum::<f64>() / timeline.comm_wait.len().max(1) as f64,
            );
            self.ops.add(&timeline);
            self.last_step = Some((timeline, measured));
        }
    }

    /// The summary, with `total` the wall-clock time of all steps and `samples` the final
    /// model's continuations.
    pub fn finish(self, total: Duration, samples: Vec<Sample>) -> RunSummary {
        let config = &self.config;
        let total_seconds = total.as_secs_f64();
        let samples_per_step = (config.micro_batches as f64)
            * (config.micro_batch_size as f64)
            * config.data_parallel.max(1) as f64;
        let gpt = config.model == ModelKind::Gpt;
        let last_eval = self.evaluations.last().copied();
        let times = self.ops.means();
        let simulated = times
            .stage_cost()
            .map(|compute| CostModel {
                compute,
                ..CostModel::default()
            })
            .and_then(|cost| simulate(&self.schedule, &cost).ok())
            .map(|t| metrics(&t, &self.schedule.placement));
        let steps = self.losses.len();
        RunSummary {
            model: config.model.name().into(),
            d_model: gpt.then_some(config.d_model),
            heads: gpt.then_some(config.heads),
            seq_len: gpt.then_some(config.seq_len),
            data: gpt.then(|| match &config.data {
                Some(path) => path.display().to_string(),
                None => format!("the {} task", config.task.name()),
            }),
            schedule: config.schedule.name().into(),
            ranks: config.ranks,
            micro_batches: config.micro_batches,
            micro_batch_size: config.micro_batch_size,
            hidden: config.hidden,
            layers_per_stage: config.layers_per_stage,
            partition: config.partition.clone(),
            model_stages: config.model_stages(),
            optimizer: config.optimizer.name().into(),
            lr: config.lr,
            dtype: config.dtype.name().into(),
            seed: config.seed,
            steps,
            first_step: self.first_step.unwrap_or(1),
            final_loss: self.losses.last().copied().unwrap_or(f64::NAN),
            losses: self.losses,
            samples_per_second: samples_per_step * steps as f64 / total_seconds.max(1e-9),
            tokens_per_second: gpt
                .then(|| config.samples_per_step() * steps as f64 / total_seconds.max(1e-9)),
            eval_loss: last_eval.map(|e| e.loss),
            accuracy: last_eval.and_then(|e| e.accuracy),
            best_loss: last_eval.and_then(|e| e.best_loss),
            evaluations: self.evaluations,
            samples,
            total_seconds,
            step_seconds_median: median(self.walls),
            pipeline_seconds_median: median(self.makespans),
            bubble_ratio: median(self.bubbles),
            core_wait_ratio: median(self.core_waits),
            timeline_idle_ratio: median(self.idles),
            rank_threads: self.threads,
            cores: self.cores,
            comm_wait_seconds: median(self.comm_waits),
            op_seconds: times,
            simulated_pipeline_seconds: simulated.as_ref().map(|m| m.makespan),
            simulated_bubble_ratio: simulated.as_ref().map(|m| m.bubble_ratio),
            last_step: self.last_step,
            data_parallel: config.data_parallel,
            gradient_compression: config.gradient_compression.name().into(),
            grad_bytes_sent: 0,
            grad_bytes_uncompressed: 0,
            communication_overhead: 0.0,
            expert_load_imbalance: self.expert_loads,
            eplb_rebalances: None,
            experts_moved: None,
            experts_moved_from_scratch: None,
            expert_waits: config
                .moe
                .filter(|m| m.expert_parallel && !m.link().is_none())
                .map(|_| crate::moe::ExpertWaits::measured()),
        }
    }
}

/// The median of the finite values (NaN when there are none).
pub fn median(values: Vec<f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn ms(seconds: Option<f64>) -> String {
    seconds.map_or("-".into(), |s| format!("{:.3}", s * 1e3))
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

    /// The human summary: a few loss lines (unless `quiet`), then the figures.
    pub fn table(&self, quiet: bool) -> String {
        let s = self;
        let blocks = match &s.partition {
            Some(p) => {
                let split: Vec<String> = p.iter().map(usize::to_string).collect();
                format!(
                    "{} blocks, split {}",
                    p.iter().sum::<usize>(),
                    split.join(",")
                )
            }
            None => format!(
                "{} blocks, {} per stage",
                s.layers_per_stage * s.model_stages,
                s.layers_per_stage
            ),
        };
        let mut out = match (s.d_model, s.heads, s.seq_len, &s.data) {
            (Some(d), Some(heads), Some(seq), Some(data)) => format!(
                "dualpipe train: gpt (d_model {d}, {heads} heads, {blocks}, seq {seq}) on \
                 {data}; {} on {} ranks ({} model stages), {} micro-batches x {} sequences, {} \
                 lr {}, {}, seed {}\n",
                s.schedule,
                s.ranks,
                s.model_stages,
                s.micro_batches,
                s.micro_batch_size,
                s.optimizer,
                s.lr,
                s.dtype,
                s.seed
            ),
            _ => format!(
                "dualpipe train: {} on {} ranks ({} model stages), {} micro-batches x {} rows, \
                 hidden {}, {} blocks/stage, {} lr {}, {}, seed {}\n",
                s.schedule,
                s.ranks,
                s.model_stages,
                s.micro_batches,
                s.micro_batch_size,
                s.hidden,
                s.layers_per_stage,
                s.optimizer,
                s.lr,
                s.dtype,
                s.seed
            ),
        };
        if !quiet && !s.losses.is_empty() {
            out.push_str("\n  step  loss\n");
            let n = s.losses.len();
            let every = n.div_ceil(10).max(1);
            for (i, loss) in s.losses.iter().enumerate() {
                if i % every == 0 || i + 1 == n {
                    out.push_str(&format!("  {:>4}  {loss:.6}\n", s.first_step + i));
                }
            }
        }
        if !quiet && !s.evaluations.is_empty() {
            let score = match (s.best_loss, s.accuracy) {
                (Some(_), _) => "gap to best",
                (None, Some(_)) => "accuracy",
                (None, None) => "",
            };
            out.push_str(&format!("\n  step  validation loss  bits/byte  {score}\n"));
            for e in &s.evaluations {
                let score = match (e.best_loss, e.accuracy) {
                    (Some(best), _) => format!("{:.4}", e.loss - best),
                    (None, Some(a)) => format!("{:.1}%", 100.0 * a),
                    (None, None) => String::new(),
                };
                out.push_str(
                    format!(
                        "  {:>4}  {:<15.6}  {:<9.4}  {score}",
                        e.step, e.loss, e.bits_per_byte
                    )
                    .trim_end(),
                );
                out.push('\n');
            }
        }
        let pct = |x: f64| format!("{:.1}%", 100.0 * x);
        let op = &s.op_seconds;
        let throughput = match s.tokens_per_second {
            Some(tokens) => format!(
                "{tokens:.0} tokens/s ({:.1} sequences/s)",
                s.samples_per_second
            ),
            None => format!("{:.0} samples/s", s.samples_per_second),
        };
        let mut rows = vec![
            ("final loss", format!("{:.6}", s.final_loss)),
            ("throughput", throughput),
            (
                "step time (median)",
                format!("{:.2} ms", 1e3 * s.step_seconds_median),
            ),
            (
                "pipeline time (median)",
                format!(
                    "{:.2} ms measured, {} simulated from measured op times",
                    1e3 * s.pipeline_seconds_median,
                    s.simulated_pipeline_seconds
                        .map_or("-".into(), |x| format!("{:.2} ms", 1e3 * x))
                ),
            ),
            (
                "bubble ratio",
                format!(
                    "{} measured (message waits), {} simulated",
                    pct(s.bubble_ratio),
                    s.simulated_bubble_ratio.map_or("-".into(), pct)
                ),
            ),
            (
                "core contention",
                format!(
                    "{} of rank time waiting for a core ({} rank threads on {} cores)",
                    pct(s.core_wait_ratio),
                    s.rank_threads,
                    s.cores
                ),
            ),
            (
                "comm wait",
                format!("{:.2} ms per rank per step", 1e3 * s.comm_wait_seconds),
            ),
            (
                "op times (ms)",
                format!(
                    "F {} · B {} · I {} · W {} · FB {}",
                    ms(op.f),
                    ms(op.b),
                    ms(op.i),
                    ms(op.w),
                    ms(op.fb)
                ),
            ),
            (
                "total",
                format!("{} steps in {:.2} s", s.steps, s.total_seconds),
            ),
        ];
        if s.data_parallel > 1 {
            let saved = if s.grad_bytes_uncompressed > 0 {
                format!(
                    " ({:.1}% of uncompressed {})",
                    100.0 * s.grad_bytes_sent as f64 / s.grad_bytes_uncompressed as f64,
                    s.grad_bytes_uncompressed
                )
            } else {
                String::new()
            };
            rows.push((
                "data parallel",
                format!(
                    "{} replicas, gradients {}: {} bytes sent{saved}",
                    s.data_parallel, s.gradient_compression, s.grad_bytes_sent
                ),
            ));
            rows.push((
                "communication overhead",
                format!(
                    "{} of the run in gradient exchange",
                    pct(s.communication_overhead)
                ),
            ));
        }
        if let (Some(first), Some(last)) = (
            s.expert_load_imbalance.first(),
            s.expert_load_imbalance.last(),
        ) {
            rows.push((
                "expert load",
                format!(
                    "max/mean tokens per expert {:.3} in the first step, {:.3} in the last \
                     (worst block)",
                    first.max_over_mean, last.max_over_mean
                ),
            ));
            if let (Some(a), Some(b)) = (first.worker_max_over_mean, last.worker_max_over_mean) {
                rows.push((
                    "expert parallelism",
                    format!(
                        "max/mean rows per worker {a:.3} in the first step, {b:.3} in the last"
                    ),
                ));
            }
        }
        if let Some(n) = s.eplb_rebalances {
            rows.push((
                "eplb",
                format!(
                    "{n} re-placements, {} expert replicas moved ({} had each plan been made \
                     from scratch)",
                    s.experts_moved.unwrap_or(0),
                    s.experts_moved_from_scratch.unwrap_or(0)
                ),
            ));
        }
        if let Some(e) = s.evaluations.last() {
            let accuracy = match (e.best_loss, e.accuracy) {
                (Some(best), _) => format!(", best possible {best:.6} (gap {:.4})", e.loss - best),
                (None, Some(a)) => format!(", accuracy {:.1}%", 100.0 * a),
                (None, None) => String::new(),
            };
            rows.insert(
                1,
                (
                    "validation",
                    format!(
                        "loss {:.6} ({:.4} bits/byte){accuracy}",
                        e.loss, e.bits_per_byte
                    ),
                ),
            );
        }
        out.push('\n');
        for (name, value) in rows {
            out.push_str(&format!("  {name:<24}{value}\n"));
        }
        if s.rank_threads > s.cores {
            out.push_str(&format!(
                "\n  note: {} busy rank threads share {} cores, so ranks also wait for a core;\n  \
                 the bubble counts only waits for a message ({} of rank time was idle\n  \
                 between compute ops on the timeline)\n",
                s.rank_threads,
                s.cores,
                pct(s.timeline_idle_ratio)
            ));
        }
        if !s.samples.is_empty() {
            out.push_str("\n  samples by the final model\n");
            for sample in &s.samples {
                let how = match sample.temperature {
                    0.0 => "greedy".to_string(),
                    t => format!("T={t}"),
                };
                out.push_str(&format!(
                    "    {how:<7}{:?} -> {:?}\n",
                    sample.prompt, sample.completion
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bubble_counts_message_waits_and_core_waits_are_reported_apart() {
        use dualpipe_runtime::{RankTime, RankTimes};
        use dualpipe_schedule::{Chunk, Op, ScheduleKind};
        use dualpipe_sim::ComputeInterval;

        let config = TrainConfig {
            schedule: ScheduleKind::OneFOneB,
            ranks: 2,
            micro_batches: 2,
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
            schedule: ScheduleKind::OneFOneB,
            ranks: 2,
            micro_batches: 2,
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
                evaluation: None,
                expert_load: Some(
                    crate::moe::ExpertLoad::new(step, vec![(0, counts.to_vec())])
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
