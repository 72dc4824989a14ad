//! [`TrainArgs::config`]: the one place the flags of `dualpipe train` become a
//! [`TrainConfig`], with `--init-from`'s architecture adopted, and [`TrainArgs::job`]: the
//! job's configuration around it. Sizes are checked by
//! [`TrainConfig::check`] (in flag words), which is the one validator; what is checked here is
//! only what the configuration cannot say (a flag given for the other model, an unknown name,
//! a flag that disagrees with `--init-from`'s file).

use dualpipe_train::{
    DataSection, ModelSection, OptimizerSection, ParallelismSection, ScheduleSection,
    TransportSection,
};
use std::path::Path;

use dualpipe_nn::LrDecay;
use dualpipe_schedule::Schedule;

use super::{
    message, parse_injection, parse_kind, read_schedule_file, reworded, unknown, TrainArgs,
    Transport,
};
use dualpipe_train::checkpoint::DEFAULT_EVERY;
use dualpipe_train::job::{CheckpointSection, JobConfig, ObserveSection, OutputsSection, Resume};
use dualpipe_train::model::read_weights;
use dualpipe_train::{
    Compression, DType, Driver, LocalThreads, ModelKind, Naming, OptimizerKind, Task, TrainConfig,
    TrainError,
};

/// The GPT's defaults.
const D: TrainConfig = TrainConfig::DEFAULT;

impl TrainArgs {
    /// The configuration the flags ask for (or a [`TrainError::Config`] naming the bad flag)
    /// and, with `--schedule-file`, the schedule read from the file (whose shape the
    /// configuration takes). The flags that are not the configuration's are checked here too:
    /// `--checkpoint-every 0`, and `--inject-failure` without `--transport mpi`.
    pub fn config(&self) -> Result<(TrainConfig, Option<Schedule>), TrainError> {
        let resolved = config_and_schedule(self)?;
        if self.checkpoint_every == Some(0) {
            return Err(TrainError::Config(
                "--checkpoint-every 0: give a positive number of steps, such as 500".into(),
            ));
        }
        if self.transport == Transport::Local && self.inject_failure.is_some() {
            return Err(TrainError::Config(
                "--inject-failure needs --transport mpi (it stops one process of a \
                 multi-process run)"
                    .into(),
            ));
        }
        Ok(resolved)
    }

    /// The job the flags ask for: [`TrainArgs::config`]'s configuration and the job's own
    /// sections (checkpoints, watch, outputs, transport), its messages in flag words; with
    /// `--schedule-file`, the schedule read from the file. After this no flag is read.
    pub fn job(&self) -> Result<(JobConfig, Option<Schedule>), TrainError> {
        let (train, given) = self.config()?;
        let inject_failure = self
            .inject_failure
            .as_deref()
            .map(parse_injection)
            .transpose()?;
        let resume = match (&self.resume_from, self.resume, self.resume_if_present) {
            (Some(path), _, _) => Resume::From(path.clone()),
            (None, true, _) => Resume::Latest,
            (None, false, true) => Resume::IfPresent,
            (None, false, false) => Resume::No,
        };
        let job = JobConfig {
            train,
            checkpoint: CheckpointSection {
                dir: self.checkpoint_dir.clone(),
                every: self.checkpoint_every.unwrap_or(DEFAULT_EVERY),
                keep: self.keep_checkpoints,
                resume,
                allow_changed_settings: self.allow_changed_settings,
            },
            observe: ObserveSection {
                metrics_addr: self.observe.metrics_addr.clone(),
                log: self.observe.log.clone(),
                quiet: self.observe.quiet,
            },
            outputs: OutputsSection {
                save: self.save.clone(),
                trace: self.trace.clone(),
                svg: self.svg.clone(),
            },
            transport: match self.transport {
                Transport::Local => dualpipe_train::job::Transport::Local,
                Transport::Mpi => dualpipe_train::job::Transport::Mpi,
            },
            init_from: self.init_from.clone(),
            inject_failure,
            naming: Naming::Flags,
        };
        Ok((job, given))
    }

    /// The flags given that only `model` reads, for the error when another model is asked for.
    fn foreign_flags(&self, model: ModelKind) -> Vec<&'static str> {
        let mut given = Vec::new();
        match model {
            ModelKind::Mlp => {
                let gpt_only = [
                    ("--d-model", self.d_model.is_some()),
                    ("--heads", self.heads.is_some()),
                    ("--seq-len", self.seq_len.is_some()),
                    ("--data", self.data.is_some()),
                    ("--task", self.task != D.data.task.name()),
                    ("--save", self.save.is_some()),
                    ("--init-from", self.init_from.is_some()),
                    ("--experts", self.moe.experts.is_some()),
                ];
                given.extend(gpt_only.iter().filter(|(_, g)| *g).map(|(f, _)| *f));
            }
            ModelKind::Gpt => {
                if self.hidden != D.model.hidden {
                    given.push("--hidden");
                }
            }
        }
        given
    }
}

/// [`TrainArgs::config`]'s configuration and schedule.
fn config_and_schedule(args: &TrainArgs) -> Result<(TrainConfig, Option<Schedule>), TrainError> {
    let model = ModelKind::from_name(&args.model)
        .ok_or_else(|| unknown("model", "--model", &args.model, &ModelKind::NAMES))?;
    if let Some(flag) = args.foreign_flags(model).first() {
        let other = match model {
            ModelKind::Gpt => "mlp",
            ModelKind::Mlp => "gpt",
        };
        return Err(TrainError::Config(format!(
            "{flag} applies to --model {other}, not to --model {model}; drop it or add \
             --model {other}"
        )));
    }
    let base = TrainConfig::defaults_for(model);
    let given = args
        .schedule_file
        .as_deref()
        .map(read_schedule_file)
        .transpose()
        .map_err(TrainError::Config)?;
    let schedule = match &given {
        Some(s) => s.kind,
        None => parse_kind(&args.schedule).map_err(TrainError::Config)?,
    };
    let optimizer = match OptimizerKind::from_name(&args.optimizer) {
        Some(OptimizerKind::Sgd { momentum }) => OptimizerKind::Sgd {
            momentum: args.momentum.unwrap_or(momentum),
        },
        Some(_) if args.momentum.is_some() => {
            return Err(TrainError::Config(
                "--momentum applies to --optimizer sgd; AdamW has its own betas".into(),
            ))
        }
        Some(kind) => kind,
        None => {
            return Err(unknown(
                "optimizer",
                "--optimizer",
                &args.optimizer,
                &OptimizerKind::NAMES,
            ))
        }
    };
    let lr_decay = LrDecay::from_name(&args.lr_decay).ok_or_else(|| {
        unknown(
            "learning-rate decay",
            "--lr-decay",
            &args.lr_decay,
            &LrDecay::NAMES,
        )
    })?;
    let task = Task::from_name(&args.task)
        .ok_or_else(|| unknown("task", "--task", &args.task, &Task::NAMES))?;
    let dtype = DType::from_name(&args.dtype)
        .ok_or_else(|| unknown("dtype", "--dtype", &args.dtype, &DType::NAMES))?;
    let gradient_compression = args
        .gradient_compression
        .parse::<Compression>()
        .map_err(|_| {
            let names: Vec<&str> = Compression::ALL.iter().map(|c| c.name()).collect();
            unknown(
                "compression",
                "--gradient-compression",
                &args.gradient_compression,
                &names,
            )
        })?;
    let mut config = TrainConfig {
        model: ModelSection {
            kind: model,
            hidden: args.hidden,
            layers_per_stage: args.layers_per_stage.unwrap_or(base.model.layers_per_stage),
            d_model: args.d_model.unwrap_or(base.model.d_model),
            heads: args.heads.unwrap_or(base.model.heads),
            seq_len: args.seq_len.unwrap_or(base.model.seq_len),
            init_from: args.init_from.clone(),
            dtype,
            moe: args.moe.settings()?,
            partition: None,
            recompute: None,
            half_projections: args.half_projections,
        },
        schedule: ScheduleSection {
            kind: schedule,
            ranks: args.ranks,
            micro_batches: args.micro_batches,
            micro_batch_size: args
                .micro_batch_size
                .unwrap_or(base.schedule.micro_batch_size),
            virtual_stages: args
                .virtual_stages
                .unwrap_or_else(|| schedule.default_virtual_stages()),
        },
        parallelism: ParallelismSection {
            data_parallel: args.data_parallel,
            bucket_mb: args.bucket_mb,
            overlap: !args.no_overlap,
            gradient_compression,
            compression_warmup: args.compression_warmup,
            one_bit_preconditioned: args.one_bit_preconditioned,
            variance_refresh: args.variance_refresh,
            error_feedback: !args.no_error_feedback,
            slow_rank: None,
            rebalance: None,
        },
        optimizer: OptimizerSection {
            clip_grad: args.clip_grad,
            lr: args.lr.unwrap_or(base.optimizer.lr),
            lr_warmup: args.lr_warmup.or(base.optimizer.lr_warmup),
            lr_decay,
            lr_min: args.lr_min,
            kind: optimizer,
        },
        data: DataSection {
            path: args.data.clone(),
            task,
            validation_fraction: args.validation_fraction,
            eval_every: args.eval_every,
            shuffle: args.shuffle,
        },
        transport: TransportSection {
            recv_timeout: args.recv_timeout,
            mpi_allreduce: !args.no_mpi_allreduce,
        },
        steps: args.steps.unwrap_or(base.steps),
        seed: args.seed,
    };
    if let Some(s) = &given {
        (config.schedule.ranks, config.schedule.micro_batches) = (s.ranks, s.micro_batches);
        config.schedule.virtual_stages = s.virtual_stages;
    }
    args.layout.apply(&mut config, &base)?;
    if let Some(path) = &args.init_from {
        adopt_architecture(args, &mut config, path)?;
    }
    let processes = match args.transport {
        Transport::Local => {
            LocalThreads
                .check(&config, Naming::Flags)
                .map_err(reworded)?;
            1
        }
        Transport::Mpi => config.schedule.ranks,
    };
    config.check(Naming::Flags, processes).map_err(reworded)?;
    Ok((config, given))
}

/// Takes the architecture of `--init-from`'s file; a flag given that disagrees is an error
/// naming both values.
fn adopt_architecture(
    args: &TrainArgs,
    config: &mut TrainConfig,
    path: &Path,
) -> Result<(), TrainError> {
    let (weights, chosen) = if path.is_dir() {
        let found = dualpipe_train::checkpoint::open(path)
            .map_err(|e| TrainError::Config(format!("--init-from: {e}")))?;
        let weights =
            dualpipe_train::checkpoint::gpt_weights(&found.checkpoint, config.model.dtype.candle())
                .map_err(|e| TrainError::Config(format!("--init-from: {e}")))?;
        (weights, Some(found.checkpoint.path))
    } else {
        let weights = read_weights(path, config)
            .map_err(|e| TrainError::Config(format!("--init-from {}", message(e))))?;
        (weights, None)
    };
    let file = *weights.config();
    let stages = config.model_stages();
    let check =
        |flag: &str, given: Option<usize>| super::moe::check_file_flag(&file, path, flag, given);
    check("d-model", args.d_model)?;
    check("heads", args.heads)?;
    check("seq-len", args.seq_len)?;
    if let Some(per_stage) = args.layers_per_stage {
        if per_stage.saturating_mul(stages) != file.layers {
            return Err(TrainError::Config(format!(
                "--init-from {}: --layers-per-stage {per_stage} gives {} blocks over {stages} \
                 model stages but the weights file has layers = {}; drop the flag",
                path.display(),
                per_stage.saturating_mul(stages),
                file.layers
            )));
        }
    }
    if let Some(p) = &config.model.partition {
        let blocks: usize = p.iter().sum();
        if blocks != file.layers {
            return Err(TrainError::Config(format!(
                "--init-from {}: the partition {} holds {blocks} blocks but the weights file \
                 has layers = {}; give a partition of {} blocks",
                path.display(),
                dualpipe_train::parallel::stages::partition::format_partition(p),
                file.layers,
                file.layers
            )));
        }
    } else if stages == 0 || !file.layers.is_multiple_of(stages) {
        return Err(TrainError::Config(format!(
            "--init-from {}: its {} blocks do not split evenly over the {stages} model stages \
             of this schedule; choose --ranks (or --schedule) so that they do",
            path.display(),
            file.layers
        )));
    }
    if let Some(chosen) = chosen {
        // The checkpoint actually read (an older one when the newest is damaged): the run
        // reads it again, and its summary names it.
        config.model.init_from = Some(chosen);
    }
    config.model.d_model = file.d_model;
    config.model.heads = file.heads;
    config.model.seq_len = file.seq_len;
    config.model.layers_per_stage = file.layers / stages;
    config.model.moe = args.moe.adopt(&file, path)?;
    Ok(())
}
