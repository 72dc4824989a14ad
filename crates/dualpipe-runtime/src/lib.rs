//! Executes lowered pipeline schedules on real ranks.
//!
//! The runtime knows nothing of tensors: it drives any [`Stage`] (candle layers from
//! `dualpipe-nn`, the [`SleepStage`] of benchmarks, a user's own) through a validated, lowered
//! [`dualpipe_schedule::Schedule`].
//!
//! ```
//! use dualpipe_runtime::{run_step, sum_stage_copies, ExecOptions, SleepCosts, SleepStage};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let schedule = dualpipe_runtime::doc_example_schedule();
//! // `schedule` comes from dualpipe_schedule::build(kind, ranks, micro_batches, virtual_stages).
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
//! measured [`dualpipe_sim::Timeline`], the type the simulator predicts, so the simulator's
//! metrics and renderers apply to real runs too. A stage error, a panic or a message that
//! never arrives stops every rank with one [`RuntimeError`] naming the rank, the op and the
//! cause.
//!
//! For one process per rank (several machines), each process runs its own rank with
//! [`run_rank_step`] on an [`Endpoint`] (over MPI with the `mpi` feature: `mpi_transport`),
//! sums DualPipe's stage copies with [`sum_stage_copies_remote`] and lines up with [`barrier`];
//! messages are stamped with their step and chunk ([`wire`]), and [`LaunchInfo`] reads the
//! launcher's rank and world size. See `docs/distributed.md`.

mod check;
pub mod error;
mod executor;
pub mod grads;
pub mod launch;
pub mod measure;
#[cfg(feature = "mpi")]
pub mod mpi_transport;
pub mod net;
pub mod remote;
pub mod sleep;
pub mod stage;
mod transport;
pub mod wire;
mod worker;

pub use error::RuntimeError;
pub use executor::{
    build_ranks, run_step, try_build_ranks, ExecOptions, MicroBatchLoss, RankStages, StepOutcome,
};
pub use grads::sum_stage_copies;
pub use launch::{LaunchError, LaunchInfo, Launcher};
pub use measure::OpTimes;
pub use net::{Endpoint, Link};
pub use remote::{barrier, run_rank_step, sum_stage_copies_remote, WireStage};
pub use sleep::{SleepCosts, SleepStage};
pub use stage::{ForwardInput, ForwardOutput, Stage, StageError};

/// A tiny lowered two-rank 1F1B-like schedule for the crate's doc example.
#[doc(hidden)]
pub fn doc_example_schedule() -> dualpipe_schedule::Schedule {
    use dualpipe_schedule::{Chunk, Op, Placement, Schedule, ScheduleKind};
    let c = |stage, mb| Chunk::new(0, stage, mb);
    Schedule {
        kind: ScheduleKind::GPipe,
        ranks: 2,
        micro_batches: 2,
        virtual_stages: 1,
        placement: Placement {
            ranks: 2,
            rank_of: vec![vec![0, 1]],
        },
        programs: vec![
            vec![
                Op::F(c(0, 0)),
                Op::SendF {
                    chunk: c(0, 0),
                    peer: 1,
                },
                Op::F(c(0, 1)),
                Op::SendF {
                    chunk: c(0, 1),
                    peer: 1,
                },
                Op::RecvB {
                    chunk: c(0, 0),
                    peer: 1,
                },
                Op::RecvB {
                    chunk: c(0, 1),
                    peer: 1,
                },
                Op::B(c(0, 0)),
                Op::B(c(0, 1)),
            ],
            vec![
                Op::RecvF {
                    chunk: c(1, 0),
                    peer: 0,
                },
                Op::RecvF {
                    chunk: c(1, 1),
                    peer: 0,
                },
                Op::F(c(1, 0)),
                Op::F(c(1, 1)),
                Op::B(c(1, 0)),
                Op::SendB {
                    chunk: c(1, 0),
                    peer: 0,
                },
                Op::B(c(1, 1)),
                Op::SendB {
                    chunk: c(1, 1),
                    peer: 0,
                },
            ],
        ],
    }
}
