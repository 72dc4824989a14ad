//! Expert-parallel load balancing for Mixture-of-Experts models.
//!
//! [`plan`] is the one call: it validates the loads and the [`Layout`], runs a [`Planner`]
//! (the improved, migration-aware policy, or DeepSeek's EPLB index for index), lists the
//! expert moves from a previous [`PreviousPlacement`], and returns a [`PlanOutcome`] that a
//! [`PlanReport`] renders as JSON or as a table.
//!
//! [`rebalance_experts`] is the reference's own four-number entry point: how many replicas
//! each logical expert gets and on which GPU each replica lives, equal, index for index, to
//! DeepSeek's EPLB (`eplb.py`): the hierarchical policy (expert groups packed onto nodes,
//! replication within nodes, replicas packed onto GPUs) and the global policy (replication and
//! packing over all GPUs).
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
//! [`stats`] measures how balanced a placement is; [`improved`] is the migration-aware policy;
//! [`moves`] turns two placements into scheduled transfers; [`plan_check`] validates outputs.

#![warn(missing_docs)]

mod balance;
mod error;
mod introsort;
mod layout;
pub mod loads;
mod matrix;
mod npy;
mod plan;
mod previous;
mod reference;
mod report;
pub mod stats;

// Migration-aware planner beyond the reference (docs/eplb-planner.md).
pub mod improved;
pub mod migrate;
pub mod moves;
mod packing;
pub mod plan_check;

pub use balance::{
    check_expert_bytes, plan, rebalance_experts, rebalance_experts_with_policy, PlanOutcome,
    Planner,
};
pub use error::EplbError;
pub use layout::{Layout, MAX_LOAD, MAX_LOG2PHY, MAX_SLOTS};
pub use matrix::{LoadMatrix, Matrix, Tensor3};
pub use plan::{ExpertPlan, Policy};
pub use previous::PreviousPlacement;
pub use report::{move_summary, PlanReport};
pub use stats::{BalanceStats, LayerBalance, PlanStats};
