//! The planner's partition: `dualpipe_rs._native.plan_partition(profile_json, stages)`.

use dualpipe_plan::{min_max, LiveChunks, Profile, StageSlot};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::schedule::size;

/// Layers per stage of the contiguous partition of the profile's layers (the JSON that
/// `dualpipe plan --profile` reads) over `stages` equal stages whose slowest stage (by the
/// layers' `F + I + W`) is fastest, as `dualpipe plan` cuts a model; memory is not limited.
#[pyfunction]
fn plan_partition(py: Python<'_>, profile_json: &str, stages: i64) -> PyResult<Vec<usize>> {
    let stages = size("stages", stages)?;
    let text = profile_json.to_owned();
    py.detach(move || {
        let profile = Profile::from_json(&text).map_err(|e| e.to_string())?;
        let slots = vec![
            StageSlot {
                speed: 1.0,
                memory: f64::INFINITY,
                live: LiveChunks::uniform(1),
            };
            stages
        ];
        min_max(&profile, &slots)
            .map(|(part, _)| part.sizes())
            .ok_or_else(|| {
                format!(
                    "the profile has {} layers, which cannot be split into {stages} stages of at least one layer",
                    profile.layers.len()
                )
            })
    })
    .map_err(PyValueError::new_err)
}

/// Adds the planner's functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plan_partition, m)?)?;
    Ok(())
}
