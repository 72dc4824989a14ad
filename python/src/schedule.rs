//! Schedules: `dualpipe_rs.schedule(kind, ranks, micro_batches, virtual_stages=1)`.

use dualpipe_schedule::format::{csv, json};
use dualpipe_schedule::ir::UnknownScheduleKind;
use dualpipe_schedule::{Chunk, Op, Schedule, ScheduleError, ScheduleKind};
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

/// Parses a schedule kind name; a bad one is a `ValueError` listing the kinds.
pub(crate) fn parse_kind(kind: &str) -> PyResult<ScheduleKind> {
    kind.parse()
        .map_err(|e: UnknownScheduleKind| PyValueError::new_err(e.to_string()))
}

/// A size argument as `usize`: a negative one is a `ValueError` naming the argument.
pub(crate) fn size(name: &str, value: i64) -> PyResult<usize> {
    usize::try_from(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a non-negative integer, got {value}"
        ))
    })
}

/// A schedule error as a `ValueError` carrying the crate's message, an unsupported
/// configuration naming each setting as this function's keyword argument (`ranks=2`).
fn value_error(e: ScheduleError) -> PyErr {
    let text = match e {
        ScheduleError::InvalidConfig(e) => e.render(|knob, value| match value {
            Some(v) => format!("{}={v}", knob.field()),
            None => knob.field().to_string(),
        }),
        other => other.to_string(),
    };
    PyValueError::new_err(text)
}

/// Builds (generates, lowers, validates) a schedule with the GIL released.
#[pyfunction]
#[pyo3(signature = (kind, ranks, micro_batches, virtual_stages = None))]
fn schedule(
    py: Python<'_>,
    kind: &str,
    ranks: i64,
    micro_batches: i64,
    virtual_stages: Option<i64>,
) -> PyResult<PySchedule> {
    let kind = parse_kind(kind)?;
    let ranks = size("ranks", ranks)?;
    let micro_batches = size("micro_batches", micro_batches)?;
    let virtual_stages = match virtual_stages {
        Some(v) => size("virtual_stages", v)?,
        None => kind.default_virtual_stages(),
    };
    let inner = py
        .detach(|| dualpipe_schedule::build(kind, ranks, micro_batches, virtual_stages))
        .map_err(value_error)?;
    Ok(PySchedule { inner })
}

/// Writes a chunk's fields; `"dir"` only for two-direction schedules, as the JSON form does.
fn put_chunk(d: &Bound<'_, PyDict>, c: Chunk, with_dir: bool) -> PyResult<()> {
    if with_dir {
        d.set_item("dir", c.dir)?;
    }
    d.set_item("stage", c.stage)?;
    d.set_item("mb", c.mb)
}

fn chunk_dict<'py>(py: Python<'py>, c: Chunk, with_dir: bool) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    put_chunk(&d, c, with_dir)?;
    Ok(d)
}

/// One op as a dict in the golden JSON schema.
fn op_dict<'py>(py: Python<'py>, op: &Op, with_dir: bool) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("op", op.kind().name())?;
    match *op {
        Op::FB { f, b } => {
            d.set_item("f", chunk_dict(py, f, with_dir)?)?;
            d.set_item("b", chunk_dict(py, b, with_dir)?)?;
        }
        Op::Wait => {}
        _ => {
            if let Some(c) = op.chunk() {
                put_chunk(&d, c, with_dir)?;
            }
            if let Some(p) = op.peer() {
                d.set_item("peer", p)?;
            }
        }
    }
    Ok(d)
}

impl PySchedule {
    /// Every rank's ops (those passing `keep`) as lists of dicts.
    fn program_dicts<'py>(
        &self,
        py: Python<'py>,
        keep: impl Fn(&Op) -> bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let with_dir = self.inner.placement.dirs() > 1;
        let out = PyList::empty(py);
        for program in &self.inner.programs {
            let row = PyList::empty(py);
            for op in program.iter().filter(|op| keep(op)) {
                row.append(op_dict(py, op, with_dir)?)?;
            }
            out.append(row)?;
        }
        Ok(out)
    }
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

    /// Every rank's ops in execution order (compute and communication), as dicts in the
    /// golden JSON schema: the `"programs"` of `to_json()`.
    #[getter]
    fn programs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.program_dicts(py, |_| true)
    }

    /// Every rank's compute ops only (`F`, `B`, `I`, `W`, `FB`), as dicts.
    fn compute_programs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.program_dicts(py, Op::is_compute)
    }

    /// Every rank's compute actions as torch.distributed.pipelining writes them (`"0F3"`,
    /// `"7I2"`, `"(0F7;7B3)OVERLAP_F_B"`): the cells of `to_torch_csv()`.
    #[getter]
    fn actions(&self) -> Vec<Vec<String>> {
        csv::to_string(&self.inner)
            .lines()
            .map(|line| {
                if line.is_empty() {
                    Vec::new()
                } else {
                    line.split(',').map(str::to_owned).collect()
                }
            })
            .collect()
    }

    /// The schedule as one line of JSON in the golden schema (lossless; `from_json` reads it).
    fn to_json(&self) -> String {
        json::to_string(&self.inner)
    }

    /// The compute-only CSV that torch.distributed.pipelining loads: one line per rank, one
    /// action per cell.
    fn to_torch_csv(&self) -> String {
        csv::to_string(&self.inner)
    }

    /// Reads a schedule from JSON in the golden schema and validates it.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<PySchedule> {
        let text = text.to_owned();
        let inner = py
            .detach(move || json::from_str(&text))
            .map_err(value_error)?;
        Ok(PySchedule { inner })
    }

    /// Reads a compute-only torch CSV and validates it; `kind` names the schedule family
    /// (inferred from the actions when omitted). Communication is added as `schedule()` does.
    #[staticmethod]
    #[pyo3(signature = (text, kind = None))]
    fn from_torch_csv(py: Python<'_>, text: &str, kind: Option<&str>) -> PyResult<PySchedule> {
        let kind = kind.map(parse_kind).transpose()?;
        let text = text.to_owned();
        let inner = py
            .detach(move || {
                let compute_only = csv::from_str(&text, kind)?;
                let lowered = dualpipe_schedule::lower(&compute_only);
                dualpipe_schedule::validate(&lowered)?;
                Ok::<_, ScheduleError>(lowered)
            })
            .map_err(value_error)?;
        Ok(PySchedule { inner })
    }

    /// Simulates this schedule; the keywords and the result are those of `dualpipe_rs.simulate`.
    #[pyo3(signature = (**cost))]
    fn simulate<'py>(
        slf: &Bound<'py, Self>,
        cost: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("dualpipe_rs._native")?
            .getattr("simulate")?
            .call((slf,), cost)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PySchedule>()
            .is_ok_and(|o| o.get().inner == self.inner)
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
