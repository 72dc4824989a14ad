//! Every tensor of the model by its documented name; seeded initialisation; safetensors bytes.

use std::collections::HashMap;

use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};

use super::{GptConfig, VOCAB};
use crate::error::{NnError, TensorContext};
use crate::rng::{self, Purpose};

/// What can be wrong with a weights file.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The bytes are not a safetensors file.
    #[error("not a safetensors file: {0}")]
    Format(String),
    /// The metadata lacks a key or holds a value we cannot use.
    #[error("metadata `{key}`: {problem}")]
    Metadata {
        /// The metadata key.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A tensor is missing, extra, or of the wrong shape or type.
    #[error("tensor `{name}`: {problem}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A mixture-of-experts setting given for a dense weights file.
    #[error("`{field}` is {given} but the weights file is a dense model (it has no experts); leave it unset")]
    Dense {
        /// The setting's field (`experts`, `top_k`, `expert_hidden`, `shared_experts`,
        /// `moe_every`).
        field: String,
        /// The value given.
        given: usize,
    },
    /// A setting disagrees with the architecture stored in the file.
    #[error("`{field}` is {given} but the weights file has {field} = {file}; leave it unset or make it {file}")]
    Mismatch {
        /// The setting's field, as the file's metadata names it (`d_model`, `top_k`, ...).
        field: String,
        /// The value in the file.
        file: usize,
        /// The value given.
        given: usize,
    },
}

impl From<WeightsError> for NnError {
    fn from(e: WeightsError) -> Self {
        NnError::Config(e.to_string())
    }
}

/// The names and shapes of every tensor, in the model's fixed order: `tok_emb.weight`,
/// `pos_emb.weight`, then per block `norm1`, `attn.qkv`, `attn.proj`, `norm2`, `mlp.fc1`,
/// `mlp.fc2` (an MoE block: `moe.router.weight`, `moe.experts.{e}.fc1`/`fc2`,
/// `moe.shared.{s}.fc1`/`fc2`, then `moe.router.selection_bias`), then `norm_f.weight`,
/// `lm_head.weight`.
pub fn tensor_names(c: &GptConfig) -> Vec<(String, Vec<usize>)> {
    let d = c.d_model;
    let mut v = vec![
        ("tok_emb.weight".to_string(), vec![VOCAB, d]),
        ("pos_emb.weight".to_string(), vec![c.seq_len, d]),
    ];
    for l in 0..c.layers {
        v.extend(block_tensor_names(l, c));
        v.extend(block_buffer_names(l, c));
    }
    v.push(("norm_f.weight".into(), vec![d]));
    v.push(("lm_head.weight".into(), vec![VOCAB, d]));
    v
}

/// The name of MoE block `l`'s selection bias (a buffer, not trained by gradients).
pub(crate) fn moe_bias_name(l: usize) -> String {
    format!("blocks.{l}.moe.router.selection_bias")
}

/// The prefix of the names of MoE block `l`'s routed expert `j`
/// (`blocks.{l}.moe.experts.{j}.`, then `fc1.weight` and `fc2.weight`).
pub fn expert_prefix(l: usize, j: usize) -> String {
    format!("blocks.{l}.moe.experts.{j}.")
}

/// The names and shapes of block `l`'s trainable tensors, in the order of its parameters.
pub(crate) fn block_tensor_names(l: usize, c: &GptConfig) -> Vec<(String, Vec<usize>)> {
    let d = c.d_model;
    let p = |s: &str| format!("blocks.{l}.{s}.weight");
    let mut v = vec![
        (p("norm1"), vec![d]),
        (p("attn.qkv"), vec![3 * d, d]),
        (p("attn.proj"), vec![d, d]),
        (p("norm2"), vec![d]),
    ];
    match c.moe {
        Some(m) if m.is_moe_block(l) => {
            let h = m.expert_hidden;
            v.push((p("moe.router"), vec![m.experts, d]));
            let experts = (0..m.experts)
                .map(|e| format!("moe.experts.{e}"))
                .chain((0..m.shared_experts).map(|s| format!("moe.shared.{s}")));
            for e in experts {
                v.push((p(&format!("{e}.fc1")), vec![h, d]));
                v.push((p(&format!("{e}.fc2")), vec![d, h]));
            }
        }
        _ => {
            v.push((p("mlp.fc1"), vec![4 * d, d]));
            v.push((p("mlp.fc2"), vec![d, 4 * d]));
        }
    }
    v
}

/// The names and shapes of block `l`'s buffers (state that gradients do not train): an MoE
/// block's selection bias.
pub(crate) fn block_buffer_names(l: usize, c: &GptConfig) -> Vec<(String, Vec<usize>)> {
    match c.moe {
        Some(m) if m.is_moe_block(l) => vec![(moe_bias_name(l), vec![m.experts])],
        _ => Vec::new(),
    }
}

/// The whole model's tensors by name, with the architecture they belong to.
#[derive(Clone, Debug)]
pub struct GptWeights {
    config: GptConfig,
    tensors: HashMap<String, Tensor>,
}

impl GptWeights {
    /// Seeded initialisation: embeddings uniform with standard deviation 0.02, norm weights
    /// one, MoE selection biases zero, linear weights uniform in `±1/√in` (PyTorch's default), the residual projections
    /// (`attn.proj`, `mlp.fc2`) scaled by `1/√(2·layers)`. Tensor `i` of [`tensor_names`] is
    /// drawn in f64 from the stream (seed, `i`) and cast, so it depends only on the seed and
    /// the shapes, never on the pipeline split.
    pub fn random(config: &GptConfig, seed: u64) -> Result<Self, NnError> {
        config.validate()?;
        let emb_bound = 0.02 * 3f64.sqrt();
        let residual_gain = 1.0 / ((2 * config.layers) as f64).sqrt();
        let mut tensors = HashMap::new();
        for (i, (name, shape)) in tensor_names(config).into_iter().enumerate() {
            let count: usize = shape.iter().product();
            let values = if name.ends_with(".selection_bias") {
                vec![0.0; count]
            } else if shape.len() == 1 {
                vec![1.0; count]
            } else {
                let bound = if name.ends_with("_emb.weight") {
                    emb_bound
                } else {
                    let gain = if name.ends_with("attn.proj.weight") || name.ends_with("fc2.weight")
                    {
                        residual_gain
                    } else {
                        1.0
                    };
                    gain / (shape[1] as f64).sqrt()
                };
                let mut rng = rng::stream(seed, Purpose::GptParams, i as u64, 0);
                rng::uniform(&mut rng, count, bound)
            };
            let t = Tensor::from_vec(values, shape, &Device::Cpu)
                .and_then(|t| t.to_dtype(config.dtype))
                .ctx("GptWeights::random")?;
            tensors.insert(name, t);
        }
        Ok(GptWeights {
            config: *config,
            tensors,
        })
    }

    /// Weights from named tensors, checked against [`tensor_names`] (every name present with
    /// its shape, no others) and cast to the config's dtype.
    pub fn from_tensors(
        config: &GptConfig,
        mut tensors: HashMap<String, Tensor>,
    ) -> Result<Self, WeightsError> {
        config.validate().map_err(|e| WeightsError::Metadata {
            key: config.invalid_key().into(),
            problem: e.to_string(),
        })?;
        let names = tensor_names(config);
        let mut out = HashMap::new();
        for (name, shape) in &names {
            let t = tensors.remove(name).ok_or_else(|| WeightsError::Tensor {
                name: name.clone(),
                problem: "missing".into(),
            })?;
            if t.dims() != shape.as_slice() {
                return Err(WeightsError::Tensor {
                    name: name.clone(),
                    problem: format!("shape {:?}, expected {shape:?}", t.dims()),
                });
            }
            if !matches!(t.dtype(), DType::F32 | DType::F64) {
                return Err(WeightsError::Tensor {
                    name: name.clone(),
                    problem: format!("type {:?}; use F32 or F64", t.dtype()),
                });
            }
            let t = t.to_dtype(config.dtype).map_err(|e| WeightsError::Tensor {
                name: name.clone(),
                problem: e.to_string(),
            })?;
            if !all_finite(&t) {
                return Err(WeightsError::Tensor {
                    name: name.clone(),
                    problem: "holds a value that is not a finite number (inf or NaN): these \
                              weights are unusable (saved from a diverged run?)"
                        .into(),
                });
            }
            out.insert(name.clone(), t);
        }
        if let Some(extra) = tensors.keys().min() {
            return Err(WeightsError::Tensor {
                name: extra.clone(),
                problem: "not part of the model".into(),
            });
        }
        Ok(GptWeights {
            config: *config,
            tensors: out,
        })
    }

    /// The architecture.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// The first tensor (in [`tensor_names`] order) holding a value that is not a finite
    /// number, if any: such weights must not be saved or used.
    pub fn first_non_finite(&self) -> Option<String> {
        tensor_names(&self.config)
            .into_iter()
            .map(|(name, _)| name)
            .find(|name| self.tensors.get(name).is_some_and(|t| !all_finite(t)))
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Result<&Tensor, NnError> {
        self.tensors
            .get(name)
            .ok_or_else(|| NnError::Config(format!("the weights have no tensor `{name}`")))
    }

    /// Replaces the tensor called `name` (same shape).
    pub fn set(&mut self, name: &str, value: Tensor) -> Result<(), NnError> {
        let old = self.get(name)?;
        if old.dims() != value.dims() {
            return Err(NnError::Config(format!(
                "`{name}` is {:?}, the new value {:?}",
                old.dims(),
                value.dims()
            )));
        }
        let value = value.to_dtype(self.config.dtype).ctx("GptWeights::set")?;
        self.tensors.insert(name.to_string(), value);
        Ok(())
    }

    /// The metadata stored with the tensors: `model` = "gpt", `d_model`, `heads`, `layers`,
    /// `seq_len`, `vocab` (numbers as decimal strings); with MoE also `experts`, `top_k`,
    /// `expert_hidden`, `shared_experts`, `moe_every`.
    pub fn metadata(&self) -> HashMap<String, String> {
        let c = &self.config;
        let moe = c.moe.map(|m| {
            [
                ("experts", m.experts),
                ("top_k", m.top_k),
                ("expert_hidden", m.expert_hidden),
                ("shared_experts", m.shared_experts),
                ("moe_every", m.every),
            ]
            .map(|(k, v)| (k, v.to_string()))
        });
        [
            ("model", "gpt".to_string()),
            ("d_model", c.d_model.to_string()),
            ("heads", c.heads.to_string()),
            ("layers", c.layers.to_string()),
            ("seq_len", c.seq_len.to_string()),
            ("vocab", VOCAB.to_string()),
        ]
        .into_iter()
        .chain(moe.into_iter().flatten())
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The safetensors file: every tensor under its name, in the config's dtype, with
    /// [`GptWeights::metadata`]. The same weights always give the same bytes: the header's
    /// members, and the metadata's, are written in sorted order.
    pub fn to_safetensors(&self) -> Result<Vec<u8>, NnError> {
        let mut items: Vec<(&String, &Tensor)> = self.tensors.iter().collect();
        items.sort_by(|a, b| a.0.cmp(b.0));
        let mut bytes = safetensors::serialize(items, Some(self.metadata()))
            .map_err(|e| NnError::Config(format!("cannot write the weights: {e}")))?;
        sort_header(&mut bytes)?;
        Ok(bytes)
    }

    /// Weights from a safetensors file written by [`GptWeights::to_safetensors`] (or by
    /// PyTorch with the same names and metadata), in `dtype`.
    pub fn from_safetensors(bytes: &[u8], dtype: DType) -> Result<Self, WeightsError> {
        let (_, meta) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| WeightsError::Format(e.to_string()))?;
        let md = meta.metadata().clone().unwrap_or_default();
        let get = |key: &str| -> Result<&String, WeightsError> {
            md.get(key).ok_or_else(|| WeightsError::Metadata {
                key: key.into(),
                problem: "missing (write the file with dualpipe or add it)".into(),
            })
        };
        let num = |key: &str| -> Result<usize, WeightsError> {
            let v = get(key)?;
            v.parse().map_err(|_| WeightsError::Metadata {
                key: key.into(),
                problem: format!("`{v}` is not a whole number"),
            })
        };
        if get("model")? != "gpt" {
            return Err(WeightsError::Metadata {
                key: "model".into(),
                problem: format!("`{}`, expected `gpt`", get("model")?),
            });
        }
        if num("vocab")? != VOCAB {
            return Err(WeightsError::Metadata {
                key: "vocab".into(),
                problem: format!("{}, expected {VOCAB} (bytes)", num("vocab")?),
            });
        }
        let moe = if md.contains_key("experts") {
            Some(super::MoeConfig {
                experts: num("experts")?,
                top_k: num("top_k")?,
                expert_hidden: num("expert_hidden")?,
                shared_experts: num("shared_experts")?,
                every: num("moe_every")?,
            })
        } else {
            None
        };
        let config = GptConfig {
            d_model: num("d_model")?,
            heads: num("heads")?,
            layers: num("layers")?,
            seq_len: num("seq_len")?,
            dtype,
            moe,
        };
        config.validate().map_err(|e| WeightsError::Metadata {
            key: config.invalid_key().into(),
            problem: e.to_string(),
        })?;
        let st = safetensors::SafeTensors::deserialize(bytes)
            .map_err(|e| WeightsError::Format(e.to_string()))?;
        let mut tensors = HashMap::new();
        for (name, view) in st.tensors() {
            let t = view.load(&Device::Cpu).map_err(|e| WeightsError::Tensor {
                name: name.clone(),
                problem: e.to_string(),
            })?;
            tensors.insert(name, t);
        }
        Self::from_tensors(&config, tensors)
    }
}

/// Whether every value of `t` is a finite number (a tensor that cannot be read counts as
/// not finite).
fn all_finite(t: &Tensor) -> bool {
    t.flatten_all()
        .and_then(|f| f.to_dtype(DType::F64))
        .and_then(|f| f.to_vec1::<f64>())
        .is_ok_and(|v| v.iter().all(|x| x.is_finite()))
}

/// Rewrites a safetensors file's JSON header in place with its members (and the metadata's)
/// in sorted order: the writer keeps the metadata in a hash map, whose order changes from run
/// to run. The sorted header has the same members, so it is never longer; it is padded with
/// spaces to the old length, as the format allows.
fn sort_header(bytes: &mut [u8]) -> Result<(), NnError> {
    use std::collections::BTreeMap;
    let bad = |what: &str| NnError::Config(format!("cannot write the weights: {what}"));
    let len = bytes
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| bytes.len() >= 8 + n)
        .ok_or_else(|| bad("the header is truncated"))?;
    let header: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + len]).map_err(|e| bad(&e.to_string()))?;
    let sorted: BTreeMap<String, serde_json::Value> = header
        .into_iter()
        .map(|(key, value)| match value {
            serde_json::Value::Object(map) => {
                let map: BTreeMap<String, serde_json::Value> = map.into_iter().collect();
                (key, serde_json::to_value(map).unwrap_or_default())
            }
            other => (key, other),
        })
        .collect();
    let text = serde_json::to_string(&sorted).map_err(|e| bad(&e.to_string()))?;
    if text.len() > len {
        return Err(bad("the sorted header is longer than the original"));
    }
    let target = &mut bytes[8..8 + len];
    target[..text.len()].copy_from_slice(text.as_bytes());
    target[text.len()..].fill(b' ');
    Ok(())
}

impl GptConfig {
    /// The metadata key to blame when [`GptConfig::validate`] refuses this architecture: the
    /// first key that is 0, `heads` when it does not divide `d_model`, the MoE key at fault,
    /// and for a model too large `experts` when the dense model would fit, else `layers`.
    pub fn invalid_key(&self) -> &'static str {
        for (key, v) in [
            ("d_model", self.d_model),
            ("heads", self.heads),
            ("layers", self.layers),
            ("seq_len", self.seq_len),
        ] {
            if v == 0 {
                return key;
            }
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return "heads";
        }
        if let Some(m) = &self.moe {
            for (key, v) in [
                ("experts", m.experts),
                ("top_k", m.top_k),
                ("expert_hidden", m.expert_hidden),
                ("moe_every", m.every),
            ] {
                if v == 0 {
                    return key;
                }
            }
            if m.top_k > m.experts {
                return "top_k";
            }
            let dense = GptConfig { moe: None, ..*self };
            if dense.validate().is_ok() {
                return "experts";
            }
        }
        if self.seq_len > self.d_model.max(self.layers) {
            return "seq_len";
        }
        if self.d_model >= self.layers {
            "d_model"
        } else {
            "layers"
        }
    }

    /// Checks a value given for the architecture field `field` against this (file's)
    /// architecture: `Ok` when none was given or it agrees; [`WeightsError::Mismatch`] naming
    /// both values, or [`WeightsError::Dense`] for an MoE field of a dense file, otherwise.
    /// The fields are the metadata's: `d_model`, `heads`, `layers`, `seq_len`, `experts`,
    /// `top_k`, `expert_hidden`, `shared_experts`, `moe_every`.
    pub fn check_field(&self, field: &str, given: Option<usize>) -> Result<(), WeightsError> {
        let moe = |get: fn(&super::MoeConfig) -> usize| self.moe.as_ref().map_or(0, get);
        let file = match field {
            "d_model" => self.d_model,
            "heads" => self.heads,
            "layers" => self.layers,
            "seq_len" => self.seq_len,
            "experts" => moe(|m| m.experts),
            "top_k" => moe(|m| m.top_k),
            "expert_hidden" => moe(|m| m.expert_hidden),
            "shared_experts" => moe(|m| m.shared_experts),
            "moe_every" => moe(|m| m.every),
            other => {
                return Err(WeightsError::Metadata {
                    key: other.into(),
                    problem: "not an architecture field".into(),
                })
            }
        };
        let moe_field = !matches!(field, "d_model" | "heads" | "layers" | "seq_len");
        match given {
            Some(given) if moe_field && self.moe.is_none() => Err(WeightsError::Dense {
                field: field.into(),
                given,
            }),
            Some(given) if given != file => Err(WeightsError::Mismatch {
                field: field.into(),
                file,
                given,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod load_tests {
    use super::*;

    fn config() -> GptConfig {
        GptConfig {
            d_model: 8,
            heads: 2,
            layers: 1,
            seq_len: 4,
            dtype: DType::F32,
            moe: None,
        }
    }

    #[test]
    fn a_bad_architecture_blames_its_own_key() {
        let key = |c: GptConfig| c.invalid_key();
        assert_eq!(
            key(GptConfig {
                heads: 0,
                ..config()
            }),
            "heads"
        );
        assert_eq!(
            key(GptConfig {
                heads: 3,
                ..config()
            }),
            "heads"
        );
        assert_eq!(
            key(GptConfig {
                layers: 0,
                ..config()
            }),
            "layers"
        );
        assert_eq!(
            key(GptConfig {
                seq_len: 0,
                ..config()
            }),
            "seq_len"
        );
        assert_eq!(
            key(GptConfig {
                layers: 1 << 40,
                ..config()
            }),
            "layers"
        );
        let moe = super::super::MoeConfig {
            experts: 1 << 40,
            top_k: 1,
            expert_hidden: 8,
            shared_experts: 0,
            every: 1,
        };
        assert_eq!(
            key(GptConfig {
                moe: Some(moe),
                ..config()
            }),
            "experts"
        );
        let top = super::super::MoeConfig {
            experts: 2,
            top_k: 3,
            ..moe
        };
        assert_eq!(
            key(GptConfig {
                moe: Some(top),
                ..config()
            }),
            "top_k"
        );
    }

    #[test]
    fn non_finite_weights_are_refused_on_load_naming_the_tensor() {
        let mut w = GptWeights::random(&config(), 1).unwrap();
        assert_eq!(w.first_non_finite(), None);
        let bytes = w.to_safetensors().unwrap();
        assert!(GptWeights::from_safetensors(&bytes, DType::F32).is_ok());
        let bad = Tensor::new(&[f32::NAN; 8], &Device::Cpu).unwrap();
        w.set("blocks.0.norm1.weight", bad).unwrap();
        assert_eq!(
            w.first_non_finite().as_deref(),
            Some("blocks.0.norm1.weight")
        );
        let bytes = w.to_safetensors().unwrap();
        let err = GptWeights::from_safetensors(&bytes, DType::F32)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("blocks.0.norm1.weight") && err.contains("not a finite number"),
            "{err}"
        );
    }

    #[test]
    fn moe_fields_on_a_dense_file_say_to_leave_them_unset() {
        for given in [0, 4] {
            let err = config().check_field("experts", Some(given)).unwrap_err();
            assert!(
                matches!(err, WeightsError::Dense { ref field, given: g } if field == "experts" && g == given),
                "{err}"
            );
            let text = err.to_string();
            assert!(
                text.contains("dense") && text.contains("leave it unset"),
                "{text}"
            );
            assert!(!text.contains("make it") && !text.contains("--"), "{text}");
        }
        assert!(config().check_field("d_model", Some(8)).is_ok());
        assert!(config().check_field("d-model", Some(8)).is_err());
    }
}
