//! EPLB: `dualpipe_eplb::rebalance_experts` over flat native-endian buffers.
//!
//! The Python wrapper (`dualpipe_rs/eplb.py`) turns any input into a C-contiguous float64
//! array and passes its bytes; the results come back as `bytearray`s of native-endian `i64`
//! that numpy wraps without copying.

use dualpipe_eplb::{
    plan, rebalance_experts_with_policy, Layout, LoadMatrix, Planner, Policy, PreviousPlacement,
};
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

/// Reads native-endian `i64`s from a byte buffer as expert indices.
fn indices_from_bytes(bytes: &[u8], what: &str) -> PyResult<Vec<usize>> {
    if !bytes.len().is_multiple_of(8) {
        return Err(PyValueError::new_err(format!(
            "{what}: a buffer of {} bytes is not a whole number of int64 values",
            bytes.len()
        )));
    }
    bytes
        .chunks_exact(8)
        .map(|c| {
            let v = i64::from_ne_bytes(c.try_into().expect("8-byte chunk"));
            usize::try_from(v).map_err(|_| {
                PyValueError::new_err(format!(
                    "{what} holds expert index {v}; expert indices are >= 0"
                ))
            })
        })
        .collect()
}

/// Runs the migration-aware planner (`dualpipe_eplb::plan` with the improved policy, the same
/// call as `dualpipe eplb`) with the GIL released;
/// `previous` is the last `phy2log` (`layers x replicas` int64 buffer) or `None`.
/// Returns `((phy2log, log2phy, logcnt, max_replicas), moved_replicas)`.
#[pyfunction]
#[pyo3(signature = (weight, layers, experts, num_replicas, num_groups, num_nodes, num_gpus, previous = None))]
#[allow(clippy::too_many_arguments)]
fn eplb_rebalance_improved<'py>(
    py: Python<'py>,
    weight: &[u8],
    layers: usize,
    experts: usize,
    num_replicas: usize,
    num_groups: usize,
    num_nodes: usize,
    num_gpus: usize,
    previous: Option<&[u8]>,
) -> PyResult<(FlatPlan<'py>, usize)> {
    let data = f64s_from_bytes(weight, "weight")?;
    // The same shape checks (and messages) as the reference policy.
    let loads = LoadMatrix::from_flat(layers, experts, data)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let prev = previous
        .map(|bytes| indices_from_bytes(bytes, "previous"))
        .transpose()?;
    if let Some(p) = &prev {
        if p.len() != layers * num_replicas {
            return Err(PyValueError::new_err(format!(
                "previous must be the phy2log of the last plan, [layers, num_replicas] = [{layers}, {num_replicas}]; it holds {} values",
                p.len()
            )));
        }
    }
    let layout = Layout::new(experts, num_replicas, num_groups, num_nodes, num_gpus);
    let outcome = py
        .detach(move || {
            let previous = prev.map(|p| {
                PreviousPlacement::from_rows(
                    p.chunks(num_replicas.max(1))
                        .map(<[usize]>::to_vec)
                        .collect(),
                )
            });
            plan(&loads, &layout, &Planner::default(), previous.as_ref(), 0)
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let moved = outcome.moves.as_ref().map_or(0, |m| m.moves.len());
    let plan = &outcome.plan;
    let flat = (
        i64_bytearray(py, plan.phy2log.as_slice())?,
        i64_bytearray(py, plan.log2phy.as_slice())?,
        i64_bytearray(py, plan.logcnt.as_slice())?,
        plan.max_replicas(),
    );
    Ok((flat, moved))
}

/// Adds the EPLB functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(eplb_rebalance, m)?)?;
    m.add_function(wrap_pyfunction!(eplb_rebalance_improved, m)?)?;
    Ok(())
}
