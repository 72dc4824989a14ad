//! The simulator: `dualpipe_rs.simulate(...)`, the metrics of `dualpipe simulate --format json`.

use dualpipe_schedule::{Schedule, ScheduleKind};
use dualpipe_sim::report::{report, RunError};
use dualpipe_sim::{simulate as run_simulation, CommCost, CostModel};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::schedule::{parse_kind, size, PySchedule};

/// Simulates a schedule on a uniform cost model and returns the report as a dict.
///
/// `schedule` is a kind name (then `ranks` and `micro_batches` are required) or a `Schedule`.
#[pyfunction]
#[pyo3(signature = (
    schedule, ranks = None, micro_batches = None, virtual_stages = None, *,
    f = 1.0, b = 2.0, w = 1.0, fb = None,
    latency = 0.0, bandwidth = None, message_bytes = 0, blocking_comm = false
))]
#[allow(clippy::too_many_arguments)]
fn simulate<'py>(
    py: Python<'py>,
    schedule: &Bound<'py, PyAny>,
    ranks: Option<i64>,
    micro_batches: Option<i64>,
    virtual_stages: Option<i64>,
    f: f64,
    b: f64,
    w: f64,
    fb: Option<f64>,
    latency: f64,
    bandwidth: Option<f64>,
    message_bytes: u64,
    blocking_comm: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let cost = CostModel::uniform(f, b, w, fb.unwrap_or(f + b)).with_comm(CommCost {
        latency,
        bandwidth,
        message_bytes,
        blocking: blocking_comm,
    });
    let source = ScheduleSource::from_py(schedule, ranks, micro_batches, virtual_stages)?;
    let report_json = py
        .detach(move || -> Result<String, RunError> {
            cost.check()?;
            let built;
            let schedule: &Schedule = match &source {
                ScheduleSource::Built(s) => s,
                ScheduleSource::Kind(kind, ranks, mbs, vs) => {
                    built = dualpipe_schedule::build(*kind, *ranks, *mbs, *vs)?;
                    &built
                }
            };
            let timeline = run_simulation(schedule, &cost)?;
            let r = report(schedule, &timeline, &cost);
            Ok(serde_json::to_string(&r).expect("a report serialises"))
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    py.import("json")?
        .call_method1("loads", (report_json,))?
        .cast_into::<PyDict>()
        .map_err(PyErr::from)
}

/// What to simulate: a schedule object, or a kind and its sizes to build one from.
enum ScheduleSource {
    Built(Schedule),
    Kind(ScheduleKind, usize, usize, usize),
}

impl ScheduleSource {
    fn from_py(
        schedule: &Bound<'_, PyAny>,
        ranks: Option<i64>,
        micro_batches: Option<i64>,
        virtual_stages: Option<i64>,
    ) -> PyResult<Self> {
        if let Ok(s) = schedule.cast::<PySchedule>() {
            if ranks.is_some() || micro_batches.is_some() || virtual_stages.is_some() {
                return Err(PyValueError::new_err(
                    "ranks, micro_batches and virtual_stages come from the Schedule; pass them only with a schedule kind name",
                ));
            }
            let inner = &s.get().inner;
            let lowered = if inner.is_lowered() {
                inner.clone()
            } else {
                dualpipe_schedule::lower(inner)
            };
            return Ok(ScheduleSource::Built(lowered));
        }
        let Ok(name) = schedule.extract::<String>() else {
            return Err(PyTypeError::new_err(format!(
                "schedule must be a schedule kind name (str) or a dualpipe_rs.Schedule, not {}",
                schedule.get_type().name()?
            )));
        };
        let kind = parse_kind(&name)?;
        let (Some(ranks), Some(micro_batches)) = (ranks, micro_batches) else {
            return Err(PyValueError::new_err(format!(
                "simulating '{name}' needs ranks and micro_batches, e.g. simulate('{name}', ranks=4, micro_batches=8)"
            )));
        };
        let vs = match virtual_stages {
            Some(v) => size("virtual_stages", v)?,
            None => kind.default_virtual_stages(),
        };
        Ok(ScheduleSource::Kind(
            kind,
            size("ranks", ranks)?,
            size("micro_batches", micro_batches)?,
            vs,
        ))
    }
}

/// Adds the simulator functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    Ok(())
}
