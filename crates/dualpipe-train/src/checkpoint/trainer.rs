//! The trainer's checkpoint hooks: its part of a checkpoint (copied to host memory) and the
//! restore of a checkpoint into whatever stages this trainer holds, by name.

use dualpipe_nn::{OptimizerKind, ParamState};

use dualpipe_runtime::RankStages;
use dualpipe_schedule::Schedule;

use crate::step::{StageRead, Trainer};

use crate::checkpoint::format::{file_of, optim_name, FEEDBACK_PREFIX, STATE};
use crate::checkpoint::{
    Checkpoint, CheckpointError, CheckpointPart, CheckpointSink, CheckpointState, HostTensor,
    ScheduleShape,
};
use crate::config::{ModelKind, TrainConfig};
use crate::error::TrainError;
use crate::parallel::experts::shards;
use crate::step::driver::Driver;

/// What [`Trainer::restore`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    /// Steps done in the checkpoint: the run continues with step `step + 1`.
    pub step: usize,
    /// Whether the checkpoint's error-feedback buffers were restored (`false`: there were
    /// none, or the grid changed and they start from zeros).
    pub feedback_restored: bool,
    /// Whether the checkpoint held error feedback that a change of grid dropped.
    pub feedback_dropped: bool,
    /// The data-parallel degree of the checkpoint when its error feedback was carried over
    /// to another one (worker residuals averaged, server residuals re-split:
    /// [`dualpipe_dp::ErrorFeedbackState::regroup`]); `None` otherwise.
    pub feedback_regrouped_from: Option<usize>,
}

pub(crate) fn mismatch(ckpt: &Checkpoint, problem: String) -> TrainError {
    CheckpointError::Mismatch {
        path: ckpt.path.clone(),
        problem,
    }
    .into()
}

/// The model the checkpoint holds must be `config`'s: same model, shape and optimizer.
fn check_model(ckpt: &Checkpoint, config: &TrainConfig) -> Result<(), TrainError> {
    let saved = &ckpt.state.config;
    let blocks = |c: &TrainConfig| c.blocks();
    let mut pairs: Vec<(&str, String, String)> = vec![
        (
            "model",
            saved.model.kind.to_string(),
            config.model.kind.to_string(),
        ),
        (
            "blocks",
            blocks(saved).to_string(),
            blocks(config).to_string(),
        ),
        (
            "optimizer",
            saved.optimizer.kind.to_string(),
            config.optimizer.kind.to_string(),
        ),
    ];
    match config.model.kind {
        ModelKind::Gpt => {
            pairs.push((
                "d_model",
                saved.model.d_model.to_string(),
                config.model.d_model.to_string(),
            ));
            pairs.push((
                "heads",
                saved.model.heads.to_string(),
                config.model.heads.to_string(),
            ));
            pairs.push((
                "seq_len",
                saved.model.seq_len.to_string(),
                config.model.seq_len.to_string(),
            ));
        }
        ModelKind::Mlp => {
            pairs.push((
                "hidden",
                saved.model.hidden.to_string(),
                config.model.hidden.to_string(),
            ));
        }
    }
    for (what, theirs, ours) in pairs {
        if theirs != ours {
            return Err(mismatch(
                ckpt,
                format!(
                    "it holds {what} {theirs}, this run asks for {ours}; give the flags of the \
                     run that wrote it"
                ),
            ));
        }
    }
    Ok(())
}

impl<D: Driver> Trainer<D> {
    /// Saves a checkpoint through `sink` whenever [`CheckpointSink::due`] says so after a
    /// step of [`Trainer::run`].
    pub fn set_checkpoints(&mut self, sink: CheckpointSink) {
        self.checkpoints = Some(sink);
    }

    /// Stops saving checkpoints (drops the handle, so the writer can finish).
    pub fn clear_checkpoints(&mut self) {
        self.checkpoints = None;
    }

    /// The shape of the schedule this trainer runs, as a checkpoint records it.
    pub fn schedule_shape(&self) -> ScheduleShape {
        ScheduleShape {
            kind: self.config.schedule.kind.name().into(),
            ranks: self.config.schedule.ranks,
            micro_batches: self.config.schedule.micro_batches,
            virtual_stages: self.config.schedule.virtual_stages,
            model_stages: self.config.model_stages(),
        }
    }

    /// This trainer's part of a checkpoint of now, copied into host memory: with replica 0,
    /// the parameters and optimizer state of one copy of every model stage it holds and the
    /// state (with expert parallelism, the group's placement and its moving average of the
    /// counts too); with every other replica of an expert-parallel group, the routed experts
    /// it is the lowest holder of (so every expert is written once); with every replica,
    /// its error-feedback buffers.
    pub fn checkpoint_part(&self) -> Result<CheckpointPart, TrainError> {
        let replica = self.replica;
        let mut tensors = Vec::new();
        let sharded = self.sharded_experts();
        if replica == 0 || sharded {
            for (rank, opts) in self.stages.iter().zip(&self.optimizers) {
                for (((dir, _), stage), opt) in rank.iter().zip(opts) {
                    if !writes_copy(&self.config, &self.schedule, dir, stage.model_stage()) {
                        continue;
                    }
                    // The other replicas of an expert-parallel group write the experts
                    // they are the lowest holder of.
                    let owned = (replica != 0).then(|| shards::owned_names(stage, replica));
                    for (k, (name, p)) in stage.param_names().iter().zip(stage.params()).enumerate()
                    {
                        if owned.as_ref().is_some_and(|o| !o.contains(name)) {
                            continue;
                        }
                        tensors.push(HostTensor::from_tensor(name.clone(), &p.value)?);
                        if let Some(state) = opt.state().get(k) {
                            for (part, t) in state.tensors() {
                                tensors.push(HostTensor::from_tensor(optim_name(name, part), t)?);
                            }
                        }
                    }
                    if replica == 0 {
                        for (name, bias) in stage.buffers() {
                            tensors.push(HostTensor::from_f64s(name, &bias));
                        }
                    }
                }
            }
        }
        let read = self.stage_read();
        for p in &self.parallelisms {
            p.checkpoint_tensors(&read, &mut tensors)?;
        }
        let state = (replica == 0).then(|| CheckpointState {
            optimizer_steps: self.optimizer_steps(),
            loss_scale: self.loss_scale,
            ..CheckpointState::new(&self.config, self.schedule_shape(), self.steps_done)
        });
        Ok(CheckpointPart {
            step: self.steps_done,
            tensors,
            state,
        })
    }

    /// Whether a restore of this trainer needs checkpoint file `file`: the files of the
    /// layers it holds (named by [`file_of`]), the error feedback and the state. A process of
    /// a multi-process run reads only these ([`Checkpoint::read_files`]).
    pub fn needs_checkpoint_file(&self, file: &str) -> bool {
        if file == STATE || file.starts_with(FEEDBACK_PREFIX) {
            return true;
        }
        self.stages
            .iter()
            .flat_map(RankStages::iter)
            .any(|(_, stage)| stage.param_names().iter().any(|name| file_of(name) == file))
    }

    /// Continues from `ckpt`: every held copy's parameters and optimizer state by name (any
    /// schedule, rank count or layers-per-stage that gives the same model), the error
    /// feedback when the grid is the checkpoint's (model stages, replicas, buckets,
    /// compression; otherwise it starts from zeros), and the step count. A checkpoint of
    /// another model, or one at or past the configured steps, is refused. With expert
    /// parallelism the group's placement, its moving average and this worker's experts come
    /// from a checkpoint of the same group shape (otherwise the initial placement stays).
    pub fn restore(&mut self, ckpt: &Checkpoint) -> Result<Restored, TrainError> {
        check_model(ckpt, &self.config)?;
        let step = ckpt.state.step;
        if step >= self.config.steps {
            return Err(mismatch(
                ckpt,
                format!(
                    "it is of step {step} and this run has {} steps in all; raise `steps` \
                     (the total, counting the steps before the checkpoint)",
                    self.config.steps
                ),
            ));
        }
        let dtype = self.config.model.dtype.candle();
        let kind = self.config.optimizer.kind;
        self.each_parallelism(|p, view| p.restore_placement(view, ckpt))?;
        for (rank, opts) in self.stages.iter_mut().zip(&mut self.optimizers) {
            for ((_, stage), opt) in rank.iter_mut().zip(opts.iter_mut()) {
                let names = stage.param_names();
                let mut states = Vec::with_capacity(names.len());
                for (name, p) in names.iter().zip(stage.params_mut()) {
                    let saved = ckpt.tensor(name)?;
                    if saved.shape != p.value.dims() {
                        return Err(mismatch(
                            ckpt,
                            format!(
                                "`{name}` has shape {:?}, this run's {:?}",
                                saved.shape,
                                p.value.dims()
                            ),
                        ));
                    }
                    p.value = saved.to_tensor(dtype)?;
                    if step > 0 {
                        states.push(param_state(ckpt, name, kind, dtype)?);
                    }
                }
                opt.set_state(ckpt.state.optimizer_steps, states)?;
                for (name, _) in stage.buffers() {
                    let saved = ckpt.tensor(&name)?.to_f64s();
                    stage.set_buffer(&name, &saved)?;
                }
            }
        }
        // Error feedback no exchange of this run takes is dropped (the data-parallel
        // exchange restores or carries it over).
        let mut restored = Restored {
            step,
            feedback_restored: false,
            feedback_dropped: ckpt.tensors.keys().any(|k| k.starts_with("feedback.")),
            feedback_regrouped_from: None,
        };
        self.each_parallelism(|p, view| p.restore_state(view, ckpt, &mut restored))?;
        self.steps_done = step;
        if self.loss_scale.is_some() {
            self.loss_scale = Some(ckpt.state.loss_scale.unwrap_or_default());
        }
        self.prefetched = None;
        self.gathered = None;
        self.failed = false;
        Ok(restored)
    }

    /// Whether this replica's stages hold only a share of the weights (routed experts sharded
    /// over an expert-parallel group).
    pub(crate) fn sharded_experts(&self) -> bool {
        self.parallelisms
            .iter()
            .any(|p| p.shards_weights(&self.config))
    }

    /// Hands the writer this trainer's part of a checkpoint when one is due after the steps
    /// done (a caller that runs [`Trainer::step`] itself; [`Trainer::run`] does it).
    pub fn save_checkpoint_if_due(&mut self) -> Result<(), TrainError> {
        match self.steps_done.checked_sub(1) {
            Some(step) => self.save_due_checkpoint(step),
            None => Ok(()),
        }
    }

    pub(crate) fn save_due_checkpoint(&mut self, step: usize) -> Result<(), TrainError> {
        match &self.checkpoints {
            Some(sink) if sink.due(self.steps_done) => self.send_checkpoint(step),
            _ => Ok(()),
        }
    }

    /// Hands the writer the checkpoint of the steps done now, unless the interval's own
    /// checkpoint already covers them (a run stopped at a step boundary).
    pub(crate) fn save_final_checkpoint(&mut self, step: usize) -> Result<(), TrainError> {
        match &self.checkpoints {
            Some(sink) if !sink.due(self.steps_done) => self.send_checkpoint(step),
            _ => Ok(()),
        }
    }

    /// Copies this trainer's part of the checkpoint of the steps done and hands it to the
    /// writer; state that holds a value that is not a finite number is refused (naming the
    /// first such tensor), so it is never published.
    fn send_checkpoint(&mut self, step: usize) -> Result<(), TrainError> {
        let Some(sink) = self.checkpoints.clone() else {
            return Ok(());
        };
        let done = self.steps_done;
        let sent = self.checkpoint_part().and_then(|part| {
            if let Some(tensor) = crate::checkpoint::format::first_non_finite(&part.tensors) {
                return Err(CheckpointError::NonFinite {
                    step: done,
                    tensor: tensor.to_string(),
                }
                .into());
            }
            sink.send(part).map_err(TrainError::from)
        });
        self.own(step, sent)
    }
}

/// Parameter `name`'s optimizer state from the checkpoint.
fn param_state(
    ckpt: &Checkpoint,
    name: &str,
    kind: OptimizerKind,
    dtype: candle_core::DType,
) -> Result<ParamState, TrainError> {
    let get = |part: &str| -> Result<candle_core::Tensor, TrainError> {
        Ok(ckpt.tensor(&optim_name(name, part))?.to_tensor(dtype)?)
    };
    Ok(match kind {
        OptimizerKind::Sgd { .. } => ParamState::Sgd {
            momentum: get("momentum")?,
        },
        OptimizerKind::AdamW { .. } => ParamState::AdamW {
            m: get("m")?,
            v: get("v")?,
        },
    })
}

/// The lowest direction with a copy of model stage `stage` in the schedule (its copy in that
/// direction is the one a checkpoint saves: one writer per layer, whichever process holds
/// it).
fn writer_dir(config: &TrainConfig, schedule: &Schedule, stage: usize) -> Option<usize> {
    (0..config.schedule.ranks)
        .flat_map(|r| schedule.placement.stages_of(r))
        .filter(|&(_, s)| s == stage)
        .map(|(d, _)| d)
        .min()
}

/// Whether the copy (`dir`, `stage`) is the one a checkpoint saves.
fn writes_copy(config: &TrainConfig, schedule: &Schedule, dir: usize, stage: usize) -> bool {
    writer_dir(config, schedule, stage) == Some(dir)
}

/// Whether the trainer `read` shows holds the copy of model stage `stage` a checkpoint saves
/// (it then also saves that stage's error feedback of its replica).
pub(crate) fn holds_writer_of(read: &StageRead<'_>, stage: usize) -> bool {
    read.stages.iter().any(|rank| {
        rank.iter()
            .any(|((dir, s), _)| s == stage && writes_copy(read.config, read.schedule, dir, s))
    })
}
