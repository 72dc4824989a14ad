//! What a step does beyond one pipeline and its optimizer, each feature in one folder and each
//! a [`Parallelism`](crate::step::parallelism) of the step:
//!
//! - [`data`] — data parallelism: the replicas' gradient exchange and the local replicas;
//! - [`experts`] — the GPT's mixture of experts in training: the expert group, the shards each
//!   worker holds, EPLB re-placement;
//! - [`stages`] — the stage partition, its profile, and re-partitioning while training;
//! - [`builder`] — [`TrainerBuilder`](builder::TrainerBuilder): the one way a trainer is
//!   built, with the parallelisms its configuration asks for.

pub mod builder;
pub mod data;
pub mod experts;
pub mod stages;
