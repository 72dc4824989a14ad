//! The GPT's mixture of experts in training, one module for the concept:
//!
//! - [`group`] — MoE over the data-parallel group ([`group::ExpertGroup`]): counts summed over
//!   replicas, expert parallelism (all-to-all dispatch and combine);
//! - [`shards`] — which routed experts a worker holds, their gradients and checkpoints;
//! - [`eplb`] — EPLB in training ([`eplb::ExpertRebalancer`]): re-placing experts from the
//!   router counts;
//! - `mpi` (feature `mpi`) — the experts' all-to-alls over MPI.
//!
//! The settings are the configuration's ([`MoeSettings`]) and the per-step figures the
//! summary's ([`ExpertLoad`], `expert_load_imbalance` in the JSON; [`ExpertWaits`]), both
//! re-exported here; the experts as a parallelism of the step are `parallelism`.

pub mod eplb;
pub mod group;
#[cfg(feature = "mpi")]
pub mod mpi;
pub(crate) mod parallelism;
pub mod shards;

pub use crate::config::moe::MoeSettings;
pub use crate::summary::experts::{sum_by_layer, ExpertLoad, ExpertWaits, WaitMean};
