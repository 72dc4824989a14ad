//! The pipeline's stages: the partition of the model's layers into stages ([`partition`]), its
//! measured profile ([`profile`]), and re-partitioning while training ([`rebalance`], as a
//! parallelism of the step).

pub(crate) mod parallelism;
pub mod partition;
pub mod profile;
pub mod rebalance;
