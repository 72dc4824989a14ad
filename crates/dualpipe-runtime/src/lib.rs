//! Executes lowered pipeline schedules on real ranks.
//!
//! The runtime knows nothing of tensors: it drives any [`Stage`] (candle layers from
//! `dualpipe-nn`, the [`SleepStage`] of benchmarks, a user's own) through a validated, lowered
//! [`dualpipe_schedule::Schedule`].
//!
//! ```
//! use dualpipe_runtime::{run_step, sum_stage_copies, ExecOptions, SleepCosts, SleepStage};
//! use dualpipe_schedule::{build, ScheduleKind};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let schedule = build(ScheduleKind::DualPipe, 2, 4, 1)?; // generated, lowered, validated
//! let mut ranks = SleepStage::ranks_for(&schedule, SleepCosts::from_millis(1.0, 2.0, 1.0, 2.5));
//! let outcome = run_step(&schedule, &mut ranks, &ExecOptions::default())?;
//! sum_stage_copies(&schedule.placement, &mut ranks)?; // DualPipe: sum the two copies
//! assert_eq!(outcome.losses.len(), schedule.micro_batches);
//! println!("step took {:.3} s", outcome.timeline.makespan());
//! # Ok(())
//! # }
//! ```
//!
//! One thread per rank runs that rank's program ([`run_step`]); tensors cross ranks through
//! in-process channels, keyed by (kind, dir, stage, mb). Every step returns the losses and a
//! measured [`dualpipe_schedule::Timeline`], the type the simulator predicts, so the simulator's
//! metrics and renderers apply to real runs too. A stage error, a panic or a message that
//! never arrives stops every rank with one [`RuntimeError`] naming the rank, the op and the
//! cause.
//!
//! For one process per rank (several machines), each process runs its own rank with
//! [`run_rank_step`] on an [`Endpoint`] (over MPI with the `mpi` feature: `transport::mpi`),
//! sums DualPipe's stage copies with [`sum_stage_copies_remote`] and lines up with [`barrier`];
//! messages are stamped with their step and chunk ([`transport::wire`]), and [`LaunchInfo`]
//! reads the launcher's rank and world size. See `docs/distributed.md`.
//!
//! The modules: [`stage`] (what a stage computes), [`exec`] (the executor: setup check,
//! one rank's interpreter, the threaded and the multi-process step), [`transport`] (how tensors
//! move: in-process channels, or endpoints over a byte link such as MPI), [`grads`] (summing
//! DualPipe's stage copies), [`sleep`] (a stage that only sleeps), [`launch`] (the launcher's
//! rank and world size), [`error`].

#![warn(missing_docs)]

pub mod error;
pub mod exec;
pub mod grads;
pub mod launch;
pub mod sleep;
pub mod stage;
pub mod transport;

pub use error::RuntimeError;
pub use exec::{
    all_gather, barrier, build_ranks, last_weight_ops, run_rank_step, run_rank_step_with, run_step,
    run_step_with, sum_stage_copies_remote, try_build_ranks, ExecOptions, MicroBatchLoss, NoHook,
    RankStages, RankTime, RankTimes, StepHook, StepOutcome, TimeSplit,
};
pub use grads::sum_stage_copies;
pub use launch::{LaunchError, LaunchInfo, Launcher};
pub use sleep::{SleepCosts, SleepStage};
pub use stage::{ForwardInput, ForwardOutput, Stage, StageError, WireStage};
pub use transport::endpoint::{Endpoint, Link};
