//! The executor: interprets a lowered schedule's programs against real stages.
//!
//! * [`types`]: what every executor shares: [`RankStages`], [`ExecOptions`], [`StepOutcome`].
//! * [`cpu`]: thread CPU time against wall time: [`RankTimes`] splits idle time into
//!   message waits (the bubble) and core waits.
//! * `check`: before anything runs, that the schedule and the stages fit together.
//! * `worker`: one rank's interpreter, op by op, over any transport.
//! * [`hook`]: [`StepHook`], told on each rank's thread when a stage's gradients are final.
//! * [`threads`]: [`run_step`], every rank on its own thread of this process.
//! * [`process`]: [`run_rank_step`], this process's rank over an
//!   [`Endpoint`](crate::transport::endpoint::Endpoint); the gradient exchange of DualPipe's
//!   stage copies and a barrier over the same endpoint; `report` is the per-rank summary a step
//!   exchanges.

mod check;
pub mod cpu;
pub mod hook;
pub mod process;
mod report;
pub mod threads;
pub mod types;
mod worker;

pub use cpu::{RankTime, RankTimes, TimeSplit};
pub use hook::{last_weight_ops, NoHook, StepHook};
pub use process::{
    all_gather, barrier, run_rank_step, run_rank_step_with, sum_stage_copies_remote,
};
pub use threads::{run_step, run_step_with};
pub use types::{
    build_ranks, try_build_ranks, ExecOptions, MicroBatchLoss, RankStages, StepOutcome,
};
