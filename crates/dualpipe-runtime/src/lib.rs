//! Executes lowered pipeline schedules on real ranks.
//!
//! The runtime knows nothing of tensors: it drives any [`Stage`] (candle layers from
//! `dualpipe-nn`, sleeping test stages, a user's own) through a validated, lowered
//! [`dualpipe_schedule::Schedule`].

pub mod stage;

pub use stage::{ForwardInput, ForwardOutput, Stage, StageError};
