//! The training loop behind `dualpipe train`: a [`TrainConfig`], a [`Trainer`] that runs one
//! step at a time through a pipeline schedule, and the [`StepReport`] of each step.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use dualpipe_runtime::{run_step, sum_stage_copies, try_build_ranks, ExecOptions, RankStages};
use dualpipe_schedule::{Schedule, ScheduleKind};
use dualpipe_sim::Timeline;

use crate::data::{Batch, DataSet};
use crate::error::NnError;
use crate::optim::{Optimizer, OptimizerKind};
use crate::stage::{MlpStage, ModelConfig, StagePosition};

/// Element type of parameters and activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DType {
    /// 32-bit floats (fast; the default for training).
    #[default]
    F32,
    /// 64-bit floats (for exact comparisons in tests).
    F64,
}

impl DType {
    /// Names accepted by [`DType::from_name`].
    pub const NAMES: [&'static str; 2] = ["f32", "f64"];

    /// `"f32"` or `"f64"`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Parses `"f32"` or `"f64"` (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "f32" => Some(DType::F32),
            "f64" => Some(DType::F64),
            _ => None,
        }
    }

    /// The candle element type.
    pub fn candle(self) -> candle_core::DType {
        match self {
            DType::F32 => candle_core::DType::F32,
            DType::F64 => candle_core::DType::F64,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything a training run depends on. The model and the data depend only on `seed`,
/// [`TrainConfig::model_stages`], `hidden`, `layers_per_stage`, `micro_batches`,
/// `micro_batch_size` and `dtype` — never on the schedule or the rank count — so e.g. DualPipe
/// on 4 ranks, 1F1B on 4 ranks and DualPipeV on 2 ranks (4 stages each) train the same model
/// on the same batches.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    /// The pipeline schedule.
    pub schedule: ScheduleKind,
    /// Pipeline ranks (one thread each).
    pub ranks: usize,
    /// Micro-batches per step, over all directions.
    pub micro_batches: usize,
    /// Rows per micro-batch.
    pub micro_batch_size: usize,
    /// Stages per rank for `interleaved` (ignored by the other schedules).
    pub virtual_stages: usize,
    /// Width of the model (each block is `hidden → 4 hidden → hidden`).
    pub hidden: usize,
    /// Residual MLP blocks per model stage.
    pub layers_per_stage: usize,
    /// Training steps of a run (used by callers that loop; [`Trainer::step`] runs one).
    pub steps: usize,
    /// Learning rate.
    pub lr: f64,
    /// The optimizer and its hyper-parameters.
    pub optimizer: OptimizerKind,
    /// Element type of parameters and activations.
    pub dtype: DType,
    /// Seed of the model, the teacher and the data.
    pub seed: u64,
}

impl Default for TrainConfig {
    /// DualPipe on 4 ranks: 4 stages of 2 blocks of width 128, 16 micro-batches of 64 rows,
    /// AdamW at lr 1e-3, f32, 600 steps (about 45 s on 2 cores in release).
    fn default() -> Self {
        TrainConfig {
            schedule: ScheduleKind::DualPipe,
            ranks: 4,
            micro_batches: 16,
            micro_batch_size: 64,
            virtual_stages: 1,
            hidden: 128,
            layers_per_stage: 2,
            steps: 600,
            lr: 1e-3,
            optimizer: OptimizerKind::adamw(),
            dtype: DType::F32,
            seed: 0,
        }
    }
}

impl TrainConfig {
    /// Model stages along one pipeline: `2 × ranks` for DualPipeV, `ranks × virtual_stages`
    /// for interleaved, `ranks` otherwise.
    pub fn model_stages(&self) -> usize {
        match self.schedule {
            ScheduleKind::DualPipeV => 2 * self.ranks,
            ScheduleKind::Interleaved => self.ranks * self.virtual_stages,
            _ => self.ranks,
        }
    }

    /// The model's shape and seed.
    pub fn model(&self) -> ModelConfig {
        ModelConfig {
            seed: self.seed,
            hidden: self.hidden,
            layers_per_stage: self.layers_per_stage,
            stages: self.model_stages(),
            dtype: self.dtype.candle(),
        }
    }

    /// Checks the sizes that do not depend on the schedule (the schedule checks its own).
    pub fn validate(&self) -> Result<(), NnError> {
        let positive = [
            ("ranks", self.ranks),
            ("micro_batches", self.micro_batches),
            ("micro_batch_size", self.micro_batch_size),
            ("virtual_stages", self.virtual_stages),
            ("hidden", self.hidden),
            ("layers_per_stage", self.layers_per_stage),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(NnError::Config(format!(
                    "{name} is 0; it must be at least 1"
                )));
            }
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(NnError::Config(format!(
                "lr is {}; it must be a positive finite number such as 0.001",
                self.lr
            )));
        }
        let memory = self.memory_bytes();
        if memory.parameters > MEMORY_LIMIT_BYTES {
            return Err(NnError::Config(format!(
                "hidden {} with layers_per_stage {} needs more than {} GiB of parameters; use a \
                 smaller hidden or fewer layers per stage",
                self.hidden,
                self.layers_per_stage,
                MEMORY_LIMIT_BYTES >> 30
            )));
        }
        if memory.activations > MEMORY_LIMIT_BYTES {
            return Err(NnError::Config(format!(
                "micro_batch_size {} with micro_batches {} and hidden {} needs more than {} GiB \
                 of activations per step; use a smaller micro_batch_size",
                self.micro_batch_size,
                self.micro_batches,
                self.hidden,
                MEMORY_LIMIT_BYTES >> 30
            )));
        }
        Ok(())
    }

    /// An upper estimate of the memory a run needs, computed without overflow: every block's
    /// h x 4h and 4h x h weights and biases for up to two copies of each stage, each with a
    /// gradient and two optimizer moments; and one step's activations (each block keeps its
    /// input, its 4h-wide hidden activations and their GELU input).
    pub fn memory_bytes(&self) -> MemoryEstimate {
        let bytes_per_value: u128 = match self.dtype {
            DType::F32 => 4,
            DType::F64 => 8,
        };
        let h = self.hidden as u128;
        let blocks = (self.model_stages() as u128).saturating_mul(self.layers_per_stage as u128);
        let parameters = blocks
            .saturating_mul(h.saturating_mul(h).saturating_mul(8).saturating_add(5 * h))
            .saturating_mul(2 * 4 * bytes_per_value);
        let activations = (self.micro_batch_size as u128)
            .saturating_mul(self.micro_batches as u128)
            .saturating_mul(h.saturating_mul(9))
            .saturating_mul(blocks)
            .saturating_mul(bytes_per_value);
        MemoryEstimate {
            parameters,
            activations,
        }
    }
}

/// The most memory a configuration may ask for (parameters with optimizer state, or one
/// step's activations) before [`TrainConfig::validate`] refuses it instead of failing to
/// allocate: 1 TiB.
pub const MEMORY_LIMIT_BYTES: u128 = 1 << 40;

/// Bytes a configuration needs, from [`TrainConfig::memory_bytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Parameters, gradients and optimizer moments of every stage copy.
    pub parameters: u128,
    /// One step's saved activations.
    pub activations: u128,
}

/// What one training step did.
#[derive(Clone, Debug)]
pub struct StepReport {
    /// The step's index (0 for the first).
    pub step: usize,
    /// Mean-squared error of every micro-batch, indexed by global micro-batch.
    pub losses: Vec<f64>,
    /// The step's loss: the mean of `losses`.
    pub loss: f64,
    /// The measured timeline of the pipeline, when the executor records one.
    pub timeline: Option<Timeline>,
    /// Wall-clock time of the whole step (data, pipeline, gradient sum, optimizer).
    pub wall: Duration,
}

/// Trains the MLP model with a pipeline schedule, one step at a time, on the runtime's
/// executor (one thread per rank, in-process transport).
#[derive(Debug)]
pub struct Trainer {
    config: TrainConfig,
    schedule: Schedule,
    data: DataSet,
    /// `stages[rank]`: the stage copies that rank runs, keyed by (dir, stage).
    stages: Vec<RankStages<MlpStage>>,
    /// `optimizers[rank][i]` updates the `i`-th stage of `stages[rank]` in (dir, stage) order.
    optimizers: Vec<Vec<Optimizer>>,
    exec_options: ExecOptions,
    steps_done: usize,
    /// Set when a step failed part-way: the stages may hold partial state.
    failed: bool,
    /// The next step's batch, drawn on a background thread during the previous step's
    /// pipeline (the data loader's prefetch), with the step it belongs to.
    prefetched: Option<(usize, Batch)>,
}

/// What every trainer builds first from a configuration: the lowered, validated schedule (whose
/// stages per pipeline must match the model's), the model's description and the data set.
pub(crate) fn setup(config: &TrainConfig) -> Result<(Schedule, ModelConfig, DataSet), NnError> {
    let schedule = dualpipe_schedule::build(
        config.schedule,
        config.ranks,
        config.micro_batches,
        config.virtual_stages,
    )?;
    let stages_expected = config.model_stages();
    if schedule.placement.stages() != stages_expected {
        return Err(NnError::Config(format!(
            "the {} schedule has {} stages per pipeline, expected {stages_expected}",
            config.schedule,
            schedule.placement.stages()
        )));
    }
    let model = config.model();
    let data = DataSet::new(
        config.seed,
        config.hidden,
        config.micro_batch_size,
        model.dtype,
    )?;
    Ok((schedule, model, data))
}

impl Trainer {
    /// Builds the schedule (`dualpipe_schedule::build`), every rank's stage copies from the
    /// placement, the data set and the optimizers.
    pub fn new(config: TrainConfig) -> Result<Self, NnError> {
        config.validate()?;
        let (schedule, model, data) = setup(&config)?;
        let per_dir = schedule.micro_batches_per_dir();
        let stages = try_build_ranks(&schedule.placement, |_rank, dir, stage| {
            MlpStage::new(
                &model,
                StagePosition {
                    dir,
                    model_stage: stage,
                    micro_batches: config.micro_batches,
                    micro_batches_per_dir: per_dir,
                },
            )
        })?;
        let optimizers = stages
            .iter()
            .map(|rank| {
                (0..rank.len())
                    .map(|_| Optimizer::new(config.optimizer, config.lr))
                    .collect()
            })
            .collect();
        Ok(Trainer {
            config,
            schedule,
            data,
            stages,
            optimizers,
            exec_options: ExecOptions::default(),
            steps_done: 0,
            failed: false,
            prefetched: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The lowered, validated schedule every step runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Steps run so far.
    pub fn steps_done(&self) -> usize {
        self.steps_done
    }

    /// Replaces the executor's options (receive timeout, polling interval).
    pub fn set_exec_options(&mut self, options: ExecOptions) {
        self.exec_options = options;
    }

    /// Runs one step: loads the step's micro-batches, runs the schedule on the runtime's
    /// executor, sums the gradients of each stage's copies
    /// ([`dualpipe_runtime::sum_stage_copies`]) and applies the optimizer to every copy.
    ///
    /// After an error the stages may hold partial state of the failed step; every later call
    /// fails too (build a new trainer).
    pub fn step(&mut self) -> Result<StepReport, NnError> {
        if self.failed {
            return Err(NnError::Execution(
                "an earlier step failed part-way; build a new Trainer to continue".into(),
            ));
        }
        self.failed = true;
        let start = Instant::now();
        let step = self.steps_done;
        let micro_batches = self.config.micro_batches;
        let batch = match self.prefetched.take() {
            Some((s, batch)) if s == step => batch,
            _ => self.data.batch(step, micro_batches)?,
        };
        for (_, stage) in self.stages.iter_mut().flat_map(RankStages::iter_mut) {
            stage.set_batch(batch.clone());
            stage.zero_grad()?;
        }
        // While the pipeline runs, one background thread draws the next step's batch (when the
        // run has a next step): it computes in the pipeline's bubbles. The data depends only
        // on (seed, step, micro-batch), so prefetching changes no result.
        let prefetch = step + 1 < self.config.steps;
        let (data, schedule, stages, options) = (
            &self.data,
            &self.schedule,
            &mut self.stages,
            &self.exec_options,
        );
        let (outcome, next) = std::thread::scope(|scope| {
            let next = prefetch.then(|| {
                scope.spawn(move || {
                    (0..micro_batches)
                        .map(|mb| data.micro_batch(step + 1, mb))
                        .collect::<Result<Vec<_>, NnError>>()
                })
            });
            let outcome = run_step(schedule, stages, options);
            let next = next.map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(NnError::Stage("drawing a micro-batch panicked".into()))
                })
            });
            (outcome, next)
        });
        let outcome = outcome?;
        if let Some(next) = next {
            self.prefetched = Some((step + 1, Arc::new(next?)));
        }
        for (_, stage) in self.stages.iter().flat_map(RankStages::iter) {
            if stage.pending() != 0 {
                return Err(NnError::Execution(format!(
                    "stage {} of direction {} still holds {} saved tensors after the step: the schedule missed a backward",
                    stage.model_stage(),
                    stage.dir(),
                    stage.pending()
                )));
            }
        }
        if outcome.losses.len() != self.config.micro_batches {
            return Err(NnError::Execution(format!(
                "the step reported {} losses for {} micro-batches",
                outcome.losses.len(),
                self.config.micro_batches
            )));
        }
        sum_stage_copies(&self.schedule.placement, &mut self.stages)?;
        // Every rank updates its own copies, on its own thread, as ranks of a real run would.
        let results: Vec<Result<(), NnError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .stages
                .iter_mut()
                .zip(&mut self.optimizers)
                .map(|(rank_stages, rank_opts)| {
                    scope.spawn(move || {
                        for ((_, stage), opt) in rank_stages.iter_mut().zip(rank_opts) {
                            opt.step(&mut stage.params_mut())?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(NnError::Execution("the optimizer step panicked".into()))
                    })
                })
                .collect()
        });
        results.into_iter().collect::<Result<(), NnError>>()?;
        self.steps_done += 1;
        self.failed = false;
        let losses: Vec<f64> = outcome.losses.iter().map(|l| l.loss).collect();
        let loss = losses.iter().sum::<f64>() / losses.len() as f64;
        Ok(StepReport {
            step,
            losses,
            loss,
            timeline: Some(outcome.timeline),
            wall: start.elapsed(),
        })
    }

    fn copies(&self, model_stage: usize) -> impl Iterator<Item = &MlpStage> {
        self.stages
            .iter()
            .flat_map(RankStages::iter)
            .map(|(_, s)| s)
            .filter(move |s| s.model_stage() == model_stage)
    }

    fn canonical_copy(&self, model_stage: usize) -> Option<&MlpStage> {
        self.copies(model_stage).min_by_key(|s| s.dir())
    }

    /// Parameter values of every model stage (`[stage][param]`, in [`MlpStage::params`]
    /// order), read from the copy of the lowest direction.
    pub fn parameters(&self) -> Vec<Vec<Tensor>> {
        (0..self.config.model_stages())
            .filter_map(|s| self.canonical_copy(s))
            .map(MlpStage::parameter_values)
            .collect()
    }

    /// Gradients of the last step for every model stage (summed over copies; `[stage][param]`).
    pub fn gradients(&self) -> Vec<Vec<Tensor>> {
        (0..self.config.model_stages())
            .filter_map(|s| self.canonical_copy(s))
            .map(|s| s.params().into_iter().map(|p| p.grad.clone()).collect())
            .collect()
    }

    /// Whether every copy of every model stage holds bit-identical parameters.
    pub fn copies_identical(&self) -> Result<bool, NnError> {
        for s in 0..self.config.model_stages() {
            let Some(canon) = self.canonical_copy(s) else {
                continue;
            };
            let reference = canon
                .parameter_values()
                .iter()
                .map(crate::stage::to_f64_vec)
                .collect::<Result<Vec<_>, _>>()?;
            for copy in self.copies(s) {
                let values = copy
                    .parameter_values()
                    .iter()
                    .map(crate::stage::to_f64_vec)
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
