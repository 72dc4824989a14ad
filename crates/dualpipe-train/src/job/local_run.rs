//! [`LocalRun`]: a run whose every rank is a thread of this process, one pipeline
//! ([`Trainer`]) or, with `data_parallel > 1`, its replicas ([`LocalReplicas`]), behind one set
//! of calls, so that a caller writes the local run once.

use dualpipe_schedule::Schedule;

use crate::checkpoint::CheckpointWriter;
use crate::parallel::stages::rebalance::Repartition;
use crate::{
    Checkpoint, LocalReplicas, LocalThreads, Restored, RunSummary, StepEvent, TrainConfig,
    TrainError, Trainer,
};

/// One pipeline, or `data_parallel` replicas of it, every rank on a thread of this process.
pub enum LocalRun {
    /// One pipeline (`data_parallel` is 1).
    One(Box<Trainer<LocalThreads>>),
    /// `data_parallel` replicas of the pipeline.
    Replicas(LocalReplicas),
}

impl LocalRun {
    /// The run of `config`, on `schedule` (checked as [`Trainer::with_schedule`] does) or on
    /// the schedule `config` generates.
    pub fn new(config: TrainConfig, schedule: Option<Schedule>) -> Result<Self, TrainError> {
        let replicated = config.parallelism.data_parallel > 1;
        Ok(match (replicated, schedule) {
            (false, None) => LocalRun::One(Box::new(Trainer::new(config)?)),
            (false, Some(s)) => LocalRun::One(Box::new(Trainer::with_schedule(config, s)?)),
            (true, None) => LocalRun::Replicas(LocalReplicas::new(config)?),
            (true, Some(s)) => LocalRun::Replicas(LocalReplicas::with_schedule(config, s)?),
        })
    }

    /// The trainer that reports: the pipeline, or replica 0 (whose weights every replica
    /// shares).
    pub fn lead(&mut self) -> &mut Trainer<LocalThreads> {
        match self {
            LocalRun::One(t) => t,
            LocalRun::Replicas(r) => r.replica_mut(0),
        }
    }

    /// The schedule every pipeline runs.
    pub fn schedule(&self) -> &Schedule {
        match self {
            LocalRun::One(t) => t.schedule(),
            LocalRun::Replicas(r) => r.replicas()[0].schedule(),
        }
    }

    /// The parts of each checkpoint: one per replica.
    pub fn checkpoint_parts(&self) -> usize {
        match self {
            LocalRun::One(_) => 1,
            LocalRun::Replicas(r) => r.replicas().len(),
        }
    }

    /// [`Trainer::restore`] on every pipeline (the first one's report).
    pub fn restore(&mut self, checkpoint: &Checkpoint) -> Result<Restored, TrainError> {
        match self {
            LocalRun::One(t) => t.restore(checkpoint),
            LocalRun::Replicas(r) => r.restore(checkpoint),
        }
    }

    /// Hands every pipeline a handle on `writer`, which must expect
    /// [`LocalRun::checkpoint_parts`] parts.
    pub fn set_checkpoints(&mut self, writer: &CheckpointWriter) {
        match self {
            LocalRun::One(t) => {
                if let Some(sink) = writer.sink() {
                    t.set_checkpoints(sink);
                }
            }
            LocalRun::Replicas(r) => r.set_checkpoints(writer),
        }
    }

    /// Stops the run at a step boundary when `source` asks (see [`crate::step::stop`]).
    pub fn set_stop(&mut self, source: crate::step::stop::StopSource) {
        match self {
            LocalRun::One(t) => t.set_stop(crate::StopRequest::new(source, false)),
            LocalRun::Replicas(r) => {
                let lead = crate::StopRequest::new(source, true);
                for d in 0..r.replicas().len() {
                    let request = if d == 0 {
                        lead.clone()
                    } else {
                        lead.follower()
                    };
                    r.replica_mut(d).set_stop(request);
                }
            }
        }
    }

    /// Stops every pipeline's checkpoints (so the writer can finish).
    pub fn clear_checkpoints(&mut self) {
        match self {
            LocalRun::One(t) => t.clear_checkpoints(),
            LocalRun::Replicas(r) => r.clear_checkpoints(),
        }
    }

    /// [`Trainer::run`] or [`LocalReplicas::run`].
    pub fn run(
        &mut self,
        on_step: impl FnMut(StepEvent<'_>) -> Result<(), String>,
    ) -> Result<RunSummary, TrainError> {
        match self {
            LocalRun::One(t) => t.run(on_step),
            LocalRun::Replicas(r) => r.run(on_step),
        }
    }

    /// The stage re-partitionings of the run (of the lead pipeline).
    pub fn repartitions(&self) -> &[Repartition] {
        match self {
            LocalRun::One(t) => t.repartitions(),
            LocalRun::Replicas(r) => r.replicas()[0].repartitions(),
        }
    }
}
