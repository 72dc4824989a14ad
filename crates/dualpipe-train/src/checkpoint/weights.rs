//! A checkpoint's GPT weights alone (`--init-from DIR`): the parameters without the
//! optimizer state, the error feedback or the step.

use std::collections::HashMap;

use dualpipe_nn::gpt::{tensor_names, GptWeights};

use super::{Checkpoint, CheckpointError};
use crate::config::ModelKind;

/// The GPT weights `ckpt` holds, in `dtype` (their architecture is the checkpoint's
/// configuration's).
pub fn gpt_weights(
    ckpt: &Checkpoint,
    dtype: candle_core::DType,
) -> Result<GptWeights, CheckpointError> {
    let saved = &ckpt.state.config;
    if saved.model.kind != ModelKind::Gpt {
        return Err(CheckpointError::Mismatch {
            path: ckpt.path.clone(),
            problem: format!("it holds the {} model, not the GPT", saved.model.kind),
        });
    }
    let config = dualpipe_nn::gpt::GptConfig {
        dtype,
        ..saved.gpt()
    };
    let mut tensors = HashMap::new();
    for (name, _) in tensor_names(&config) {
        let t = ckpt.tensor(&name)?.to_tensor(dtype)?;
        tensors.insert(name, t);
    }
    GptWeights::from_tensors(&config, tensors).map_err(|e| CheckpointError::Mismatch {
        path: ckpt.path.clone(),
        problem: e.to_string(),
    })
}
