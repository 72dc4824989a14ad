//! Cost model, event simulation, metrics and renderers for pipeline schedules.
//!
//! ```
//! # use dualpipe_schedule::{Chunk, Op, StagePlacement, Schedule, ScheduleKind};
//! use dualpipe_sim::{metrics, simulate, CostModel};
//! // Two ranks, one micro-batch, a two-stage pipeline.
//! let c0 = Chunk::new(0, 0, 0);
//! let c1 = Chunk::new(0, 1, 0);
//! let schedule = Schedule {
//!     kind: ScheduleKind::OneFOneB,
//!     ranks: 2,
//!     micro_batches: 1,
//!     virtual_stages: 1,
//!     placement: StagePlacement { ranks: 2, rank_of: vec![vec![0, 1]] },
//!     programs: vec![
//!         vec![Op::F(c0), Op::SendF { chunk: c0, peer: 1 }, Op::RecvB { chunk: c0, peer: 1 }, Op::B(c0)],
//!         vec![Op::RecvF { chunk: c1, peer: 0 }, Op::F(c1), Op::B(c1), Op::SendB { chunk: c1, peer: 0 }],
//!     ],
//! };
//! let cost = CostModel::uniform(1.0, 2.0, 1.0, 3.0);
//! let timeline = simulate(&schedule, &cost).unwrap();
//! let m = metrics(&timeline, &schedule.placement);
//! assert_eq!(m.makespan, 6.0);
//! assert_eq!(m.bubble_per_rank, vec![3.0, 3.0]);
//! ```

#![warn(missing_docs)]

pub mod ascii;
pub mod cost;
pub mod error;
pub mod formula;
pub mod measure;
pub mod metrics;
pub mod recompute;
pub mod report;
pub mod simulate;
pub mod svg;
pub mod topology;
pub mod trace;

pub use cost::{CommCost, CostModel, ExpertComm, PairChunkCost, StageCost};
pub use dualpipe_schedule::timeline::{ComputeInterval, MessageInterval, MessageKind, Timeline};
pub use error::SimError;
pub use measure::{OpTally, OpTimes};
pub use metrics::{metrics, Metrics};
pub use recompute::{peak_activation_bytes, ChunkBytes, Recompute};
pub use simulate::simulate;
pub use topology::{Link, LinkClass, Links, Network, Topology};
