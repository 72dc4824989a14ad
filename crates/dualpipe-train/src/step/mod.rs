//! [`Trainer`]: the one training step, written once over a [`Driver`], and the run loop.

use std::time::{Duration, Instant};

use candle_core::Tensor;
use dualpipe_nn::gpt::GptWeights;
use dualpipe_nn::{ModelStage, Optimizer, StagePosition, StepBatch};
use dualpipe_runtime::{ExecOptions, RankStages, StepHook};
use dualpipe_schedule::{Schedule, ScheduleError};

use crate::config::{Naming, TrainConfig};
use crate::error::TrainError;
use crate::model::Workload;
use crate::step::driver::{Driver, LocalThreads};

pub mod collective;
pub mod driver;
pub mod loss_scale;
mod model;
pub mod parallelism;
pub mod rank;
pub mod reference;
mod run;
pub mod stop;

pub use crate::summary::{StepEvent, StepReport};
use parallelism::Hooks;
pub use parallelism::{Parallelism, StageRead, StepState, StepView};

/// Trains a model (the GPT or the MLP, [`Workload`]) with a pipeline schedule, one step at a
/// time; the driver decides where
/// the ranks run: [`LocalThreads`] (the default: every rank on a thread of this process) or
/// [`OneRank`](crate::OneRank) (this process is one rank; see [`RankTrainer`](crate::RankTrainer)).
#[derive(Debug)]
pub struct Trainer<D: Driver = LocalThreads> {
    pub(crate) config: TrainConfig,
    pub(crate) schedule: Schedule,
    pub(crate) workload: Workload,
    /// The ranks this process holds, and `stages[i]`: the copies `held[i]` runs, keyed by
    /// (dir, stage).
    pub(crate) held: Vec<usize>,
    pub(crate) stages: Vec<RankStages<ModelStage>>,
    /// `optimizers[i][j]` updates the `j`-th stage of `stages[i]` in (dir, stage) order.
    pub(crate) optimizers: Vec<Vec<Optimizer>>,
    pub(crate) driver: D,
    pub(crate) exec_options: ExecOptions,
    pub(crate) steps_done: usize,
    /// Set when a step failed part-way: the stages may hold partial state.
    pub(crate) failed: bool,
    /// The next step's batch, drawn on a background thread during the previous step's
    /// pipeline (the data loader's prefetch), with the step it belongs to.
    pub(crate) prefetched: Option<(usize, StepBatch)>,
    /// The GPT's weights gathered after this many steps, for validation and saving.
    pub(crate) gathered: Option<(usize, GptWeights)>,
    /// This trainer's data-parallel replica (0 for a single replica): its share of the data.
    pub(crate) replica: usize,
    /// Whether this trainer is one replica of a data-parallel run (its exchange ends given).
    pub(crate) replicated: bool,
    /// What the step does beyond the pipeline and the optimizer, in the order it acts: data
    /// parallelism, the MoE experts (their group and re-placement), stage re-partitioning
    /// (see [`Parallelism`]).
    pub(crate) parallelisms: Vec<Box<dyn Parallelism<D>>>,
    /// Where due checkpoints go (`None`: no checkpoints).
    pub(crate) checkpoints: Option<crate::checkpoint::CheckpointSink>,
    /// A request to stop at a step boundary (Ctrl-C), when one may come.
    pub(crate) stop: Option<crate::step::stop::StopRequest>,
    /// The dynamic loss scale of f16 mixed precision (`None` in every other dtype).
    pub(crate) loss_scale: Option<crate::step::loss_scale::LossScale>,
}

/// Checks that a prebuilt schedule fits the configuration and passes the validator.
fn check_given_schedule(config: &TrainConfig, schedule: &Schedule) -> Result<(), TrainError> {
    let mismatch = |what: &str, given: String, expected: String| {
        TrainError::Config(format!(
            "the given schedule has {what} {given}, the configuration {expected}; make them agree"
        ))
    };
    if schedule.kind != config.schedule.kind {
        return Err(mismatch(
            "kind",
            schedule.kind.to_string(),
            config.schedule.kind.to_string(),
        ));
    }
    if schedule.ranks != config.schedule.ranks {
        return Err(mismatch(
            "ranks",
            schedule.ranks.to_string(),
            config.schedule.ranks.to_string(),
        ));
    }
    if schedule.micro_batches != config.schedule.micro_batches {
        return Err(mismatch(
            "micro-batches",
            schedule.micro_batches.to_string(),
            config.schedule.micro_batches.to_string(),
        ));
    }
    dualpipe_schedule::validate(schedule).map_err(ScheduleError::from)?;
    Ok(())
}

/// The parts of a trainer [`Trainer::assemble`] builds.
struct Parts {
    schedule: Schedule,
    workload: Workload,
    held: Vec<usize>,
    stages: Vec<RankStages<ModelStage>>,
}

impl<D: Driver> Trainer<D> {
    /// Builds the schedule (`schedule`, or the one `config` generates), the model (`workload`,
    /// or the one `config` describes), the stage copies of the ranks `driver` holds and their
    /// optimizers, with no parallelism yet (the one path of
    /// [`TrainerBuilder::build`](crate::TrainerBuilder::build), which adds them). On failure
    /// the driver tells the other ranks, if any.
    pub(crate) fn assemble(
        config: TrainConfig,
        schedule: Option<Schedule>,
        mut driver: D,
        workload: Option<Workload>,
    ) -> Result<Self, TrainError> {
        let Parts {
            schedule,
            workload,
            held,
            stages,
        } = match Self::parts(&config, schedule, &driver, workload) {
            Ok(parts) => parts,
            Err(err) => {
                driver.fail(&err.to_string());
                return Err(err);
            }
        };
        let optimizers = stages
            .iter()
            .map(|rank| (0..rank.len()).map(|_| config.new_optimizer()).collect())
            .collect();
        let mut exec_options = ExecOptions::default()
            .with_recv_timeout(Duration::from_secs_f64(config.transport.recv_timeout));
        if let Some(slow) = config.parallelism.slow_rank {
            exec_options = exec_options.with_slow_rank(slow.rank, slow.factor);
        }
        let loss_scale = (config.model.dtype == crate::config::DType::F16)
            .then(crate::step::loss_scale::LossScale::default);
        Ok(Trainer {
            config,
            schedule,
            workload,
            held,
            stages,
            optimizers,
            driver,
            exec_options,
            steps_done: 0,
            failed: false,
            prefetched: None,
            gathered: None,
            replica: 0,
            replicated: false,
            parallelisms: Vec::new(),
            checkpoints: None,
            stop: None,
            loss_scale,
        })
    }

    fn parts(
        config: &TrainConfig,
        given: Option<Schedule>,
        driver: &D,
        workload: Option<Workload>,
    ) -> Result<Parts, TrainError> {
        driver.check(config, Naming::Fields)?;
        config.check(Naming::Fields, 1)?;
        let schedule = match given {
            Some(schedule) => {
                check_given_schedule(config, &schedule)?;
                schedule
            }
            None => config.build_schedule()?,
        };
        let stages_expected = config.model_stages();
        if schedule.placement.stages() != stages_expected {
            return Err(TrainError::Config(format!(
                "the {} schedule has {} stages per pipeline, expected {stages_expected}",
                config.schedule.kind,
                schedule.placement.stages()
            )));
        }
        let workload = match workload {
            Some(workload) => workload,
            None => Workload::new(config)?,
        };
        let per_dir = schedule.micro_batches_per_dir();
        let held = driver.held_ranks(&schedule);
        if config.parallelism.rebalance.is_some() && held.len() != config.schedule.ranks {
            return Err(TrainError::Config(
                "`rebalance` moves blocks between the ranks of one process; under `transport` \
                 mpi train with a static `partition` (or `plan`) instead"
                    .into(),
            ));
        }
        let mut stages = Vec::with_capacity(held.len());
        for &rank in &held {
            let mut copies = RankStages::new();
            for (dir, stage) in schedule.placement.stages_of(rank) {
                let position = StagePosition {
                    dir,
                    model_stage: stage,
                    micro_batches: config.schedule.micro_batches,
                    micro_batches_per_dir: per_dir,
                };
                copies.insert(
                    dir,
                    stage,
                    workload.stage(config, stages_expected, position)?,
                );
            }
            stages.push(copies);
        }
        Ok(Parts {
            schedule,
            workload,
            held,
            stages,
        })
    }

    /// Adds `parallelism` after those the trainer holds (it acts after them at every point).
    pub(crate) fn push_parallelism(&mut self, parallelism: Box<dyn Parallelism<D>>) {
        self.parallelisms.push(parallelism);
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The lowered, validated schedule every step runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// The ranks this process holds, in the order of [`Trainer::stages`].
    pub fn held_ranks(&self) -> &[usize] {
        &self.held
    }

    /// What the run trains: the model and its data.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// The stage copies of every held rank.
    pub fn stages(&self) -> &[RankStages<ModelStage>] {
        &self.stages
    }

    /// Steps run so far.
    pub fn steps_done(&self) -> usize {
        self.steps_done
    }

    /// Replaces the executor's options (receive timeout, polling interval; the configuration's
    /// `recv_timeout` sets the first).
    pub fn set_exec_options(&mut self, options: ExecOptions) {
        self.exec_options = options;
    }

    /// Runs one step: loads the step's micro-batches (drawing the next step's during the
    /// pipeline), runs the schedule through the driver (with every parallelism's pipeline
    /// hook), checks that every stage drained, sums the gradients of each stage's copies
    /// (unless a parallelism does), lets every parallelism act after the backward (e.g. the
    /// data-parallel exchange), clips, applies the optimizer to every copy, and lets every
    /// parallelism act after the optimizer (e.g. the experts' balance). The step names no
    /// feature: each is a [`Parallelism`] held in order.
    ///
    /// After an error the stages may hold partial state of the failed step; every later call
    /// fails too (build a new trainer). A failure of this process is told to the other ranks.
    pub fn step(&mut self) -> Result<StepReport, TrainError> {
        if self.failed {
            return Err(TrainError::Execution(
                "an earlier step failed part-way; build a new trainer to continue".into(),
            ));
        }
        self.failed = true;
        let start = Instant::now();
        let step = self.steps_done;
        let read = self.stage_read();
        for p in &self.parallelisms {
            p.check_ready(&read)?;
        }
        let hooks = Hooks(
            self.parallelisms
                .iter()
                .filter_map(|p| p.pipeline_hook(step))
                .collect(),
        );
        let loss_scale = self.loss_scale.map(|ls| ls.scale);
        if let Some(scale) = loss_scale {
            let set = self.scale_losses(scale);
            self.own(step, set)?;
        }
        let outcome = self.pipeline(step, &hooks)?;
        let drained = self.check_drained(outcome.losses.len());
        self.own(step, drained)?;
        let copies_summed = !self.parallelisms.iter().any(|p| p.sums_copies());
        if copies_summed {
            self.driver.sum_stage_copies(
                &self.schedule,
                &mut self.stages,
                step,
                &self.exec_options,
            )?;
        }
        let mut state = StepState {
            step,
            losses: outcome.losses.iter().map(|l| l.loss).collect(),
            copies_summed,
            exchange: None,
            expert_load: None,
        };
        self.each_parallelism(|p, t| p.after_backward(t, &mut state))?;
        let applied = self.unscale_gradients(step)?;
        let grad_norm = if applied {
            let norm = self.clip_gradients(step)?;
            let updated = self.optimizer_step();
            self.own(step, updated)?;
            norm
        } else {
            None
        };
        self.each_parallelism(|p, t| p.after_optimizer(t, &mut state))?;
        self.steps_done += 1;
        self.failed = false;
        let StepState {
            losses,
            exchange,
            expert_load,
            ..
        } = state;
        let loss = losses.iter().sum::<f64>() / losses.len() as f64;
        Ok(StepReport {
            step,
            losses,
            loss,
            timeline: Some(outcome.timeline),
            wall: start.elapsed(),
            grad_norm,
            loss_scale,
            skipped: !applied,
            evaluation: None,
            rank_times: outcome.rank_times,
            expert_load,
            exchange,
        })
    }

    /// A failure of this process's own work: the other ranks are told.
    pub(crate) fn own<T>(
        &mut self,
        step: usize,
        result: Result<T, TrainError>,
    ) -> Result<T, TrainError> {
        result.inspect_err(|err| {
            let held = self.held.first().copied().unwrap_or(0);
            self.driver
                .fail(&format!("rank {held}: step {}: {err}", step + 1));
        })
    }

    /// Sets the step's batch on every held stage, then runs the pipeline while one background
    /// thread draws the next step's batch (when the run has a next step): it computes in the
    /// pipeline's bubbles. The data depends only on (seed, step, micro-batch), so prefetching
    /// changes no result.
    fn pipeline(
        &mut self,
        step: usize,
        hook: &dyn StepHook<ModelStage>,
    ) -> Result<dualpipe_runtime::StepOutcome, TrainError> {
        let prepared = self.prepare(step);
        self.own(step, prepared)?;
        let prefetch = step + 1 < self.config.steps && self.workload.prefetches();
        let replica = self.replica_index();
        let (config, workload, schedule, stages, options, driver) = (
            &self.config,
            &self.workload,
            &self.schedule,
            &mut self.stages,
            &self.exec_options,
            &mut self.driver,
        );
        let (outcome, next) = std::thread::scope(|scope| {
            let next = prefetch
                .then(|| scope.spawn(move || workload.replica_batch(config, step + 1, replica)));
            let outcome = driver.run_pipeline(schedule, stages, step, options, hook);
            let next = next.map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(TrainError::Execution(
                        "drawing a micro-batch panicked".into(),
                    ))
                })
            });
            (outcome, next)
        });
        let outcome = outcome?;
        if let Some(next) = next {
            let next = self.own(step, next)?;
            self.prefetched = Some((step + 1, next));
        }
        Ok(outcome)
    }

    fn prepare(&mut self, step: usize) -> Result<(), TrainError> {
        let batch = match self.prefetched.take() {
            Some((s, batch)) if s == step => batch,
            _ => self
                .workload
                .replica_batch(&self.config, step, self.replica_index())?,
        };
        for (_, stage) in self.stages.iter_mut().flat_map(RankStages::iter_mut) {
            stage.set_batch(batch.clone())?;
            stage.zero_grad()?;
        }
        Ok(())
    }

    fn check_drained(&self, losses: usize) -> Result<(), TrainError> {
        for (_, stage) in self.stages.iter().flat_map(RankStages::iter) {
            if stage.pending() != 0 {
                return Err(TrainError::Execution(format!(
                    "stage {} of direction {} still holds {} saved tensors after the step: the \
                     schedule missed a backward",
                    stage.model_stage(),
                    stage.dir(),
                    stage.pending()
                )));
            }
        }
        if losses != self.config.schedule.micro_batches {
            return Err(TrainError::Execution(format!(
                "the step reported {losses} losses for {} micro-batches",
                self.config.schedule.micro_batches
            )));
        }
        Ok(())
    }

    /// Every held rank updates its own copies, on its own thread when this process holds
    /// several, as ranks of a real run would (the sharded experts plain AdamW under 1-bit
    /// Adam, see [`Optimizer::step_masked`]).
    fn optimizer_step(&mut self) -> Result<(), TrainError> {
        let update = |rank_stages: &mut RankStages<ModelStage>, rank_opts: &mut Vec<Optimizer>| {
            for ((_, stage), opt) in rank_stages.iter_mut().zip(rank_opts) {
                let plain = stage.sharded_params();
                opt.step_masked(&mut stage.params_mut(), &plain)?;
            }
            Ok::<(), TrainError>(())
        };
        if self.stages.len() == 1 {
            return update(&mut self.stages[0], &mut self.optimizers[0]);
        }
        let results: Vec<Result<(), TrainError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .stages
                .iter_mut()
                .zip(&mut self.optimizers)
                .map(|(rank_stages, rank_opts)| scope.spawn(move || update(rank_stages, rank_opts)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(TrainError::Execution("the optimizer step panicked".into()))
                    })
                })
                .collect()
        });
        results.into_iter().collect()
    }

    fn copies(&self, model_stage: usize) -> impl Iterator<Item = &ModelStage> {
        self.stages
            .iter()
            .flat_map(RankStages::iter)
            .map(|(_, s)| s)
            .filter(move |s| s.model_stage() == model_stage)
    }

    fn canonical_copy(&self, model_stage: usize) -> Option<&ModelStage> {
        self.copies(model_stage).min_by_key(|s| s.dir())
    }

    /// Parameter values of every model stage this process holds (`[stage][param]`, in
    /// [`ModelStage::params`] order), read from the copy of the lowest direction.
    pub fn parameters(&self) -> Vec<Vec<Tensor>> {
        (0..self.config.model_stages())
            .filter_map(|s| self.canonical_copy(s))
            .map(ModelStage::parameter_values)
            .collect()
    }

    /// Gradients of the last step for every model stage this process holds (summed over
    /// copies; `[stage][param]`).
    pub fn gradients(&self) -> Vec<Vec<Tensor>> {
        (0..self.config.model_stages())
            .filter_map(|s| self.canonical_copy(s))
            .map(|s| s.params().into_iter().map(|p| p.grad.clone()).collect())
            .collect()
    }

    /// Whether every copy this process holds of every model stage has bit-identical
    /// parameters.
    pub fn copies_identical(&self) -> Result<bool, TrainError> {
        for s in 0..self.config.model_stages() {
            let Some(canon) = self.canonical_copy(s) else {
                continue;
            };
            let reference = canon
                .parameter_values()
                .iter()
                .map(dualpipe_nn::stage::to_f64_vec)
                .collect::<Result<Vec<_>, _>>()?;
            for copy in self.copies(s) {
                let values = copy
                    .parameter_values()
                    .iter()
                    .map(dualpipe_nn::stage::to_f64_vec)
                    .collect::<Result<Vec<_>, _>>()?;
                let same = values.iter().zip(&reference).all(|(a, b)| {
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
                });
                if !same {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }
}
