//! The flags of `dualpipe train` and the one place they become a [`TrainConfig`]. Every
//! default is [`TrainConfig::DEFAULT`]'s (the GPT) or [`TrainConfig::MLP`]'s, so the help
//! text cannot drift from the library.

use std::path::PathBuf;

use dualpipe_schedule::Schedule;
use dualpipe_train::workload::read_weights;
use dualpipe_train::{
    DType, Driver, LocalThreads, ModelKind, Naming, OptimizerKind, Task, TrainConfig, TrainError,
};

use crate::cmd::{count, UsageError};

/// The GPT's defaults.
const D: TrainConfig = TrainConfig::DEFAULT;
/// The MLP's defaults.
const M: TrainConfig = TrainConfig::MLP;

/// How the ranks talk to each other.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// One thread per rank in this process, in-process channels.
    Local,
    /// One process per rank, started by mpirun / mpiexec / srun (needs a build with
    /// `--features mpi`).
    Mpi,
}

/// Output format of the end summary.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Human-readable summary.
    Table,
    /// One JSON object.
    Json,
}

/// `[default: G; M with --model mlp]` for a flag whose default differs by model.
fn per_model(what: &str, gpt: impl std::fmt::Display, mlp: impl std::fmt::Display) -> String {
    format!("{what} [default: {gpt}; {mlp} with --model mlp]")
}

/// Flags of `dualpipe train`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model: gpt (a byte-level transformer language model) or mlp (a residual MLP
    /// regressing a random teacher, compared with DeepSeek's reference).
    #[arg(long, default_value_t = D.model.name().to_string())]
    pub model: String,
    /// Schedule kind: gpipe, 1f1b, interleaved, zb1p, dualpipe, dualpipev.
    #[arg(long, default_value_t = D.schedule.name().to_string())]
    pub schedule: String,
    /// Train with the schedule in FILE (our JSON or torch's compute-only CSV, validated on
    /// import) instead of a generated one; its kind, ranks, micro-batches and stages per rank
    /// replace --schedule, --ranks, --micro-batches and --virtual-stages.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["schedule", "ranks", "micro_batches", "virtual_stages"])]
    pub schedule_file: Option<PathBuf>,
    /// Pipeline ranks (a thread each locally, a process each with --transport mpi).
    #[arg(long, default_value_t = D.ranks, value_parser = count, allow_negative_numbers = true)]
    pub ranks: usize,
    /// Micro-batches per step, over both directions for dualpipe.
    #[arg(long, default_value_t = D.micro_batches, value_parser = count, allow_negative_numbers = true)]
    pub micro_batches: usize,
    #[arg(long, value_parser = count, allow_negative_numbers = true,
          help = per_model("Rows (sequences for the GPT) per micro-batch", D.micro_batch_size, M.micro_batch_size))]
    pub micro_batch_size: Option<usize>,
    /// Stages per rank, for interleaved [default: 2 for interleaved, 1 otherwise].
    #[arg(long, value_parser = count, allow_negative_numbers = true)]
    pub virtual_stages: Option<usize>,
    /// The MLP's width; each block is hidden -> 4 hidden -> hidden.
    #[arg(long, default_value_t = D.hidden, value_parser = count, allow_negative_numbers = true)]
    pub hidden: usize,
    /// Blocks per model stage (MLP blocks, or transformer blocks) [default: 2; with
    /// --init-from, the file's blocks over the stages].
    #[arg(long, value_parser = count, allow_negative_numbers = true)]
    pub layers_per_stage: Option<usize>,
    /// The GPT's width [default: 64, or --init-from's].
    #[arg(long, value_parser = count, allow_negative_numbers = true)]
    pub d_model: Option<usize>,
    /// The GPT's attention heads, dividing --d-model [default: 4, or --init-from's].
    #[arg(long, value_parser = count, allow_negative_numbers = true)]
    pub heads: Option<usize>,
    /// The GPT's tokens per sequence [default: 32, or --init-from's].
    #[arg(long, value_parser = count, allow_negative_numbers = true)]
    pub seq_len: Option<usize>,
    /// Train the GPT on FILE (any file: every byte is a token) instead of the seeded
    /// addition task.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// The GPT's synthetic text when no --data is given: markov (a seeded Markov source
    /// whose entropy, the best possible loss, is known) or addition (two-digit sums, scored
    /// by held-out accuracy).
    #[arg(long, default_value_t = D.task.name().to_string())]
    pub task: String,
    /// The share of the text, at its end, held out for validation.
    #[arg(long, default_value_t = D.validation_fraction, allow_negative_numbers = true)]
    pub validation_fraction: f64,
    /// Validate the GPT every N steps (0: only after the last).
    #[arg(long, value_name = "N", default_value_t = D.eval_every)]
    pub eval_every: usize,
    /// Draw training windows in a seeded random order (false: the documented consecutive
    /// order, window ((t-1)·M + m)·B + r for row r of micro-batch m of step t).
    #[arg(long, default_value_t = D.shuffle, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub shuffle: bool,
    /// Write the GPT's final weights into FILE (safetensors, names in docs/models.md).
    #[arg(long, value_name = "FILE.safetensors")]
    pub save: Option<PathBuf>,
    /// Start the GPT from FILE's weights (safetensors; its metadata fixes the architecture,
    /// and a flag that disagrees is an error), or from a checkpoint directory's weights.
    #[arg(long, value_name = "FILE.safetensors")]
    pub init_from: Option<PathBuf>,
    #[arg(long, value_parser = count, allow_negative_numbers = true,
          help = per_model("Training steps (at most 1000000000)", D.steps, M.steps))]
    pub steps: Option<usize>,
    #[arg(long, allow_negative_numbers = true, help = per_model("Learning rate", D.lr, M.lr))]
    pub lr: Option<f64>,
    /// Optimizer: sgd or adamw.
    #[arg(long, default_value_t = D.optimizer.name().to_string())]
    pub optimizer: String,
    /// SGD's momentum [default: 0.9].
    #[arg(long, allow_negative_numbers = true)]
    pub momentum: Option<f64>,
    /// Scale each step's gradient down to this global L2 norm when it is larger (no
    /// clipping unless given).
    #[arg(long, value_name = "NORM", allow_negative_numbers = true)]
    pub clip_grad: Option<f64>,
    /// Element type: f32 or f64.
    #[arg(long, default_value_t = D.dtype.name().to_string())]
    pub dtype: String,
    /// Seed of the model, the data and the shuffled order.
    #[arg(long, default_value_t = D.seed, allow_negative_numbers = true)]
    pub seed: u64,
    /// Output format of the summary.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the summary into FILE instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Write the last step's measured timeline as a Chrome/Perfetto trace into FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Draw the last step's measured timeline as an SVG picture into FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Progress bar, metrics server and run log.
    #[command(flatten)]
    pub observe: super::observe::ObserveArgs,
    /// local: one thread per rank; mpi: one process per rank, e.g.
    /// `mpirun -n 4 dualpipe train --transport mpi` (rank 0 prints the summary).
    #[arg(long, value_enum, default_value_t = Transport::Local)]
    pub transport: Transport,
    /// Seconds a rank waits for a message from another (a thread locally, a process with
    /// --transport mpi) before the step fails naming both.
    #[arg(long, value_name = "SECONDS", default_value_t = D.recv_timeout, allow_negative_numbers = true)]
    pub recv_timeout: f64,
    /// Testing only: make RANK fail at STEP (1-based), as `RANK:STEP:error` (a clean error
    /// that the other ranks are told of), `RANK:STEP:exit` (the process exits at once with
    /// code 3) or `RANK:STEP:abort` (the process dies of SIGABRT). Needs --transport mpi.
    #[arg(long, value_name = "RANK:STEP:HOW", hide = true)]
    pub inject_failure: Option<String>,
    /// Data-parallel replicas of the whole pipeline (ranks x D workers: threads locally);
    /// each trains on its own share of the global batch of D x --micro-batches.
    #[arg(long, value_name = "D", default_value_t = D.data_parallel, value_parser = count, allow_negative_numbers = true)]
    pub data_parallel: usize,
    /// Gradient bucket size in MiB (uncompressed gradients per exchange message group).
    #[arg(long, value_name = "MB", default_value_t = D.bucket_mb, allow_negative_numbers = true)]
    pub bucket_mb: f64,
    /// Exchange one stage's gradients after another (a plain all-reduce each) instead of
    /// starting every stage's buckets before waiting for any.
    #[arg(long)]
    pub no_overlap: bool,
    /// Wire format of the gradient exchange: none, bf16, int8 or 1bit.
    #[arg(long, default_value_t = D.gradient_compression.name().to_string())]
    pub gradient_compression: String,
    /// Steps exchanged uncompressed before --gradient-compression starts.
    #[arg(long, value_name = "N", default_value_t = D.compression_warmup)]
    pub compression_warmup: u64,
    /// Drop what a lossy compression loses instead of adding it to the next step (the
    /// ablation of error feedback).
    #[arg(long)]
    pub no_error_feedback: bool,
    /// The GPT's mixture of experts.
    #[command(flatten)]
    pub moe: super::moe::MoeArgs,
    /// Save a checkpoint (a step-NNNNNN directory: weights, optimizer state, error feedback,
    /// data position; see docs/checkpoints.md) into DIR every --checkpoint-every steps.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints [default: 500 with --checkpoint-dir].
    #[arg(long, value_name = "N", requires = "checkpoint_dir", value_parser = count, allow_negative_numbers = true)]
    pub checkpoint_every: Option<usize>,
    /// Checkpoints kept in --checkpoint-dir: the newest K (0 keeps every one); nothing but
    /// its step-* directories is ever removed.
    #[arg(long, value_name = "K", default_value_t = dualpipe_train::checkpoint::DEFAULT_KEEP)]
    pub keep_checkpoints: usize,
    /// Continue from the latest complete checkpoint in --checkpoint-dir (a damaged one is
    /// reported and the previous used; none yet: start at step 1). --steps stays the total.
    #[arg(long, requires = "checkpoint_dir", conflicts_with = "resume_from")]
    pub resume: bool,
    /// Continue from the checkpoint at PATH: a step-NNNNNN directory, or a checkpoint
    /// directory (its latest complete checkpoint). Any schedule, ranks, layers per stage or
    /// data-parallel degree that gives the same model can read it.
    #[arg(long, value_name = "PATH")]
    pub resume_from: Option<PathBuf>,
    /// Uneven stages, plans, profiling and re-balancing.
    #[command(flatten)]
    pub layout: super::layout::LayoutArgs,
}

fn unknown(what: &str, flag: &str, value: &str, names: &[&str]) -> UsageError {
    UsageError(format!(
        "unknown {what} '{value}' ({flag}): use one of {}",
        names.join(", ")
    ))
}

impl Args {
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
                    ("--task", self.task != D.task.name()),
                    ("--save", self.save.is_some()),
                    ("--init-from", self.init_from.is_some()),
                    ("--experts", self.moe.experts.is_some()),
                ];
                given.extend(gpt_only.iter().filter(|(_, g)| *g).map(|(f, _)| *f));
            }
            ModelKind::Gpt => {
                if self.hidden != D.hidden {
                    given.push("--hidden");
                }
            }
        }
        given
    }
}

/// The configuration the flags ask for (or a usage error naming the bad flag) and, with
/// `--schedule-file`, the schedule read from the file (whose shape the configuration takes).
pub fn config_and_schedule(args: &Args) -> Result<(TrainConfig, Option<Schedule>), UsageError> {
    let model = ModelKind::from_name(&args.model)
        .ok_or_else(|| unknown("model", "--model", &args.model, &ModelKind::NAMES))?;
    if let Some(flag) = args.foreign_flags(model).first() {
        let other = match model {
            ModelKind::Gpt => "mlp",
            ModelKind::Mlp => "gpt",
        };
        return Err(UsageError(format!(
            "{flag} applies to --model {other}, not to --model {model}; drop it or add \
             --model {other}"
        )));
    }
    let base = TrainConfig::defaults_for(model);
    let given = args
        .schedule_file
        .as_deref()
        .map(crate::cmd::simulate::read_schedule_file)
        .transpose()?;
    let schedule = match &given {
        Some(s) => s.kind,
        None => crate::cmd::parse_kind(&args.schedule)?,
    };
    let optimizer = match OptimizerKind::from_name(&args.optimizer) {
        Some(OptimizerKind::Sgd { momentum }) => OptimizerKind::Sgd {
            momentum: args.momentum.unwrap_or(momentum),
        },
        Some(_) if args.momentum.is_some() => {
            return Err(UsageError(
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
    if let Some(m) = args.momentum {
        if !(m.is_finite() && (0.0..1.0).contains(&m)) {
            return Err(UsageError(format!(
                "--momentum {m}: it must be in [0, 1), such as 0.9"
            )));
        }
    }
    let task = Task::from_name(&args.task)
        .ok_or_else(|| unknown("task", "--task", &args.task, &Task::NAMES))?;
    let dtype = DType::from_name(&args.dtype)
        .ok_or_else(|| unknown("dtype", "--dtype", &args.dtype, &DType::NAMES))?;
    let gradient_compression = args
        .gradient_compression
        .parse::<dualpipe_train::Compression>()
        .map_err(|_| {
            let names: Vec<&str> = dualpipe_train::Compression::ALL
                .iter()
                .map(|c| c.name())
                .collect();
            unknown(
                "compression",
                "--gradient-compression",
                &args.gradient_compression,
                &names,
            )
        })?;
    let mut config = TrainConfig {
        model,
        schedule,
        ranks: args.ranks,
        micro_batches: args.micro_batches,
        micro_batch_size: args.micro_batch_size.unwrap_or(base.micro_batch_size),
        virtual_stages: args
            .virtual_stages
            .unwrap_or_else(|| schedule.default_virtual_stages()),
        hidden: args.hidden,
        layers_per_stage: args.layers_per_stage.unwrap_or(base.layers_per_stage),
        d_model: args.d_model.unwrap_or(base.d_model),
        heads: args.heads.unwrap_or(base.heads),
        seq_len: args.seq_len.unwrap_or(base.seq_len),
        data: args.data.clone(),
        task,
        validation_fraction: args.validation_fraction,
        eval_every: args.eval_every,
        shuffle: args.shuffle,
        init_from: args.init_from.clone(),
        clip_grad: args.clip_grad,
        steps: args.steps.unwrap_or(base.steps),
        lr: args.lr.unwrap_or(base.lr),
        optimizer,
        dtype,
        seed: args.seed,
        recv_timeout: args.recv_timeout,
        data_parallel: args.data_parallel,
        bucket_mb: args.bucket_mb,
        overlap: !args.no_overlap,
        gradient_compression,
        compression_warmup: args.compression_warmup,
        error_feedback: !args.no_error_feedback,
        moe: args.moe.settings()?,
        partition: None,
        slow_rank: None,
        rebalance: None,
    };
    if let Some(s) = &given {
        (config.ranks, config.micro_batches) = (s.ranks, s.micro_batches);
        config.virtual_stages = s.virtual_stages;
    }
    args.layout.apply(&mut config, &base)?;
    if let Some(path) = &args.init_from {
        adopt_architecture(args, &mut config, path)?;
    }
    let processes = match args.transport {
        Transport::Local => {
            LocalThreads.check(&config, Naming::Flags).map_err(usage)?;
            1
        }
        Transport::Mpi => config.ranks,
    };
    config.check(Naming::Flags, processes).map_err(usage)?;
    Ok((config, given))
}

/// Takes the architecture of `--init-from`'s file; a flag given that disagrees is an error
/// naming both values.
fn adopt_architecture(
    args: &Args,
    config: &mut TrainConfig,
    path: &std::path::Path,
) -> Result<(), UsageError> {
    let weights = read_weights(path, config)
        .map_err(|e| UsageError(format!("--init-from {}", usage(e).0)))?;
    let file = *weights.config();
    let stages = config.model_stages();
    let check = |flag: &str, given: Option<usize>| {
        file.check_flag(flag, given)
            .map_err(|e| UsageError(format!("--init-from {}: {e}", path.display())))
    };
    check("d-model", args.d_model)?;
    check("heads", args.heads)?;
    check("seq-len", args.seq_len)?;
    if let Some(per_stage) = args.layers_per_stage {
        if per_stage.saturating_mul(stages) != file.layers {
            return Err(UsageError(format!(
                "--init-from {}: --layers-per-stage {per_stage} gives {} blocks over {stages} \
                 model stages but the weights file has layers = {}; drop the flag",
                path.display(),
                per_stage.saturating_mul(stages),
                file.layers
            )));
        }
    }
    if let Some(p) = &config.partition {
        let blocks: usize = p.iter().sum();
        if blocks != file.layers {
            return Err(UsageError(format!(
                "--init-from {}: the partition {} holds {blocks} blocks but the weights file                  has layers = {}; give a partition of {} blocks",
                path.display(),
                dualpipe_train::partition::format_partition(p),
                file.layers,
                file.layers
            )));
        }
    } else if stages == 0 || !file.layers.is_multiple_of(stages) {
        return Err(UsageError(format!(
            "--init-from {}: its {} blocks do not split evenly over the {stages} model stages \
             of this schedule; choose --ranks (or --schedule) so that they do",
            path.display(),
            file.layers
        )));
    }
    config.d_model = file.d_model;
    config.heads = file.heads;
    config.seq_len = file.seq_len;
    config.layers_per_stage = file.layers / stages;
    config.moe = args.moe.adopt(&file, path)?;
    Ok(())
}

/// A configuration error's own words (without the library's prefix), as a usage error.
pub fn usage(err: TrainError) -> UsageError {
    match err {
        TrainError::Config(msg) => UsageError(msg),
        other => UsageError(other.to_string()),
    }
}
