//! The named choices of a [`TrainConfig`](super::TrainConfig): the element type, the model
//! and the GPT's synthetic task, each with its names for flags and JSON.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Element type of parameters and activations: one precision throughout, or mixed precision
/// (f32 master weights and optimizer state, half-precision GEMMs, saved activations and
/// messages: [`dualpipe_nn::precision`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit floats (fast; the default for training).
    #[default]
    F32,
    /// 64-bit floats (for exact comparisons in tests).
    F64,
    /// Mixed precision in bfloat16.
    Bf16,
    /// Mixed precision in IEEE half precision, with dynamic loss scaling.
    F16,
}

impl DType {
    /// Names accepted by [`DType::from_name`].
    pub const NAMES: [&'static str; 4] = ["f32", "f64", "bf16", "f16"];

    /// `"f32"`, `"f64"`, `"bf16"` or `"f16"`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
        }
    }

    /// Parses one of [`DType::NAMES`] (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "f32" => Some(DType::F32),
            "f64" => Some(DType::F64),
            "bf16" => Some(DType::Bf16),
            "f16" => Some(DType::F16),
            _ => None,
        }
    }

    /// The precision of the parameters, their gradients and the optimizer state: f32 under
    /// mixed precision (the master weights).
    pub fn master(self) -> DType {
        match self {
            DType::F64 => DType::F64,
            DType::F32 | DType::Bf16 | DType::F16 => DType::F32,
        }
    }

    /// The half-precision format of mixed precision, if this is one.
    pub fn half(self) -> Option<dualpipe_nn::Half> {
        match self {
            DType::Bf16 => Some(dualpipe_nn::Half::Bf16),
            DType::F16 => Some(dualpipe_nn::Half::F16),
            DType::F32 | DType::F64 => None,
        }
    }

    /// The candle element type of the parameters ([`DType::master`]).
    pub fn candle(self) -> candle_core::DType {
        match self.master() {
            DType::F64 => candle_core::DType::F64,
            _ => candle_core::DType::F32,
        }
    }

    /// Bytes of one activation value as a stage keeps it (2 under mixed precision).
    pub fn size_in_bytes(self) -> u128 {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
            DType::Bf16 | DType::F16 => 2,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which model a run trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// The GPT-style byte-level language model (`dualpipe_nn::gpt`): the default.
    #[default]
    Gpt,
    /// The residual MLP regressing a seeded random teacher (compared with DeepSeek's
    /// reference).
    Mlp,
}

impl ModelKind {
    /// Names accepted by [`ModelKind::from_name`].
    pub const NAMES: [&'static str; 2] = ["gpt", "mlp"];

    /// `"gpt"` or `"mlp"`.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Gpt => "gpt",
            ModelKind::Mlp => "mlp",
        }
    }

    /// Parses `"gpt"` or `"mlp"` (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "gpt" => Some(ModelKind::Gpt),
            "mlp" => Some(ModelKind::Mlp),
            _ => None,
        }
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The GPT's synthetic text when no data file is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// A seeded order-2 Markov source whose entropy rate is known: the validation loss is
    /// scored against the best possible (`dualpipe_nn::gpt::markov`). The default.
    #[default]
    Markov,
    /// Seeded two-digit additions `"12+34=46\n"`, scored as the exact-match accuracy of
    /// greedy answers on held-out problems (learning it takes thousands of steps).
    Addition,
}

impl Task {
    /// Names accepted by [`Task::from_name`].
    pub const NAMES: [&'static str; 2] = ["markov", "addition"];

    /// `"markov"` or `"addition"`.
    pub fn name(self) -> &'static str {
        match self {
            Task::Markov => "markov",
            Task::Addition => "addition",
        }
    }

    /// Parses a name of [`Task::NAMES`] (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "markov" => Some(Task::Markov),
            "addition" => Some(Task::Addition),
            _ => None,
        }
    }
}
