//! The parallel machinery beside the model core, which knows no model:
//!
//! - [`experts`]: expert parallelism over a data-parallel group: the expert placement, the
//!   link the group's all-to-alls go over, and the dispatch / combine arithmetic;
//! - [`overlap`]: the FB pair's compute token and its two threads (the forward of one chunk
//!   and the backward of another, overlapping their expert all-to-alls);
//! - [`waits`]: process-wide tallies of where an expert-parallel step's time goes.
//!
//! The MoE layer ([`crate::layers::MoeLayer`]) uses the exchange; the stage box
//! ([`crate::ModelStage`]) runs its FB pairs through [`overlap::run_pair`].

pub mod experts;
pub mod overlap;
pub mod waits;
