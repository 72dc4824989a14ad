//! Text forms of a schedule: JSON (lossless, the golden schema) and torch's action CSV.

pub mod csv;
pub mod json;
