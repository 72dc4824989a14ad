//! Layers and reference models with split backward (F / I / W) on candle-core.
//!
//! - [`layers`]: `Linear`, exact-erf `Gelu`, MSE, the residual `MlpBlock` and the
//!   mixture-of-experts `MoeLayer`, each with `forward`, `backward_input` (input gradient only)
//!   and `backward_weight` (the deferred weight-gradient GEMMs);
//! - [`parallel`]: the expert-parallel exchange, the FB pair's compute token and threads, and
//!   their wait tallies (no model, no layer);
//! - [`gpt`]: the GPT-style byte-level language model (embeddings, RMSNorm, causal
//!   attention, MLP blocks, cross-entropy) as pipeline stages, its safetensors weights, byte
//!   data, the synthetic addition task, eval and generation;
//! - [`stage::MlpStage`]: a slice of the MLP model implementing the runtime's
//!   [`dualpipe_runtime::Stage`];
//! - [`model_stage`]: the open stage API: [`PipelineStage`], one pipeline stage of any model
//!   (the MLP, the GPT, a user's), and [`ModelStage`], the trainer's box around one, so the
//!   trainer is written once;
//! - [`custom`]: a user's model from layers: the [`custom::Layer`] trait, a stage of layers
//!   with a loss ([`custom::LayerStage`]), and [`custom::AutogradLayer`], a layer whose backward
//!   is candle's autograd;
//! - [`data`]: seeded teacher-student regression data;
//! - [`optim`]: SGD with momentum and AdamW;
//! - [`precision`]: the half-precision formats of mixed-precision training ([`Half`]);
//! - [`distributed`]: the wire codec of the stage's tensors, so a stage's activations and
//!   gradients can cross processes (MPI).
//!
//! The training loop, its configuration and the sequential reference live one crate up, in
//! `dualpipe-train`.
//!
//! The model and the data depend only on the seed, the number of model stages and the shapes,
//! so every schedule trains the same model on the same batches.

#![warn(missing_docs)]

pub mod custom;
pub mod data;
pub mod distributed;
pub mod error;
pub mod gpt;
pub mod layers;
pub mod model_stage;
pub mod optim;
pub mod parallel;
mod plumbing;
pub mod precision;
pub mod rng;
pub mod stage;
mod step_batch;

/// The recomputation setting (defined in `dualpipe-schedule`, below the simulator and the models).
pub use dualpipe_schedule::Recompute;
pub use error::NnError;
pub use model_stage::StagePosition;
pub use model_stage::{ExpertStage, ModelStage, PipelineStage, StepBatch};
pub use optim::{LrDecay, LrSchedule, Optimizer, OptimizerKind, ParamState};
pub use precision::Half;
pub use stage::{MlpStage, ModelConfig};
