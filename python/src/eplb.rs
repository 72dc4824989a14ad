//! EPLB bindings (filled in once the crate exposes its API).

use pyo3::prelude::*;

/// Adds the EPLB functions to the module.
pub(crate) fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
