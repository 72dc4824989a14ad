//! EPLB: `dualpipe_eplb::rebalance_experts` over flat native-endian buffers.
//!
//! The Python wrapper (`dualpipe_rs/eplb.py`) turns any input into a C-contiguous float64
//! array and passes its bytes; the results come back as `bytearray`s of native-endian `i64`
//! that numpy wraps without copying.

use dualpipe_eplb::{rebalance_experts_with_policy, LoadMatrix, Policy};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;

/// Reads native-endian `f64`s from a byte buffer.
pub(crate) fn f64s_from_bytes(bytes: &[u8], what: &str) -> PyResult<Vec<f64>> {
    if !bytes.len().is_multiple_of(8) {
        return Err(PyValueError::new_err(format!(
            "{what}: a buffer of {} bytes is not a whole number of float64 values",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| f64::from_ne_bytes(c.try_into().expect("8-byte chunk")))
        .collect())
}

/// A `bytearray` holding `values` as native-endian `i64`.
pub(crate) fn i64_bytearray<'py>(
    py: Python<'py>,
    values: &[i64],
) -> PyResult<Bound<'py, PyByteArray>> {
    PyByteArray::new_with(py, values.len() * 8, |buf| {
        for (dst, v) in buf.chunks_exact_mut(8).zip(values) {
            dst.copy_from_slice(&v.to_ne_bytes());
        }
        Ok(())
    })
}

/// Parses a policy name (`auto`, `hierarchical`, `global`).
fn parse_policy(policy: &str) -> PyResult<Policy> {
    policy.parse::<Policy>().map_err(PyValueError::new_err)
}

/// The flat outputs of one EPLB run: `(phy2log, log2phy, logcnt, max_replicas)`.
type FlatPlan<'py> = (
    Bound<'py, PyByteArray>,
    Bound<'py, PyByteArray>,
    Bound<'py, PyByteArray>,
    usize,
);

/// Runs DeepSeek's EPLB policy on a `layers x experts` float64 buffer with the GIL released.
#[pyfunction]
#[pyo3(signature = (weight, layers, experts, num_replicas, num_groups, num_nodes, num_gpus, policy = "auto"))]
#[allow(clippy::too_many_arguments)]
fn eplb_rebalance<'py>(
    py: Python<'py>,
    weight: &[u8],
    layers: usize,
    experts: usize,
    num_replicas: usize,
    num_groups: usize,
    num_nodes: usize,
    num_gpus: usize,
    policy: &str,
) -> PyResult<FlatPlan<'py>> {
    let policy = parse_policy(policy)?;
    let data = f64s_from_bytes(weight, "weight")?;
    let plan = py
        .detach(move || {
            let loads = LoadMatrix::from_flat(layers, experts, data)?;
            rebalance_experts_with_policy(
                &loads,
                num_replicas,
                num_groups,
                num_nodes,
                num_gpus,
                policy,
            )
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok((
        i64_bytearray(py, plan.phy2log.as_slice())?,
        i64_bytearray(py, plan.log2phy.as_slice())?,
        i64_bytearray(py, plan.logcnt.as_slice())?,
        plan.max_replicas(),
    ))
}

/// Adds the EPLB functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(eplb_rebalance, m)?)?;
    Ok(())
}
