//! Schedules: `dualpipe_rs.schedule(kind, ranks, micro_batches, virtual_stages=1)`.

use dualpipe_schedule::{Chunk, Op, Schedule, ScheduleKind};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// A generated, lowered and validated pipeline schedule.
///
/// Built by `dualpipe_rs.schedule(...)`. `programs[rank]` is that rank's ops in execution order,
/// each a dict in the golden JSON schema (`{"op": "F", "dir": 0, "stage": 0, "mb": 0}`, ...).
#[pyclass(name = "Schedule", module = "dualpipe_rs", frozen)]
pub struct PySchedule {
    pub(crate) inner: Schedule,
}

/// Parses a schedule kind name, with the same message as the CLI on a bad one.
pub(crate) fn parse_kind(kind: &str) -> PyResult<ScheduleKind> {
    ScheduleKind::from_name(kind).ok_or_else(|| {
        let names: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
        PyValueError::new_err(format!(
            "unknown schedule kind '{kind}': expected one of {}",
            names.join(", ")
        ))
    })
}

/// Builds (generates, lowers, validates) a schedule with the GIL released.
#[pyfunction]
#[pyo3(signature = (kind, ranks, micro_batches, virtual_stages = 1))]
fn schedule(
    py: Python<'_>,
    kind: &str,
    ranks: usize,
    micro_batches: usize,
    virtual_stages: usize,
) -> PyResult<PySchedule> {
    let kind = parse_kind(kind)?;
    let inner = py
        .detach(|| dualpipe_schedule::build(kind, ranks, micro_batches, virtual_stages))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(PySchedule { inner })
}

fn put_chunk(d: &Bound<'_, PyDict>, c: Chunk) -> PyResult<()> {
    d.set_item("dir", c.dir)?;
    d.set_item("stage", c.stage)?;
    d.set_item("mb", c.mb)
}

fn chunk_dict<'py>(py: Python<'py>, c: Chunk) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    put_chunk(&d, c)?;
    Ok(d)
}

/// One op as a dict in the golden JSON schema.
fn op_dict<'py>(py: Python<'py>, op: &Op) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("op", op.kind().name())?;
    match *op {
        Op::FB { f, b } => {
            d.set_item("f", chunk_dict(py, f)?)?;
            d.set_item("b", chunk_dict(py, b)?)?;
        }
        Op::Wait => {}
        _ => {
            if let Some(c) = op.chunk() {
                put_chunk(&d, c)?;
            }
            if let Some(p) = op.peer() {
                d.set_item("peer", p)?;
            }
        }
    }
    Ok(d)
}

#[pymethods]
impl PySchedule {
    /// The schedule kind's name (`"dualpipe"`, `"1f1b"`, ...).
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind.name()
    }

    /// Number of ranks.
    #[getter]
    fn ranks(&self) -> usize {
        self.inner.ranks
    }

    /// Micro-batches in the step, over all directions.
    #[getter]
    fn micro_batches(&self) -> usize {
        self.inner.micro_batches
    }

    /// Stages per rank per direction (1 except for `interleaved`).
    #[getter]
    fn virtual_stages(&self) -> usize {
        self.inner.virtual_stages
    }

    /// `placement[dir][stage]`: the rank that runs that stage of that direction.
    #[getter]
    fn placement(&self) -> Vec<Vec<usize>> {
        self.inner.placement.rank_of.clone()
    }

    /// How many stage copies (parameter copies) each rank holds.
    #[getter]
    fn parameter_copies(&self) -> Vec<usize> {
        self.inner.placement.parameter_copies()
    }

    /// Every rank's ops in execution order (compute and communication), as dicts.
    #[getter]
    fn programs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for program in &self.inner.programs {
            let row = PyList::empty(py);
            for op in program {
                row.append(op_dict(py, op)?)?;
            }
            out.append(row)?;
        }
        Ok(out)
    }

    /// Every rank's compute ops only (`F`, `B`, `I`, `W`, `FB`), as dicts.
    fn compute_programs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for program in &self.inner.programs {
            let row = PyList::empty(py);
            for op in program.iter().filter(|op| op.is_compute()) {
                row.append(op_dict(py, op)?)?;
            }
            out.append(row)?;
        }
        Ok(out)
    }

    fn __len__(&self) -> usize {
        self.inner.ranks
    }

    fn __repr__(&self) -> String {
        let ops: usize = self.inner.programs.iter().map(Vec::len).sum();
        format!(
            "Schedule(kind='{}', ranks={}, micro_batches={}, virtual_stages={}, ops={})",
            self.inner.kind.name(),
            self.inner.ranks,
            self.inner.micro_batches,
            self.inner.virtual_stages,
            ops
        )
    }
}

/// Adds the schedule functions and class to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySchedule>()?;
    m.add_function(wrap_pyfunction!(schedule, m)?)?;
    Ok(())
}
