//! The model set. [`Workload`]: what a run trains — the model's stages, the data of every step, and the
//! validation — for either model, so the trainer is written once.
//!
//! - the MLP regresses a seeded random teacher ([`dualpipe_nn::data::DataSet`]);
//! - the GPT learns a text: a file's bytes (`data`) or a synthetic [`Task`] — by default a
//!   seeded Markov source ([`MarkovSource`]) whose entropy rate is the best possible loss, or
//!   the addition task ([`AdditionTask`]) — validated on the text's held-out end (loss, bits
//!   per byte) and, for the addition task, on held-out problems (exact-match accuracy of
//!   greedy answers);
//! - a user's model: [`custom`].

use std::path::Path;

use dualpipe_nn::data::DataSet;
use dualpipe_nn::gpt::data::{AdditionTask, Problem, TextData};
use dualpipe_nn::gpt::eval::{self, Sampling};
use dualpipe_nn::gpt::markov::MarkovSource;
use dualpipe_nn::gpt::{GptConfig, GptStage, GptWeights};
use dualpipe_nn::{MlpStage, ModelStage, NnError, StagePosition, StepBatch};
use dualpipe_runtime::RankStages;
use serde::Serialize;

pub mod custom;

/// The tensors of one routed expert of the GPT's MoE blocks, in the order of
/// [`MoeLayer::expert_params`](dualpipe_nn::gpt::MoeLayer::expert_params) (suffixes of
/// [`expert_prefix`](dualpipe_nn::gpt::expert_prefix)).
pub const EXPERT_TENSORS: [&str; 2] = ["fc1.weight", "fc2.weight"];

use crate::config::memory;
use crate::config::{Field, ModelKind, Naming, Task, TrainConfig};
use crate::error::TrainError;

/// Digits of each operand of the default addition task.
pub const TASK_DIGITS: u32 = 2;
/// Training problems of the default task (its text is their concatenation).
pub const TASK_PROBLEMS: usize = 20_000;
/// Held-out problems the accuracy is measured on.
pub const TASK_HELD_OUT: usize = 100;
/// Bytes of the default Markov text (the last tenth validates, by default).
pub const MARKOV_BYTES: usize = 200_000;
/// Continuations shown at the end of a GPT run.
pub const SAMPLES: usize = 4;

/// A validation of the GPT on the held-out text (and problems).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Evaluation {
    /// Steps trained before it (1-based: after step `step`).
    pub step: usize,
    /// Mean next-token cross-entropy on the validation text, in nats (NaN when nothing is held
    /// out: see `held_out`).
    pub loss: f64,
    /// The same in bits per byte.
    pub bits_per_byte: f64,
    /// Exact-match accuracy of greedy answers on held-out problems (the addition task only).
    pub accuracy: Option<f64>,
    /// The best possible validation loss (the Markov source's entropy rate; `None` for other
    /// texts).
    pub best_loss: Option<f64>,
    /// Whether any text was held out (`--validation-fraction` above 0): without, `loss` and
    /// `bits_per_byte` are NaN and mean "none", not a diverged model.
    #[serde(skip)]
    pub held_out: bool,
}

/// A prompt and the model's continuation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sample {
    /// The prompt.
    pub prompt: String,
    /// What the model wrote after it (bytes that are not UTF-8 shown as U+FFFD).
    pub completion: String,
    /// 0 for greedy decoding, else the sampling temperature.
    pub temperature: f64,
}

/// The GPT's part of a workload.
#[derive(Debug)]
pub struct GptWorkload {
    /// The initial weights (seeded, or read from `init_from`); their architecture is the
    /// model's.
    pub weights: GptWeights,
    /// Training and validation windows.
    pub text: TextData,
    /// The held-out problems of the addition task (empty otherwise).
    pub problems: Vec<Problem>,
    /// The Markov source's entropy rate, the best possible loss (`None` otherwise).
    pub best_loss: Option<f64>,
}

/// What a run trains: the model and its data.
#[derive(Debug)]
pub enum Workload {
    /// The residual MLP and its teacher's data.
    Mlp(Box<DataSet>),
    /// The GPT and its text.
    Gpt(Box<GptWorkload>),
    /// A user's model, its batches given step by step ([`crate::strategy`]).
    Custom(Box<crate::model::custom::CustomWorkload>),
}

/// The GPT copy of model stage `position.model_stage` (of `stages`) from `weights`, set up as
/// `config` says: its blocks, recomputation, precision and MoE auxiliary loss (for the first
/// build and for a re-partitioning alike).
pub(crate) fn gpt_stage(
    config: &TrainConfig,
    weights: &GptWeights,
    stages: usize,
    position: StagePosition,
) -> Result<GptStage, TrainError> {
    let layers = config.stage_layers(position.model_stage);
    let mut stage = GptStage::with_layers(weights, stages, position, layers)?;
    stage.set_recompute(config.stage_recompute(position.model_stage));
    set_gpt_precision(config, &mut stage)?;
    if let Some(moe) = &config.model.moe {
        stage.set_aux_loss(moe.aux_loss);
    }
    Ok(stage)
}

/// Sets `stage` to `config`'s precision: the mixed-precision format of `dtype` (if any) and
/// whether the attention projections follow it.
pub(crate) fn set_gpt_precision(config: &TrainConfig, stage: &mut GptStage) -> Result<(), NnError> {
    stage.set_half(config.model.dtype.half())?;
    stage.set_half_projections(config.model.half_projections)
}

impl Workload {
    /// The workload `config` describes: reads `data` and `init_from` when given.
    pub fn new(config: &TrainConfig) -> Result<Self, TrainError> {
        match config.model.kind {
            ModelKind::Mlp => Ok(Workload::Mlp(Box::new(DataSet::new(
                config.seed,
                config.model.hidden,
                config.schedule.micro_batch_size,
                config.model.dtype.candle(),
            )?))),
            ModelKind::Gpt => Ok(Workload::Gpt(Box::new(GptWorkload::new(config)?))),
        }
    }

    /// The copy of model stage `position.model_stage` (of `stages`).
    pub fn stage(
        &self,
        config: &TrainConfig,
        stages: usize,
        position: StagePosition,
    ) -> Result<ModelStage, TrainError> {
        Ok(match self {
            Workload::Mlp(_) => {
                let mut stage = MlpStage::new(&config.mlp(), position)?;
                stage.set_half(config.model.dtype.half())?;
                ModelStage::new(stage)
            }
            Workload::Custom(_) if config.model.dtype.half().is_some() => {
                return Err(TrainError::Config(format!(
                    "`dtype` {}: mixed precision runs in the built-in models' layers; a user's \
                     model computes in its own tensors' dtype: train it in f32 or f64",
                    config.model.dtype
                )))
            }
            Workload::Custom(custom) => custom.stage(position)?,
            Workload::Gpt(gpt) => {
                ModelStage::new(gpt_stage(config, &gpt.weights, stages, position)?)
            }
        })
    }

    /// Every micro-batch of step `step` (0-based) of a single-replica run (replica 0's).
    pub fn batch(&self, config: &TrainConfig, step: usize) -> Result<StepBatch, TrainError> {
        self.replica_batch(config, step, 0)
    }

    /// Replica `replica`'s micro-batches of step `step`: its micro-batch `m` is global
    /// micro-batch `replica · micro_batches + m` of the step's
    /// `data_parallel · micro_batches`, drawn from the seed and those global indices only.
    pub fn replica_batch(
        &self,
        config: &TrainConfig,
        step: usize,
        replica: usize,
    ) -> Result<StepBatch, TrainError> {
        let m = config.schedule.micro_batches;
        let first = replica * m;
        let global = config.parallelism.data_parallel.max(1) * m;
        Ok(match self {
            Workload::Mlp(data) => StepBatch::Mlp(data.batch_from(step, first, m)?),
            Workload::Gpt(gpt) => StepBatch::Gpt(gpt.text.batch_range(
                step,
                global,
                first..first + m,
                config.schedule.micro_batch_size,
            )),
            Workload::Custom(custom) => custom.batch(step, replica)?,
        })
    }

    /// Whether the next step's batch can be drawn ahead, during the step (not for a user's
    /// model, whose batches come step by step).
    pub fn prefetches(&self) -> bool {
        !matches!(self, Workload::Custom(_))
    }

    /// The GPT's part, if this is the GPT.
    pub fn gpt(&self) -> Option<&GptWorkload> {
        match self {
            Workload::Gpt(gpt) => Some(gpt),
            Workload::Mlp(_) | Workload::Custom(_) => None,
        }
    }
}

impl GptWorkload {
    fn new(config: &TrainConfig) -> Result<Self, TrainError> {
        let naming = Naming::Fields;
        let weights = match &config.model.init_from {
            Some(path) => {
                let weights = read_weights(path, config)?;
                check_architecture(weights.config(), &config.gpt(), naming)?;
                weights
            }
            None => GptWeights::random(&config.gpt(), config.seed)?,
        };
        let (bytes, problems, best_loss) = match (&config.data.path, config.data.task) {
            (Some(path), _) => (read_text(path)?, Vec::new(), None),
            (None, Task::Addition) => {
                let task = AdditionTask {
                    digits: TASK_DIGITS,
                    seed: config.seed,
                };
                (
                    task.training_text(TASK_PROBLEMS),
                    task.held_out(TASK_HELD_OUT, TASK_PROBLEMS),
                    None,
                )
            }
            (None, Task::Markov) => {
                let source = MarkovSource::new(config.seed);
                (
                    source.text(config.seed, MARKOV_BYTES),
                    Vec::new(),
                    Some(source.entropy_rate()),
                )
            }
        };
        let text = TextData::from_vec(
            bytes,
            config.model.seq_len,
            config.data.validation_fraction,
            config.data.shuffle.then_some(config.seed),
        )
        .map_err(|e| match (&config.data.path, e) {
            (Some(path), NnError::Config(msg)) => {
                TrainError::Config(format!("{}: {msg}", path.display()))
            }
            (_, e) => e.into(),
        })?;
        Ok(GptWorkload {
            weights,
            text,
            problems,
            best_loss,
        })
    }

    /// The current weights, read from one copy of every model stage in `ranks` (which must
    /// hold them all).
    pub fn current_weights(
        &self,
        ranks: &[RankStages<ModelStage>],
    ) -> Result<GptWeights, TrainError> {
        let mut weights = self.weights.clone();
        for (_, stage) in ranks.iter().flat_map(RankStages::iter) {
            if let Some(s) = stage.as_gpt() {
                s.write_into(&mut weights)?;
            }
        }
        Ok(weights)
    }

    /// Validates `weights` after `step` steps: the validation text's loss (NaN without a
    /// validation part) and, for the task, the held-out accuracy.
    pub fn evaluate(&self, weights: &GptWeights, step: usize) -> Result<Evaluation, TrainError> {
        let model = GptStage::whole(weights)?;
        let (loss, bits_per_byte) = match &self.text.validation {
            Some(windows) => {
                let report = eval::evaluate_spread(&model, windows, MAX_VALIDATION_WINDOWS)?;
                (report.loss, report.bits_per_byte)
            }
            None => (f64::NAN, f64::NAN),
        };
        let accuracy = (!self.problems.is_empty())
            .then(|| eval::addition_accuracy(&model, &self.problems))
            .transpose()?;
        Ok(Evaluation {
            step,
            loss,
            bits_per_byte,
            accuracy,
            best_loss: self.best_loss,
            held_out: self.text.validation.is_some(),
        })
    }

    /// A few continuations by `weights`: for the addition task, the greedy answers to
    /// held-out problems; for a text, the validation text's (or the training text's) first
    /// windows' first bytes continued by 80 bytes, greedily and sampled at temperature 1.
    pub fn samples(&self, weights: &GptWeights, seed: u64) -> Result<Vec<Sample>, TrainError> {
        let model = GptStage::whole(weights)?;
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        if !self.problems.is_empty() {
            return self
                .problems
                .iter()
                .take(SAMPLES)
                .map(|p| {
                    let greedy = Sampling {
                        max_tokens: 8,
                        temperature: 0.0,
                        seed,
                        stop: Some(b'\n'),
                    };
                    let out = eval::generate(&model, p.prompt.as_bytes(), greedy)?;
                    Ok(Sample {
                        prompt: p.prompt.clone(),
                        completion: text(out.strip_suffix(b"\n").unwrap_or(&out)),
                        temperature: 0.0,
                    })
                })
                .collect();
        }
        let windows = self.text.validation.as_ref().unwrap_or(&self.text.train);
        let prompt_len = windows.seq_len().min(24);
        (0..SAMPLES)
            .map(|i| {
                let prompt = &windows.window(i % windows.len())[..prompt_len];
                let temperature = if i == 0 { 0.0 } else { 1.0 };
                let sampling = Sampling {
                    max_tokens: 80,
                    temperature,
                    seed: seed.wrapping_add(i as u64),
                    stop: None,
                };
                let out = eval::generate(&model, prompt, sampling)?;
                Ok(Sample {
                    prompt: text(prompt),
                    completion: text(&out),
                    temperature,
                })
            })
            .collect()
    }
}

/// The architecture of `found` must be `expected`'s (the configuration's), naming both.
fn check_architecture(
    found: &GptConfig,
    expected: &GptConfig,
    naming: Naming,
) -> Result<(), TrainError> {
    let pairs = [
        (Field::DModel, found.d_model, expected.d_model),
        (Field::Heads, found.heads, expected.heads),
        (Field::SeqLen, found.seq_len, expected.seq_len),
    ];
    for (field, file, asked) in pairs {
        if file != asked {
            return Err(TrainError::Config(format!(
                "{} {asked} disagrees with the weights' {} {file}; drop it or make them agree",
                field.name(naming),
                field.key()
            )));
        }
    }
    if found.moe != expected.moe {
        let show = |m: &Option<dualpipe_nn::gpt::MoeConfig>| match m {
            Some(m) => format!(
                "{} experts (top-{}, hidden {}, {} shared, every {} blocks)",
                m.experts, m.top_k, m.expert_hidden, m.shared_experts, m.every
            ),
            None => "a dense feed-forward".to_string(),
        };
        return Err(TrainError::Config(format!(
            "the weights have {}, the configuration {}; make them agree",
            show(&found.moe),
            show(&expected.moe)
        )));
    }
    if found.layers != expected.layers {
        return Err(TrainError::Config(format!(
            "the weights hold {} blocks, the configuration {} ({} per stage); choose \
             {} so that it times the stages gives {}",
            found.layers,
            expected.layers,
            expected.layers,
            Field::LayersPerStage.name(naming),
            found.layers
        )));
    }
    Ok(())
}

/// Reads safetensors weights for `config`'s element type; a directory is read as a
/// checkpoint (a `step-*` directory, or a checkpoint directory's latest), weights only.
pub fn read_weights(path: &Path, config: &TrainConfig) -> Result<GptWeights, TrainError> {
    if path.is_dir() {
        let found = crate::checkpoint::open(path)?;
        return Ok(crate::checkpoint::gpt_weights(
            &found.checkpoint,
            config.model.dtype.candle(),
        )?);
    }
    let bytes = read_weights_file(path)?;
    GptWeights::from_safetensors(&bytes, config.model.dtype.candle())
        .map_err(|e| TrainError::Config(format!("{}: {e}", path.display())))
}

/// Reads a training text (any bytes).
fn read_text(path: &Path) -> Result<Vec<u8>, TrainError> {
    read_data(path)
}

/// The most validation windows one validation during training scores (a held-out part with
/// more is sampled evenly: window `⌊i · n / MAX⌋` for i = 0..MAX), so a validation costs at most
/// this many forward passes of one window, whatever the size of `--data` (the embedded tasks
/// and files up to about 2.5 MB at the default 10% and seq_len 32 are scored whole).
pub const MAX_VALIDATION_WINDOWS: usize = 8192;

/// The largest text `--data` reads (4 GiB), and never more than half the memory available
/// when the run starts. The text is read once into the buffer the windows use.
pub const MAX_DATA_BYTES: u64 = dualpipe_io::limits::DATA_BYTES;

/// A cap lowered to half the memory available when the run starts (a file read whole must
/// leave room for the rest of the run).
fn within_memory(limit: dualpipe_io::limits::Limit) -> dualpipe_io::limits::Limit {
    match memory::available_bytes() {
        Some(available) => limit.at_most(
            u64::try_from(available / 2).unwrap_or(u64::MAX),
            format!("half the {available} bytes of memory available"),
        ),
        None => limit,
    }
}

/// Reads a text to train or evaluate on (`--data`) through the one input path
/// ([`dualpipe_io::read_regular`]): a regular file only (a FIFO, `/dev/zero` or another device
/// is refused before a byte is read, and a FIFO never blocks the open), at most
/// [`MAX_DATA_BYTES`] and at most half the memory available; a buffer the memory cannot hold
/// is an error, not an abort. Every refusal is a [`TrainError::Config`] naming the file.
pub fn read_data(path: &Path) -> Result<Vec<u8>, TrainError> {
    dualpipe_io::read_regular(
        path,
        within_memory(dualpipe_io::limits::DATA),
        "the training text",
    )
    .map_err(|e| TrainError::Config(format!("{e} (`data`)")))
}

/// Reads a weights file (safetensors) through the one input path: a regular file only, at
/// most [`dualpipe_io::limits::TENSORS`] and half the memory available.
pub fn read_weights_file(path: &Path) -> Result<Vec<u8>, TrainError> {
    dualpipe_io::read_regular(
        path,
        within_memory(dualpipe_io::limits::TENSORS),
        "the weights",
    )
    .map_err(|e| TrainError::Config(e.to_string()))
}
