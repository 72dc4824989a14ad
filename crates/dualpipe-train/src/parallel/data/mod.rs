//! Data parallelism: `data_parallel` replicas of the whole pipeline, each training on its own
//! share of the global batch, their gradients averaged per model stage before the optimizer.
//!
//! - [`ReplicaExchange`] ([`exchange`], below the trainer: what one replica does with its
//!   gradients; [`links`]: its groups' ends) — one replica's end of the exchange: per model stage it holds, a
//!   [`GradExchange`] over the stage's data-parallel group (the same stage in every replica),
//!   or under MPI without compression a [`NativeExchange`] on MPI's own all-reduce over every
//!   copy of the stage ([`GroupLink`]), plus a small uncompressed exchange that gathers every
//!   replica's micro-batch losses so each replica reports the global step loss;
//! - [`ExchangeHook`] ([`hook`]) — the executor's [`StepHook`]: on the rank's own thread, as soon as
//!   every copy of a stage this process holds has run its last weight-gradient op, it sums the
//!   copies and starts the stage's buckets, and it makes progress on them between ops;
//! - [`LocalReplicas`] ([`replicas`], above the trainer) — the local backend: `data_parallel` [`Trainer`]s, one per replica, each
//!   running its pipeline on its own threads, concurrently, joined by in-process channels
//!   ([`ChannelTransport`]).
//!
//! The step of a replica: its pipeline (micro-batch losses scaled by `1 / micro_batches`, so
//! a replica's gradient is the mean over its micro-batches), during which, with
//! [`TrainConfig::overlap`], each stage's exchange starts as soon as its gradients are final
//! (DualPipe's two copies summed first, in direction order, as `sum_stage_copies` does); after
//! it the step waits for the exchanges (the mean over replicas: the global-batch mean), then
//! clips and steps the optimizer. Where the process does not hold every copy of its stages
//! (DualPipe with one rank per process), MPI's all-reduce needs no sum first (each copy joins
//! it), and on point-to-point groups the holder of the lowest direction's copy leads: the
//! other copy's holder sends it its copy from its hook, the lead sums them in direction order
//! and starts the replicas' exchange of the sum from its own hook, then sends the result back
//! ([`GroupLink::Lead`], [`GroupLink::Partner`], `dualpipe_dp::copies`). Under 1-bit Adam
//! (the momentum is folded after the pipeline) the copies are summed and every exchange
//! started after the pipeline; without overlap (`--no-overlap`) one stage's plain all-reduce
//! follows another after the pipeline. See `docs/distributed.md`.

pub mod exchange;
mod grads;
pub mod hook;
pub mod links;
mod parallelism;
pub mod replicas;

pub use exchange::{ReplicaExchange, StepExchange};
pub use hook::ExchangeHook;
pub use links::{GroupLink, GroupTransport, ReplicaLinks};
pub use replicas::LocalReplicas;
