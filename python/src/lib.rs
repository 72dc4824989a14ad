//! `dualpipe_rs._native`: the compiled half of the `dualpipe_rs` Python package.
//!
//! The pure-Python half (`python/dualpipe_rs/`) converts user inputs (lists, numpy arrays, torch
//! tensors) to plain buffers and wraps the results; this module does the work with the GIL
//! released. Errors of the Rust crates arrive as `ValueError` carrying the crate's message, the
//! same text the `dualpipe` CLI prints after `error: ` (where a message names a setting by its
//! field in backquotes, `` `policy` ``, the CLI names it by its flag, `--policy`).

#![warn(missing_docs)]

use pyo3::prelude::*;

mod eplb;
mod plan;
mod schedule;
mod sim;

/// The compiled module. Not meant to be imported directly: use `dualpipe_rs`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    schedule::register(m)?;
    eplb::register(m)?;
    sim::register(m)?;
    plan::register(m)?;
    Ok(())
}
