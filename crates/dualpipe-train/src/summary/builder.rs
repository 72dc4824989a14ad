//! [`SummaryBuilder`]: a [`RunSummary`] built one step at a time, and [`median`].

use std::time::Duration;

use dualpipe_nn::LrDecay;
use dualpipe_schedule::Schedule;
use dualpipe_sim::{metrics, simulate, CostModel, Metrics, OpTally, Timeline};

use super::report::StepReport;
use super::RunSummary;
use crate::config::{ModelKind, TrainConfig};
use crate::model::{Evaluation, Sample};

/// Builds a [`RunSummary`] one step at a time, keeping a few numbers per step and the last
/// timeline only.
#[derive(Debug)]
pub struct SummaryBuilder {
    config: TrainConfig,
    /// f16 loss scaling: the last step's scale and the steps skipped on overflow.
    loss_scale: Option<(f64, usize)>,
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
    expert_loads: Vec<crate::summary::experts::ExpertLoad>,
    first_step: Option<usize>,
    feedback_norms: Vec<f64>,
    by_format: Vec<super::FormatBytes>,
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
            loss_scale: None,
            feedback_norms: Vec::new(),
            by_format: Vec::new(),
        }
    }

    /// Adds one step.
    pub fn add(&mut self, report: StepReport) {
        self.first_step.get_or_insert(report.step + 1);
        if let Some(scale) = report.loss_scale {
            let skipped = self.loss_scale.map_or(0, |(_, n)| n) + usize::from(report.skipped);
            self.loss_scale = Some((scale, skipped));
        }
        self.losses.push(report.loss);
        self.walls.push(report.wall.as_secs_f64());
        self.evaluations.extend(report.evaluation);
        self.expert_loads.extend(report.expert_load);
        if let Some(exchange) = &report.exchange {
            self.feedback_norms.push(exchange.feedback_norm);
            let format = self
                .config
                .exchange_config()
                .compression_at(report.step as u64);
            let at = match self
                .by_format
                .iter()
                .position(|f| f.compression == format.name())
            {
                Some(at) => at,
                None => {
                    self.by_format.push(super::FormatBytes {
                        compression: format.name().into(),
                        ..Default::default()
                    });
                    self.by_format.len() - 1
                }
            };
            let f = &mut self.by_format[at];
            f.steps += 1;
            f.bytes_sent += exchange.bytes_sent;
            f.bytes_uncompressed += exchange.bytes_uncompressed;
        }
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
        let samples_per_step = (config.schedule.micro_batches as f64)
            * (config.schedule.micro_batch_size as f64)
            * config.parallelism.data_parallel.max(1) as f64;
        let gpt = config.model.kind == ModelKind::Gpt;
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
            model: config.model.kind.name().into(),
            d_model: gpt.then_some(config.model.d_model),
            heads: gpt.then_some(config.model.heads),
            seq_len: gpt.then_some(config.model.seq_len),
            data: gpt.then(|| match &config.data.path {
                Some(path) => path.display().to_string(),
                None => format!("the {} task", config.data.task.name()),
            }),
            schedule: config.schedule.kind.name().into(),
            ranks: config.schedule.ranks,
            micro_batches: config.schedule.micro_batches,
            micro_batch_size: config.schedule.micro_batch_size,
            hidden: config.model.hidden,
            layers_per_stage: config.model.layers_per_stage,
            partition: config.model.partition.clone(),
            recompute: config.recomputes().then(|| {
                crate::config::recompute::format_recompute(
                    config.model.recompute.as_deref().unwrap_or_default(),
                )
            }),
            half_projections: config.model.half_projections,
            model_stages: config.model_stages(),
            optimizer: config.optimizer.kind.name().into(),
            lr: config.optimizer.lr,
            lr_schedule: lr_schedule_words(config),
            dtype: config.model.dtype.name().into(),
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
            data_parallel: config.parallelism.data_parallel,
            gradient_compression: config.parallelism.gradient_compression.name().into(),
            grad_exchange: None,
            grad_exchange_started: None,
            grad_bytes_sent: 0,
            grad_bytes_uncompressed: 0,
            compression_warmup: (config.parallelism.data_parallel > 1
                && config.parallelism.gradient_compression != dualpipe_dp::Compression::None)
                .then(|| config.compression_warmup_steps()),
            one_bit_adam_from: config.one_bit_adam_from(),
            loss_scale: self.loss_scale.map(|(scale, _)| scale),
            skipped_steps: self.loss_scale.map(|(_, skipped)| skipped),
            variance_refresh: config
                .one_bit_adam_from()
                .map(|_| config.variance_refresh_every()),
            variance_refresh_doubling: config
                .one_bit_adam_from()
                .map(|_| config.variance_refresh_doubling()),
            feedback_norms: if config.parallelism.gradient_compression
                == dualpipe_dp::Compression::None
            {
                Vec::new()
            } else {
                self.feedback_norms
            },
            grad_bytes_by_format: if config.parallelism.gradient_compression
                == dualpipe_dp::Compression::None
            {
                Vec::new()
            } else {
                self.by_format
            },
            communication_overhead: 0.0,
            expert_load_imbalance: self.expert_loads,
            eplb_rebalances: None,
            experts_moved: None,
            experts_moved_from_scratch: None,
            expert_bytes_moved: None,
            expert_waits: config
                .model
                .moe
                .filter(|m| m.expert_parallel && !m.link().is_none())
                .map(|_| crate::summary::experts::ExpertWaits::measured()),
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

/// The schedule in words, `None` for a constant rate: "warm-up 30", "cosine to 0.0003" or
/// both, comma-separated.
fn lr_schedule_words(config: &TrainConfig) -> Option<String> {
    let schedule = config.lr_schedule();
    let mut parts = Vec::new();
    if schedule.warmup > 0 {
        parts.push(format!("warm-up {}", schedule.warmup));
    }
    if schedule.decay == LrDecay::Cosine {
        // Twelve significant digits: a tenth of 0.003 reads 0.0003, not 0.00030000000000000003.
        let min: f64 = format!("{:.11e}", schedule.min)
            .parse()
            .unwrap_or(schedule.min);
        parts.push(format!("cosine to {min}"));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}
