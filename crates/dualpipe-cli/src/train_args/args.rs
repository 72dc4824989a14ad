//! The flags of `dualpipe train` ([`TrainArgs`]). Every default is [`TrainConfig::DEFAULT`]'s
//! (the GPT) or [`TrainConfig::MLP`]'s, so the help text cannot drift from the library.

use std::path::PathBuf;

use super::count;
use dualpipe_train::TrainConfig;

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
pub struct TrainArgs {
    /// The model: gpt (a byte-level transformer language model) or mlp (a residual MLP
    /// regressing a random teacher, compared with DeepSeek's reference).
    #[arg(long, default_value_t = D.model.kind.name().to_string())]
    pub model: String,
    /// Schedule kind: gpipe, 1f1b, interleaved, zb1p, dualpipe, dualpipev.
    #[arg(long, default_value_t = D.schedule.kind.name().to_string())]
    pub schedule: String,
    /// Train with the schedule in FILE (our JSON or torch's compute-only CSV, validated on
    /// import) instead of a generated one; its kind, ranks, micro-batches and stages per rank
    /// replace --schedule, --ranks, --micro-batches and --virtual-stages.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["schedule", "ranks", "micro_batches", "virtual_stages"])]
    pub schedule_file: Option<PathBuf>,
    /// Pipeline ranks (a thread each locally, a process each with --transport mpi).
    #[arg(long, default_value_t = D.schedule.ranks, value_parser = count, allow_negative_numbers = true)]
    pub ranks: usize,
    /// Micro-batches per step, over both directions for dualpipe.
    #[arg(long, default_value_t = D.schedule.micro_batches, value_parser = count, allow_negative_numbers = true)]
    pub micro_batches: usize,
    /// Rows (sequences for the GPT) per micro-batch (the help text, with the defaults of
    /// both models, is `help`'s).
    #[arg(long, value_parser = count, allow_negative_numbers = true,
          help = per_model("Rows (sequences for the GPT) per micro-batch", D.schedule.micro_batch_size, M.schedule.micro_batch_size))]
    pub micro_batch_size: Option<usize>,
    /// Stages per rank, for interleaved [default: 2 for interleaved, 1 otherwise].
    #[arg(long, value_parser = count, allow_negative_numbers = true)]
    pub virtual_stages: Option<usize>,
    /// The MLP's width; each block is hidden -> 4 hidden -> hidden.
    #[arg(long, default_value_t = D.model.hidden, value_parser = count, allow_negative_numbers = true)]
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
    #[arg(long, default_value_t = D.data.task.name().to_string())]
    pub task: String,
    /// The share of the text, at its end, held out for validation.
    #[arg(long, default_value_t = D.data.validation_fraction, allow_negative_numbers = true)]
    pub validation_fraction: f64,
    /// Validate the GPT every N steps (0: only after the last).
    #[arg(long, value_name = "N", default_value_t = D.data.eval_every)]
    pub eval_every: usize,
    /// Draw training windows in a seeded random order (false: the documented consecutive
    /// order, window ((t-1)·M + m)·B + r for row r of micro-batch m of step t).
    #[arg(long, default_value_t = D.data.shuffle, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub shuffle: bool,
    /// Write the GPT's final weights into FILE (safetensors, names in docs/models.md).
    #[arg(long, value_name = "FILE.safetensors")]
    pub save: Option<PathBuf>,
    /// Start the GPT from FILE's weights (safetensors; its metadata fixes the architecture,
    /// and a flag that disagrees is an error), or from a checkpoint directory's weights.
    #[arg(long, value_name = "FILE.safetensors", conflicts_with_all = ["resume", "resume_from", "resume_if_present"])]
    pub init_from: Option<PathBuf>,
    /// Training steps (the help text, with the defaults of both models, is `help`'s).
    #[arg(long, value_parser = count, allow_negative_numbers = true,
          help = per_model("Training steps (at most 1000000000)", D.steps, M.steps))]
    pub steps: Option<usize>,
    /// Learning rate (the help text, with the defaults of both models, is `help`'s).
    #[arg(long, allow_negative_numbers = true, help = per_model("Learning rate", D.optimizer.lr, M.optimizer.lr))]
    pub lr: Option<f64>,
    /// Linear learning-rate warm-up over the first N steps (0: none) [default: a tenth of
    /// --steps for the GPT, 0 for the MLP].
    #[arg(long, value_name = "N")]
    pub lr_warmup: Option<u64>,
    /// The learning rate after the warm-up: constant, or cosine (half a cosine down to --lr-min
    /// at the last step).
    #[arg(long, value_name = "DECAY", default_value_t = D.optimizer.lr_decay.name().to_string())]
    pub lr_decay: String,
    /// The cosine's floor [default: a tenth of --lr].
    #[arg(long, value_name = "LR", allow_negative_numbers = true)]
    pub lr_min: Option<f64>,
    /// Optimizer: sgd or adamw.
    #[arg(long, default_value_t = D.optimizer.kind.name().to_string())]
    pub optimizer: String,
    /// SGD's momentum [default: 0.9].
    #[arg(long, allow_negative_numbers = true)]
    pub momentum: Option<f64>,
    /// Scale each step's gradient down to this global L2 norm when it is larger (no
    /// clipping unless given).
    #[arg(long, value_name = "NORM", allow_negative_numbers = true)]
    pub clip_grad: Option<f64>,
    /// Element type: f32, f64, or mixed precision bf16 or f16 (f32 master weights and
    /// optimizer state; half-precision GEMMs, saved activations, pipeline messages and
    /// gradient exchange; f16 with dynamic loss scaling).
    #[arg(long, default_value_t = D.model.dtype.name().to_string())]
    pub dtype: String,
    /// With --dtype bf16 or f16: the GPT's attention projections in that format too, as
    /// PyTorch's autocast runs them (faster where the processor has half-precision GEMMs;
    /// +1.5% validation loss on the default task in bf16, so off by default).
    #[arg(long)]
    pub half_projections: bool,
    /// Seed of the model, the data and the shuffled order.
    #[arg(long, default_value_t = D.seed, allow_negative_numbers = true, value_parser = super::seed)]
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
    pub observe: super::ObserveArgs,
    /// local: one thread per rank; mpi: one process per rank, e.g.
    /// `mpirun -n 4 dualpipe train --transport mpi` (rank 0 prints the summary).
    #[arg(long, value_enum, default_value_t = Transport::Local)]
    pub transport: Transport,
    /// Seconds a rank waits for a message from another (a thread locally, a process with
    /// --transport mpi) before the step fails naming both.
    #[arg(long, value_name = "SECONDS", default_value_t = D.transport.recv_timeout, allow_negative_numbers = true)]
    pub recv_timeout: f64,
    /// Testing only: make RANK fail at STEP (1-based), as `RANK:STEP:error` (a clean error
    /// that the other ranks are told of), `RANK:STEP:exit` (the process exits at once with
    /// code 3) or `RANK:STEP:abort` (the process dies of SIGABRT). Needs --transport mpi.
    #[arg(long, value_name = "RANK:STEP:HOW", hide = true)]
    pub inject_failure: Option<String>,
    /// Data-parallel replicas of the whole pipeline (ranks x D workers: threads locally);
    /// each trains on its own share of the global batch of D x --micro-batches.
    #[arg(long, value_name = "D", default_value_t = D.parallelism.data_parallel, value_parser = count, allow_negative_numbers = true)]
    pub data_parallel: usize,
    /// Gradient bucket size in MiB (uncompressed gradients per exchange message group).
    #[arg(long, value_name = "MB", default_value_t = D.parallelism.bucket_mb, allow_negative_numbers = true)]
    pub bucket_mb: f64,
    /// Exchange the gradients after the pipeline, one stage after another (a plain all-reduce
    /// each), instead of starting each stage's buckets inside the pipeline as soon as its last
    /// weight gradient is done.
    #[arg(long)]
    pub no_overlap: bool,
    /// Wire format of the gradient exchange: none, bf16, int8 or 1bit.
    #[arg(long, default_value_t = D.parallelism.gradient_compression.name().to_string())]
    pub gradient_compression: String,
    /// Warm-up steps before --gradient-compression starts [default: --steps / 50, rounded up
    /// (6 of 300), for 1bit under AdamW (1-bit Adam's warm-up, the gradient in int8), else 0
    /// (other warm-ups are uncompressed)]; 0 compresses the gradient from the first step.
    #[arg(long, value_name = "N")]
    pub compression_warmup: Option<u64>,
    /// With 1-bit Adam: every N-th step after the warm-up exchanges the gradient in int8 and
    /// refreshes AdamW's variance [default: steps 2w, 4w, 8w, ... for a warm-up of w, the
    /// intervals doubling]; 0 keeps the variance frozen after the warm-up.
    #[arg(long, value_name = "N")]
    pub variance_refresh: Option<u64>,
    /// With 1bit under AdamW: exchange 1-bit Adam's momentum divided by AdamW's frozen
    /// denominator (every entry of an Adam step's size) instead of the raw momentum.
    #[arg(long)]
    pub one_bit_preconditioned: bool,
    /// Under MPI, exchange uncompressed gradients with our point-to-point exchange instead of
    /// MPI's own all-reduce (to compare the two).
    #[arg(long)]
    pub no_mpi_allreduce: bool,
    /// Drop what a lossy compression loses instead of adding it to the next step (the
    /// ablation of error feedback).
    #[arg(long)]
    pub no_error_feedback: bool,
    /// The GPT's mixture of experts.
    #[command(flatten)]
    pub moe: super::MoeArgs,
    /// Save a checkpoint (a step-NNNNNN directory: weights, optimizer state, error feedback,
    /// data position; see docs/checkpoints.md) into DIR every --checkpoint-every steps.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints [default: 500 with --checkpoint-dir].
    #[arg(long, value_name = "N", requires = "checkpoint_dir", value_parser = count, allow_negative_numbers = true)]
    pub checkpoint_every: Option<usize>,
    /// Checkpoints kept in --checkpoint-dir: the newest K (0 keeps every one); nothing but
    /// the step-* directories this program wrote is ever removed.
    #[arg(long, value_name = "K", default_value_t = dualpipe_train::checkpoint::DEFAULT_KEEP)]
    pub keep_checkpoints: usize,
    /// Continue from the latest complete checkpoint in --checkpoint-dir (a damaged one is
    /// reported and the previous used; none yet: start at step 1). --steps stays the total.
    #[arg(long, requires = "checkpoint_dir", conflicts_with = "resume_from")]
    pub resume: bool,
    /// Continue from the latest complete checkpoint in --checkpoint-dir if it holds one, else
    /// start at step 1 (and say so), the directory created if missing: one command line for a
    /// job's first run and every requeue (docs/slurm.md).
    #[arg(long, requires = "checkpoint_dir", conflicts_with_all = ["resume", "resume_from"])]
    pub resume_if_present: bool,
    /// With --resume or --resume-from: continue although the seed, task, data, --shuffle or
    /// --validation-fraction differ from the checkpoint's (refused otherwise, naming each).
    #[arg(long)]
    pub allow_changed_settings: bool,
    /// Continue from the checkpoint at PATH: a step-NNNNNN directory, or a checkpoint
    /// directory (its latest complete checkpoint). Any schedule, ranks, layers per stage or
    /// data-parallel degree that gives the same model can read it.
    #[arg(long, value_name = "PATH")]
    pub resume_from: Option<PathBuf>,
    /// Uneven stages, plans, profiling and re-balancing.
    #[command(flatten)]
    pub layout: super::LayoutArgs,
}

impl TrainArgs {
    /// Parses `flags` (what follows `dualpipe train` on a command line) as the command does:
    /// for programs and tests that take `train`'s flags themselves.
    pub fn try_parse_flags<I, T>(flags: I) -> Result<TrainArgs, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString>,
    {
        use clap::Parser;
        #[derive(Parser)]
        struct Train {
            #[command(flatten)]
            args: TrainArgs,
        }
        let argv = std::iter::once("train".into()).chain(flags.into_iter().map(Into::into));
        Train::try_parse_from(argv).map(|t| t.args)
    }
}
