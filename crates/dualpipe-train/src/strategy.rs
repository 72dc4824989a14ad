//! [`DualPipeStrategy`]: a user's model under a pipeline schedule, with data parallelism,
//! gradient compression, checkpoints and a watch, one call per step, in the spirit of the
//! design documents' `DualPipeStrategy(model, optimizer, loss_fn, compression,
//! pipeline_stages)`.
//!
//! ```text
//! design documents                      here
//! DualPipeStrategy(model, ...)          DualPipeStrategy::builder()
//!   model                                 .layers(count, make_layer) + .partition(..)
//!                                         or .stages(make_stage) (a PipelineStage per stage)
//!   optimizer                             .optimizer(OptimizerKind, lr)
//!   loss_fn                               .loss(impl Loss)   (the last stage applies it)
//!   compression                           .compression(Compression)
//!   pipeline_stages                       .pipeline_stages(ranks) + .schedule(ScheduleKind)
//!   (data parallelism)                    .data_parallel(replicas)
//!   (checkpoints, metrics)                .checkpoints(CheckpointOptions), .watch(impl Watch)
//!                                       .build()?
//! for batch in data:                    for step in 0..steps:
//!   out = forward(batch)                  strategy.step(micro_batches)?  (one call: every
//!   loss = compute_loss(out, target)        micro-batch's forward, loss and backward in the
//!   backward(loss)                          schedule's order, the gradient exchange, then the
//!   update_weights()                        optimizer)
//! ```
//!
//! In a pipeline there is no separate forward, loss, backward and update of the whole batch:
//! the batch is cut into micro-batches, and one step runs every micro-batch's forward (the
//! last stage computes its loss) and backward interleaved in the schedule's order across the
//! ranks, then sums the gradients (DualPipe's two copies of a stage, the data-parallel
//! replicas) and updates the weights once. [`DualPipeStrategy::step`] is that whole step.
//!
//! The strategy is built over the trainer ([`Trainer`] for one pipeline, [`LocalReplicas`]
//! for its replicas): the step, the exchange, compression and checkpoints are theirs.

use crate::config::ScheduleSection;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use candle_core::Tensor;
use dualpipe_nn::custom::{Layer, LayerStage, Loss, MeanSquaredError};
use dualpipe_nn::{ModelStage, NnError, OptimizerKind, PipelineStage, StagePosition, StepBatch};
use dualpipe_runtime::RankStages;
use dualpipe_schedule::ScheduleKind;

use crate::checkpoint::{CheckpointOptions, CheckpointWriter};
use crate::error::{Divergence, TrainError};
use crate::job::plan_file::PlanChoice;
use crate::job::watch::Watch;
use crate::model::custom::CustomWorkload;
use crate::{
    Checkpoint, Compression, DType, LocalReplicas, LocalRun, Restored, StepEvent, StepReport,
    TrainConfig, Trainer, Workload,
};

/// How a list of layers is cut into the pipeline's model stages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Partition {
    /// As evenly as possible (the first stages take one more layer when it does not divide).
    #[default]
    Even,
    /// Layers per model stage, in stage order (each at least 1, summing to the layer count).
    Layers(Vec<usize>),
    /// The best plan of a `dualpipe plan --format json` file: its partition, schedule, ranks,
    /// micro-batches and stages per rank.
    PlanFile(PathBuf),
}

type LayerFactory = dyn Fn(usize) -> Result<Box<dyn Layer>, NnError> + Send + Sync;
type StageMaker = dyn Fn(StagePosition, usize) -> Result<ModelStage, NnError> + Send + Sync;

enum Model {
    Layers {
        count: usize,
        make: Arc<LayerFactory>,
    },
    Stages(Arc<StageMaker>),
}

/// Builds a [`DualPipeStrategy`]; see the [module](self) documentation.
pub struct StrategyBuilder {
    model: Option<Model>,
    partition: Partition,
    loss: Arc<dyn Loss>,
    config: TrainConfig,
    checkpoints: Option<CheckpointOptions>,
    watch: Option<Box<dyn Watch>>,
}

impl StrategyBuilder {
    /// The model as `count` layers, layer `l` built by `make(l)` (called for every copy a
    /// run holds, so it must give the same initial weights each time: draw them from a seed
    /// and `l`), cut into stages by [`StrategyBuilder::partition`].
    pub fn layers(
        mut self,
        count: usize,
        make: impl Fn(usize) -> Result<Box<dyn Layer>, NnError> + Send + Sync + 'static,
    ) -> Self {
        self.model = Some(Model::Layers {
            count,
            make: Arc::new(make),
        });
        self
    }

    /// The model as hand-written stages: `make(position, stages)` builds the copy of model
    /// stage `position.model_stage` of `stages` (same initial weights on every call). Its
    /// batch is the [`StepBatch::Custom`] of the micro-batches given to
    /// [`DualPipeStrategy::step`].
    pub fn stages<S: PipelineStage>(
        mut self,
        make: impl Fn(StagePosition, usize) -> Result<S, NnError> + Send + Sync + 'static,
    ) -> Self {
        self.model = Some(Model::Stages(Arc::new(move |position, stages| {
            make(position, stages).map(ModelStage::new)
        })));
        self
    }

    /// How [`StrategyBuilder::layers`] are cut into stages (default: evenly).
    pub fn partition(mut self, partition: Partition) -> Self {
        self.partition = partition;
        self
    }

    /// The loss the last stage of a model of layers applies (default: mean-squared error).
    pub fn loss(mut self, loss: impl Loss + 'static) -> Self {
        self.loss = Arc::new(loss);
        self
    }

    /// The optimizer and its learning rate.
    pub fn optimizer(mut self, kind: OptimizerKind, lr: f64) -> Self {
        self.config.optimizer.kind = kind;
        self.config.optimizer.lr = lr;
        self
    }

    /// The data-parallel gradient compression (with more than one replica).
    pub fn compression(mut self, compression: Compression) -> Self {
        self.config.parallelism.gradient_compression = compression;
        self
    }

    /// Ranks of the pipeline (its devices). DualPipe and 1F1B cut the model into as many
    /// stages; DualPipeV into twice as many; interleaved into `ranks × virtual_stages`.
    pub fn pipeline_stages(mut self, ranks: usize) -> Self {
        self.config.schedule.ranks = ranks;
        self
    }

    /// The pipeline schedule (default: DualPipe).
    pub fn schedule(mut self, kind: ScheduleKind) -> Self {
        self.config.schedule.kind = kind;
        self
    }

    /// Micro-batches per step of each replica.
    pub fn micro_batches(mut self, micro_batches: usize) -> Self {
        self.config.schedule.micro_batches = micro_batches;
        self
    }

    /// Data-parallel replicas of the pipeline (default 1).
    pub fn data_parallel(mut self, replicas: usize) -> Self {
        self.config.parallelism.data_parallel = replicas;
        self
    }

    /// The element type of weights and activations (F32 or F64).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.config.model.dtype = dtype;
        self
    }

    /// The steps the run will take: the length of the learning-rate schedule and of 1-bit
    /// Adam's warm-up.
    pub fn steps(mut self, steps: usize) -> Self {
        self.config.steps = steps;
        self
    }

    /// Anything else of the configuration (clipping, warm-up, bucket size, timeouts...);
    /// the model fields of the built-in models are not used.
    pub fn configure(mut self, change: impl FnOnce(&mut TrainConfig)) -> Self {
        change(&mut self.config);
        self
    }

    /// Writes checkpoints as `dualpipe train` does (named by parameter, any grid reads them).
    pub fn checkpoints(mut self, options: CheckpointOptions) -> Self {
        self.checkpoints = Some(options);
        self
    }

    /// Follows the run (progress, metrics, log): told of every step's start and end.
    pub fn watch(mut self, watch: impl Watch + 'static) -> Self {
        self.watch = Some(Box::new(watch));
        self
    }

    /// Checks everything and builds every replica's stages.
    pub fn build(self) -> Result<DualPipeStrategy, TrainError> {
        let mut config = self.config;
        let model = self.model.ok_or_else(|| {
            TrainError::Config("the strategy has no model: give it layers or stages".into())
        })?;
        let mut partition = self.partition;
        if let Partition::PlanFile(path) = &partition {
            let text = dualpipe_io::read_text(path, dualpipe_io::limits::DOCUMENT, "the plan file")
                .map_err(|e| TrainError::Config(e.to_string()))?;
            let plan = PlanChoice::from_json(&text, &path.display().to_string())?;
            config.schedule.kind = plan.schedule;
            config.schedule.ranks = plan.ranks;
            config.schedule.micro_batches = plan.micro_batches;
            config.schedule.virtual_stages = plan.virtual_stages;
            partition = Partition::Layers(plan.partition);
        }
        config.check(crate::Naming::Fields, 1)?;
        let stages = config.model_stages();
        let make: Arc<StageMaker> = match model {
            Model::Stages(make) => make,
            Model::Layers { count, make } => {
                let sizes = layer_counts(&partition, count, stages)?;
                let loss = self.loss;
                Arc::new(move |position: StagePosition, stages: usize| {
                    let first: usize = sizes[..position.model_stage].iter().sum();
                    let layers = (first..first + sizes[position.model_stage])
                        .map(|l| make(l))
                        .collect::<Result<Vec<_>, _>>()?;
                    let stage = LayerStage::new(position, stages, first, layers, loss.clone())?;
                    Ok(ModelStage::new(stage))
                })
            }
        };
        let workload = CustomWorkload::new(move |position| make(position, stages));
        let mut run = if config.parallelism.data_parallel > 1 {
            LocalRun::Replicas(LocalReplicas::with_workload(
                config.clone(),
                None,
                &workload,
            )?)
        } else {
            let trainer = Trainer::with_workload(
                config.clone(),
                None,
                crate::LocalThreads,
                None,
                Workload::Custom(Box::new(workload.clone())),
            )?;
            LocalRun::One(Box::new(trainer))
        };
        let writer = match &self.checkpoints {
            Some(options) => {
                let writer = CheckpointWriter::start(options, run.checkpoint_parts())?;
                run.set_checkpoints(&writer);
                Some(writer)
            }
            None => None,
        };
        Ok(DualPipeStrategy {
            config,
            run,
            workload,
            writer,
            watch: self.watch,
            began: Instant::now(),
        })
    }
}

/// Layers per model stage.
fn layer_counts(
    partition: &Partition,
    count: usize,
    stages: usize,
) -> Result<Vec<usize>, TrainError> {
    match partition {
        Partition::Even | Partition::PlanFile(_) => {
            if count < stages {
                return Err(TrainError::Config(format!(
                    "{count} layers cannot fill {stages} pipeline stages; give at least one \
                     layer per stage"
                )));
            }
            Ok((0..stages)
                .map(|s| count / stages + usize::from(s < count % stages))
                .collect())
        }
        Partition::Layers(sizes) => {
            if sizes.len() != stages || sizes.contains(&0) || sizes.iter().sum::<usize>() != count {
                return Err(TrainError::Config(format!(
                    "partition {sizes:?}: give {stages} stages of at least one layer each, \
                     {count} layers in all"
                )));
            }
            Ok(sizes.clone())
        }
    }
}

/// A user's model trained with a pipeline schedule, data parallelism, compression and
/// checkpoints; one [`DualPipeStrategy::step`] per step. Built by
/// [`DualPipeStrategy::builder`].
pub struct DualPipeStrategy {
    config: TrainConfig,
    run: LocalRun,
    workload: CustomWorkload,
    writer: Option<CheckpointWriter>,
    watch: Option<Box<dyn Watch>>,
    began: Instant,
}

impl DualPipeStrategy {
    /// A builder with DualPipe on 4 ranks, 8 micro-batches, one replica, AdamW at lr 1e-3,
    /// f32, no compression, no checkpoints.
    pub fn builder() -> StrategyBuilder {
        StrategyBuilder {
            model: None,
            partition: Partition::Even,
            loss: Arc::new(MeanSquaredError),
            config: TrainConfig {
                schedule: ScheduleSection {
                    micro_batches: 8,
                    ..TrainConfig::MLP.schedule
                },
                steps: 100,
                ..TrainConfig::MLP
            },
            checkpoints: None,
            watch: None,
        }
    }

    /// The configuration the strategy runs.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Micro-batches one step takes: `data_parallel × micro_batches`.
    pub fn micro_batches_per_step(&self) -> usize {
        self.config.parallelism.data_parallel.max(1) * self.config.schedule.micro_batches
    }

    /// One training step on `micro_batches` (of the type the model's first and last stages
    /// read: [`dualpipe_nn::data::MicroBatch`] for a model of layers): replica `d` takes the
    /// `d`-th run of `micro_batches` of them. Every micro-batch's forward, loss and backward
    /// run in the schedule's order, the gradients are summed over DualPipe's copies and
    /// averaged over the replicas (compressed if asked), then the optimizer steps; a
    /// checkpoint is written when one is due. The report's losses are every micro-batch's.
    pub fn step<T: Send + Sync + 'static>(
        &mut self,
        micro_batches: Vec<T>,
    ) -> Result<StepReport, TrainError> {
        let expected = self.micro_batches_per_step();
        if micro_batches.len() != expected {
            return Err(TrainError::Config(format!(
                "the step was given {} micro-batches; it takes data_parallel x micro_batches \
                 = {expected}",
                micro_batches.len()
            )));
        }
        let step = self.run.lead().steps_done();
        let mut rest = micro_batches.into_iter();
        let per_replica = (0..self.config.parallelism.data_parallel.max(1))
            .map(|_| {
                StepBatch::custom(
                    rest.by_ref()
                        .take(self.config.schedule.micro_batches)
                        .collect::<Vec<T>>(),
                )
            })
            .collect();
        self.workload.set_batches(step, per_replica);
        if let Some(watch) = &mut self.watch {
            watch
                .on_event(StepEvent::Starting { step })
                .map_err(TrainError::Stopped)?;
        }
        let report = match &mut self.run {
            LocalRun::One(t) => t.step()?,
            LocalRun::Replicas(r) => r.step()?,
        };
        if !report.loss.is_finite() {
            return Err(TrainError::Diverged(Divergence {
                step,
                loss: report.loss,
                lr: self.config.optimizer.lr,
            }));
        }
        match &mut self.run {
            LocalRun::One(t) => t.save_checkpoint_if_due()?,
            LocalRun::Replicas(r) => {
                for d in 0..r.replicas().len() {
                    r.replica_mut(d).save_checkpoint_if_due()?;
                }
            }
        }
        if let Some(watch) = &mut self.watch {
            watch
                .on_event(StepEvent::Finished {
                    report: &report,
                    elapsed: self.began.elapsed(),
                })
                .map_err(TrainError::Stopped)?;
        }
        Ok(report)
    }

    /// Continues from `checkpoint` (saved by any grid shape of the same model): weights,
    /// optimizer state, error feedback and the step count.
    pub fn restore(&mut self, checkpoint: &Checkpoint) -> Result<Restored, TrainError> {
        self.run.restore(checkpoint)
    }

    /// The stage copies of the reporting pipeline (replica 0).
    fn lead_stages(&mut self) -> &[RankStages<ModelStage>] {
        self.run.lead().stages()
    }

    /// One copy of every model stage, in stage order (the lowest direction's).
    fn canonical(&mut self) -> Vec<&ModelStage> {
        let stages = self.config.model_stages();
        let held: Vec<&ModelStage> = self
            .lead_stages()
            .iter()
            .flat_map(RankStages::iter)
            .map(|(_, s)| s)
            .collect();
        (0..stages)
            .filter_map(|s| {
                held.iter()
                    .copied()
                    .filter(|c| c.model_stage() == s)
                    .min_by_key(|c| c.dir())
            })
            .collect()
    }

    /// Every parameter of the model by name, with its value and the last step's gradient
    /// (summed over copies and averaged over replicas), in stage order.
    pub fn parameters(&mut self) -> Vec<(String, Tensor, Tensor)> {
        self.canonical()
            .into_iter()
            .flat_map(|s| {
                s.param_names()
                    .into_iter()
                    .zip(s.params())
                    .map(|(n, p)| (n, p.value.clone(), p.grad.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The model's output for `inputs` with the current weights (a model of layers: each
    /// stage's [`LayerStage::infer`] in order; nothing is kept).
    pub fn predict(&mut self, inputs: &Tensor) -> Result<Tensor, TrainError> {
        let mut x = inputs.clone();
        for stage in self.canonical() {
            let layers = stage.downcast_ref::<LayerStage>().ok_or_else(|| {
                TrainError::Config(
                    "predict runs a model of layers; a model of hand-written stages has its own"
                        .into(),
                )
            })?;
            x = layers.infer(&x)?;
        }
        Ok(x)
    }

    /// Ends the run: waits for the checkpoint writer (returning the directories it wrote)
    /// and tells the watch.
    pub fn finish(mut self) -> Result<Vec<PathBuf>, TrainError> {
        self.run.clear_checkpoints();
        let saved = match self.writer.take() {
            Some(writer) => writer
                .finish()?
                .into_iter()
                .map(|record| record.path)
                .collect(),
            None => Vec::new(),
        };
        if let Some(watch) = &mut self.watch {
            watch.finish();
        }
        Ok(saved)
    }
}

impl std::fmt::Debug for DualPipeStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DualPipeStrategy")
            .field("config", &self.config)
            .field("checkpoints", &self.writer.is_some())
            .field("watch", &self.watch.is_some())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for StrategyBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StrategyBuilder")
            .field("partition", &self.partition)
            .field("loss", &self.loss)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
