//! Expert-parallel load balancing for Mixture-of-Experts models.
//!
//! [`rebalance_experts`] decides how many replicas each logical expert gets and on which
//! GPU each replica lives, so that the hottest GPU of every MoE layer carries as little load
//! as possible. It reproduces DeepSeek's EPLB (`eplb.py`) index for index: the
//! hierarchical policy (expert groups packed onto nodes, replication within nodes, replicas
//! packed onto GPUs) and the global policy (replication and packing over all GPUs).
//!
//! ```
//! use dualpipe_eplb::{rebalance_experts, LoadMatrix};
//!
//! // 1 layer, 4 experts in 2 groups; 6 replicas on 2 nodes of 1 GPU each.
//! let loads = LoadMatrix::from_rows(vec![vec![40.0, 10.0, 30.0, 20.0]]).unwrap();
//! let plan = rebalance_experts(&loads, 6, 2, 2, 2).unwrap();
//! assert_eq!(plan.phy2log.row(0).len(), 6);
//! assert_eq!(plan.logcnt.row(0).iter().sum::<i64>(), 6);
//! let stats = plan.stats(&loads).unwrap();
//! assert!(stats.after.total.imbalance() <= stats.before.total.imbalance());
//! ```
//!
//! Modules: [`loads`] reads load files (JSON, CSV, NumPy) and predicts a load from a history;
//! [`stats`] measures how balanced a placement is.

mod error;
mod introsort;
pub mod loads;
mod matrix;
mod npy;
mod plan;
mod reference;
pub mod stats;

// Migration-aware planner beyond the reference (docs/eplb-planner.md).
pub mod drift;
pub mod improved;
pub mod migrate;
pub mod moves;
mod packing;
pub mod plan_check;
pub mod planner_io;

pub use error::EplbError;
pub use matrix::{LoadMatrix, Matrix, Tensor3};
pub use plan::{rebalance_experts, rebalance_experts_with_policy, Plan, Policy};
pub use stats::{BalanceStats, LayerBalance, PlanStats};
