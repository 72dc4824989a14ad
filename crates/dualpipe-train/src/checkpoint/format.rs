//! The checkpoint's contents on disk: tensors copied to host memory ([`HostTensor`]), the
//! file each tensor goes to (by model layer), the safetensors encoding, `state.json`
//! ([`CheckpointState`]) and `manifest.json` ([`Manifest`]).

use std::borrow::Cow;
use std::collections::BTreeMap;

use candle_core::{Device, Tensor};
use safetensors::tensor::{Dtype, View};
use serde::{Deserialize, Serialize};

use super::CheckpointError;
use crate::config::{DType, TrainConfig};

/// `format` of the manifest and of `state.json`.
pub const FORMAT: &str = "dualpipe-checkpoint";
/// The format's version.
pub const VERSION: u32 = 1;
/// The manifest's file name (written last).
pub const MANIFEST: &str = "manifest.json";
/// The state's file name.
pub const STATE: &str = "state.json";
/// The error-feedback file's name.
pub const FEEDBACK_FILE: &str = "feedback.safetensors";
/// How every error-feedback file's name begins ([`FEEDBACK_FILE`] of a one-process run, and
/// `feedback-WWWW.safetensors`, one per worker, of a multi-process one).
pub const FEEDBACK_PREFIX: &str = "feedback";
/// What an optimizer-state tensor's name adds to its parameter's: `{param}.optim.{m,v,momentum}`.
pub const OPTIM_INFIX: &str = ".optim.";

/// A tensor copied out of the model into host memory (little-endian bytes), so a background
/// thread can write it while training goes on.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Its name in the checkpoint.
    pub name: String,
    /// Element type (f32 or f64: mixed precision keeps f32 master weights).
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// The values' little-endian bytes.
    pub data: Vec<u8>,
}

fn candle_error(what: &str, e: candle_core::Error) -> CheckpointError {
    CheckpointError::Writer(format!("copying {what}: {e}"))
}

impl HostTensor {
    /// A copy of `tensor` (f32 or f64) under `name`.
    pub fn from_tensor(name: String, tensor: &Tensor) -> Result<Self, CheckpointError> {
        let flat = tensor.flatten_all().map_err(|e| candle_error(&name, e))?;
        let (dtype, data) = match tensor.dtype() {
            candle_core::DType::F32 => {
                let v = flat.to_vec1::<f32>().map_err(|e| candle_error(&name, e))?;
                (DType::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect())
            }
            candle_core::DType::F64 => {
                let v = flat.to_vec1::<f64>().map_err(|e| candle_error(&name, e))?;
                (DType::F64, v.iter().flat_map(|x| x.to_le_bytes()).collect())
            }
            other => {
                return Err(CheckpointError::Writer(format!(
                    "{name} is {other:?}; checkpoints hold f32 and f64"
                )))
            }
        };
        Ok(HostTensor {
            name,
            dtype,
            shape: tensor.dims().to_vec(),
            data,
        })
    }

    /// A one-dimensional f64 tensor of `values`.
    pub fn from_f64s(name: String, values: &[f64]) -> Self {
        HostTensor {
            name,
            dtype: DType::F64,
            shape: vec![values.len()],
            data: values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// Values in the tensor.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every value is a finite number (no infinity, no NaN).
    pub fn is_finite(&self) -> bool {
        match self.dtype {
            DType::F32 | DType::Bf16 | DType::F16 => self
                .data
                .chunks_exact(4)
                .all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()),
            DType::F64 => self
                .data
                .chunks_exact(8)
                .all(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])).is_finite()),
        }
    }

    /// The values as f64 (exact for f32).
    pub fn to_f64s(&self) -> Vec<f64> {
        match self.dtype {
            DType::F32 | DType::Bf16 | DType::F16 => self
                .data
                .chunks_exact(4)
                .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
            DType::F64 => self
                .data
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                .collect(),
        }
    }

    /// A candle tensor of these values in `dtype` (converted when it differs).
    pub fn to_tensor(&self, dtype: candle_core::DType) -> Result<Tensor, CheckpointError> {
        let bad = |e: candle_core::Error| CheckpointError::Writer(format!("{}: {e}", self.name));
        let t = match self.dtype {
            DType::F32 | DType::Bf16 | DType::F16 => {
                let v: Vec<f32> = self
                    .data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                Tensor::from_vec(v, self.shape.as_slice(), &Device::Cpu).map_err(bad)?
            }
            DType::F64 => Tensor::from_vec(self.to_f64s(), self.shape.as_slice(), &Device::Cpu)
                .map_err(bad)?,
        };
        t.to_dtype(dtype).map_err(bad)
    }
}

impl View for &HostTensor {
    fn dtype(&self) -> Dtype {
        match self.dtype {
            DType::F32 | DType::Bf16 | DType::F16 => Dtype::F32,
            DType::F64 => Dtype::F64,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// The file a tensor goes to, by model layer: `blocks.{l}.…` → `block-{l:04}.safetensors`,
/// the embeddings → `embedding.safetensors`, the final norm and the head →
/// `head.safetensors`, error feedback → [`FEEDBACK_FILE`]; anything else → `other.safetensors`.
pub fn file_of(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("blocks.") {
        if let Some(l) = rest.split('.').next().and_then(|l| l.parse::<usize>().ok()) {
            return format!("block-{l:04}.safetensors");
        }
    }
    if name.starts_with("feedback.") {
        return FEEDBACK_FILE.into();
    }
    if name.starts_with("tok_emb.") || name.starts_with("pos_emb.") {
        return "embedding.safetensors".into();
    }
    if name.starts_with("norm_f.") || name.starts_with("lm_head.") {
        return "head.safetensors".into();
    }
    "other.safetensors".into()
}

/// The name of parameter `param`'s optimizer-state tensor `part` (`m`, `v`, `momentum`).
pub fn optim_name(param: &str, part: &str) -> String {
    format!("{param}{OPTIM_INFIX}{part}")
}

/// The name of an error-feedback buffer: `feedback.stage{s}.replica{d}.bucket{b}.{worker|server}`.
pub fn feedback_name(stage: usize, replica: usize, bucket: usize, server: bool) -> String {
    let side = if server { "server" } else { "worker" };
    format!("feedback.stage{stage}.replica{replica}.bucket{bucket}.{side}")
}

/// Groups `tensors` into their files ([`file_of`]) and encodes each as safetensors (tensors
/// sorted by name: the same state always gives the same bytes).
pub fn encode_files(tensors: &[HostTensor]) -> Result<Vec<(String, Vec<u8>)>, CheckpointError> {
    let mut files: BTreeMap<String, Vec<&HostTensor>> = BTreeMap::new();
    for t in tensors {
        files.entry(file_of(&t.name)).or_default().push(t);
    }
    files
        .into_iter()
        .map(|(file, mut items)| {
            items.sort_by(|a, b| a.name.cmp(&b.name));
            let bytes =
                safetensors::serialize(items.into_iter().map(|t| (t.name.as_str(), t)), None)
                    .map_err(|e| CheckpointError::Writer(format!("encoding {file}: {e}")))?;
            Ok((file, bytes))
        })
        .collect()
}

/// Decodes one safetensors file of a checkpoint into its tensors.
pub fn decode_file(bytes: &[u8], file: &str) -> Result<Vec<HostTensor>, String> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| format!("{file}: {e}"))?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        let dtype = match view.dtype() {
            Dtype::F32 => DType::F32,
            Dtype::F64 => DType::F64,
            other => {
                return Err(format!(
                    "{file}: tensor {name} is {other:?}, not f32 or f64"
                ))
            }
        };
        out.push(HostTensor {
            name,
            dtype,
            shape: view.shape().to_vec(),
            data: view.data().to_vec(),
        });
    }
    Ok(out)
}

/// The schedule a checkpoint was written under.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleShape {
    /// Its kind (`"dualpipe"`, `"1f1b"`, ...).
    pub kind: String,
    /// Pipeline ranks.
    pub ranks: usize,
    /// Micro-batches per step (per replica).
    pub micro_batches: usize,
    /// Stages per rank (interleaved).
    pub virtual_stages: usize,
    /// Model stages along one pipeline.
    pub model_stages: usize,
}

/// Where the data stream stands: the next step's batches are drawn from `seed` and global
/// micro-batch indices only, so this is all a resumed run needs to draw the same ones.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    /// The data's seed.
    pub seed: u64,
    /// The next step's index (0-based; equal to the steps done).
    pub next_step: usize,
    /// Global micro-batches per step (over every replica).
    pub global_micro_batches: usize,
}

/// `state.json`: everything beside the tensors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// Steps done when it was taken.
    pub step: usize,
    /// The run's configuration.
    pub config: TrainConfig,
    /// The schedule's shape.
    pub schedule: ScheduleShape,
    /// Steps every optimizer has taken.
    pub optimizer_steps: u64,
    /// The data position.
    pub data: DataPosition,
    /// The random streams: every draw of the model, the data and the compression is keyed by
    /// (seed, step, micro-batch or bucket), so the seed and the step restore them all.
    pub rng: String,
    /// The f16 loss scale after the step (absent but under f16 mixed precision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<crate::step::loss_scale::LossScale>,
}

impl CheckpointState {
    /// The state of a run of `config` on `schedule` after `step` steps.
    pub fn new(config: &TrainConfig, schedule: ScheduleShape, step: usize) -> Self {
        CheckpointState {
            format: FORMAT.into(),
            version: VERSION,
            step,
            config: config.clone(),
            schedule,
            optimizer_steps: step as u64,
            data: DataPosition {
                seed: config.seed,
                next_step: step,
                global_micro_batches: config.schedule.micro_batches
                    * config.parallelism.data_parallel.max(1),
            },
            rng: format!(
                "counter-based: every stream is keyed by (seed {}, step, index)",
                config.seed
            ),
            loss_scale: None,
        }
    }
}

/// One file of a checkpoint, as the manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// The file's name inside the checkpoint directory.
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its CRC-32 (IEEE), as 8 hex digits.
    pub crc32: String,
}

/// `manifest.json`: written last, so a checkpoint without one is incomplete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// Steps done when it was taken.
    pub step: usize,
    /// Every other file of the checkpoint.
    pub files: Vec<FileEntry>,
    /// The run that wrote it (absent in checkpoints of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunIdentity>,
}

/// The name of the first tensor of `tensors` (in name order) that holds a value that is not a
/// finite number, if any: such weights are never published as a checkpoint.
pub fn first_non_finite<'a>(tensors: impl IntoIterator<Item = &'a HostTensor>) -> Option<&'a str> {
    tensors
        .into_iter()
        .filter(|t| !t.is_finite())
        .map(|t| t.name.as_str())
        .min()
}

/// Who wrote a checkpoint: the run's random identifier (kept by `--resume`, new for every
/// fresh run) and what the run trained on, so a checkpoint directory is owned by one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunIdentity {
    /// A random identifier, 16 hex digits, drawn when the run started fresh.
    pub id: String,
    /// The run's seed.
    pub seed: u64,
    /// The synthetic task, or `data` when the run trains on a file.
    pub task: String,
    /// The training file's size and CRC-32 (`BYTES:CRC`), when the run trains on a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_digest: Option<String>,
}

impl RunIdentity {
    /// A fresh run's identity: a new random identifier with `seed`, `task` and the data digest.
    pub fn fresh(seed: u64, task: String, data_digest: Option<String>) -> Self {
        RunIdentity {
            id: random_id(),
            seed,
            task,
            data_digest,
        }
    }
}

/// 16 random hex digits (the standard library's per-process random hash keys, the clock and
/// the process id mixed).
pub fn random_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", h.finish())
}

/// The size and CRC-32 of the training text at `path` (`BYTES:CRC`), read in pieces through
/// the one input path ([`dualpipe_io::open_regular`]: a FIFO or a device is refused, never
/// blocking; at most [`dualpipe_io::limits::DATA`]).
pub fn file_digest(path: &std::path::Path) -> Result<String, dualpipe_io::ReadError> {
    use std::io::Read;
    let what = "the training text";
    let mut file = dualpipe_io::open_regular(path, dualpipe_io::limits::DATA, what)?;
    let failed = |e: std::io::Error| dualpipe_io::ReadError::Io {
        what: what.into(),
        path: path.into(),
        reason: dualpipe_io::os_reason(&e),
    };
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes: u64 = 0;
    loop {
        let n = file.read(&mut buf).map_err(failed)?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok(format!("{bytes}:{:08x}", hasher.finalize()))
}

/// The CRC-32 of `bytes`, as the manifest writes it.
pub fn crc32_hex(bytes: &[u8]) -> String {
    format!("{:08x}", crc32fast::hash(bytes))
}

impl Manifest {
    /// The manifest of `files` (name, bytes) at `step`.
    pub fn of(step: usize, files: &[(String, Vec<u8>)]) -> Self {
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            step,
            files: files
                .iter()
                .map(|(name, bytes)| FileEntry {
                    name: name.clone(),
                    bytes: bytes.len() as u64,
                    crc32: crc32_hex(bytes),
                })
                .collect(),
            run: None,
        }
    }

    /// The same manifest, written by `run`.
    pub fn by(self, run: Option<RunIdentity>) -> Self {
        Manifest { run, ..self }
    }

    /// The total size of the files it lists.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_named_by_model_layer() {
        assert_eq!(
            file_of("blocks.12.attn.qkv.weight"),
            "block-0012.safetensors"
        );
        assert_eq!(
            file_of(&optim_name("blocks.3.up.bias", "m")),
            "block-0003.safetensors"
        );
        assert_eq!(file_of("tok_emb.weight"), "embedding.safetensors");
        assert_eq!(file_of("lm_head.weight.optim.v"), "head.safetensors");
        assert_eq!(file_of(&feedback_name(2, 1, 0, true)), FEEDBACK_FILE);
    }

    #[test]
    fn tensors_round_trip_through_the_files_bit_for_bit() {
        let t = Tensor::new(
            &[[1.5f32, -0.0], [f32::MIN_POSITIVE, 3.0e-40]],
            &Device::Cpu,
        )
        .unwrap();
        let a = HostTensor::from_tensor("blocks.0.up.weight".into(), &t).unwrap();
        let b = HostTensor::from_f64s("blocks.0.up.bias".into(), &[0.1, -2.0]);
        let files = encode_files(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files, encode_files(&[b.clone(), a.clone()]).unwrap());
        let back = decode_file(&files[0].1, &files[0].0).unwrap();
        assert!(back.contains(&a) && back.contains(&b));
        let again = a.to_tensor(candle_core::DType::F32).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        assert_eq!(bits(&again), bits(&t));
        assert!(decode_file(&files[0].1[..files[0].1.len() - 3], "x").is_err());
    }

    #[test]
    fn the_manifest_hashes_every_file() {
        let files = vec![("a".to_string(), b"abc".to_vec())];
        let m = Manifest::of(7, &files);
        assert_eq!(m.files[0].crc32, "352441c2");
        assert_eq!(m.bytes(), 3);
    }
}
