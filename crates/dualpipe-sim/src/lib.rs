//! Cost model, event simulation, metrics and renderers for pipeline schedules.

pub mod timeline;

pub use timeline::{ComputeInterval, MessageInterval, MessageKind, Timeline};
