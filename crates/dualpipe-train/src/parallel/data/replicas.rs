//! [`LocalReplicas`]: the runner of local replicas, above the trainer: `data_parallel`
//! [`Trainer`]s in this process, each running its pipeline on its own threads,
//! concurrently, joined by in-process channels.

use dualpipe_dp::ChannelTransport;
use dualpipe_schedule::Schedule;

use super::links::{GroupLink, GroupTransport, ReplicaLinks};
use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::step::driver::LocalThreads;
use crate::step::{StepEvent, StepReport, Trainer};
use crate::summary::RunSummary;

/// `data_parallel` replicas of the pipeline in this process (see the [module](self)
/// documentation): replica `d` is a [`Trainer`] whose ranks run on their own threads.
#[derive(Debug)]
pub struct LocalReplicas {
    replicas: Vec<Trainer<LocalThreads>>,
}

impl LocalReplicas {
    /// The replicas of `config` with the schedule it generates.
    pub fn new(config: TrainConfig) -> Result<Self, TrainError> {
        LocalReplicas::build(config, None)
    }

    /// The replicas of `config`, each running `schedule` (checked as
    /// [`Trainer::with_schedule`] does).
    pub fn with_schedule(config: TrainConfig, schedule: Schedule) -> Result<Self, TrainError> {
        LocalReplicas::build(config, Some(schedule))
    }

    /// The replicas of `config` training `workload` (a user's model) instead of the one
    /// `config` describes, each on `schedule` or the one `config` generates.
    pub fn with_workload(
        config: TrainConfig,
        schedule: Option<Schedule>,
        workload: &crate::model::custom::CustomWorkload,
    ) -> Result<Self, TrainError> {
        LocalReplicas::build_of(config, schedule, Some(workload))
    }

    fn build(config: TrainConfig, schedule: Option<Schedule>) -> Result<Self, TrainError> {
        LocalReplicas::build_of(config, schedule, None)
    }

    fn build_of(
        config: TrainConfig,
        schedule: Option<Schedule>,
        workload: Option<&crate::model::custom::CustomWorkload>,
    ) -> Result<Self, TrainError> {
        let replicas = config.parallelism.data_parallel.max(1);
        let mut stage_groups: Vec<_> = (0..config.model_stages())
            .map(|_| ChannelTransport::group(replicas).into_iter())
            .collect();
        let mut loss_group = ChannelTransport::group(replicas).into_iter();
        let mut expert_links =
            crate::parallel::experts::group::links_for(&config, replicas).into_iter();
        let mut trainers = Vec::with_capacity(replicas);
        for replica in 0..replicas {
            let stages = stage_groups
                .iter_mut()
                .enumerate()
                .filter_map(|(s, g)| g.next().map(|t| (s, GroupLink::Messages(Box::new(t)))))
                .collect();
            let losses = loss_group
                .next()
                .map(|t| Box::new(t) as GroupTransport)
                .ok_or_else(|| TrainError::Execution("no loss transport".into()))?;
            let links = ReplicaLinks {
                replica,
                replicas,
                stages,
                losses,
            };
            let mut trainer = match workload {
                Some(w) => Trainer::with_workload(
                    config.clone(),
                    schedule.clone(),
                    LocalThreads,
                    Some(links),
                    crate::Workload::Custom(Box::new(w.clone())),
                )?,
                None => {
                    Trainer::for_replica(config.clone(), schedule.clone(), LocalThreads, links)?
                }
            };
            if let Some(links) = expert_links.next() {
                trainer.join_expert_group(replica, links)?;
            }
            trainers.push(trainer);
        }
        Ok(LocalReplicas { replicas: trainers })
    }

    /// The replicas' trainers (replica 0 first: it evaluates and reports).
    pub fn replicas(&self) -> &[Trainer<LocalThreads>] {
        &self.replicas
    }

    /// Replica `d`'s trainer (e.g. replica 0's [`Trainer::weights`], the same on every
    /// replica).
    pub fn replica_mut(&mut self, d: usize) -> &mut Trainer<LocalThreads> {
        &mut self.replicas[d]
    }

    /// Gives every replica a handle on `writer` (which must expect one part per replica).
    pub fn set_checkpoints(&mut self, writer: &crate::checkpoint::CheckpointWriter) {
        for t in &mut self.replicas {
            if let Some(sink) = writer.sink() {
                t.set_checkpoints(sink);
            }
        }
    }

    /// Stops every replica's checkpoints (so the writer can finish).
    pub fn clear_checkpoints(&mut self) {
        self.replicas
            .iter_mut()
            .for_each(Trainer::clear_checkpoints);
    }

    /// [`Trainer::restore`] on every replica (replica 0's report).
    pub fn restore(
        &mut self,
        checkpoint: &crate::checkpoint::Checkpoint,
    ) -> Result<crate::checkpoint::Restored, TrainError> {
        let mut first = None;
        for t in &mut self.replicas {
            let restored = t.restore(checkpoint)?;
            first.get_or_insert(restored);
        }
        first.ok_or_else(|| TrainError::Execution("no replica".into()))
    }

    /// One step of every replica, concurrently; returns replica 0's report (its losses are
    /// every replica's, in global micro-batch order).
    pub fn step(&mut self) -> Result<StepReport, TrainError> {
        let results = self.on_every_replica(|t, _| t.step());
        first_error(results).map(|mut reports| reports.swap_remove(0))
    }

    /// [`Trainer::run`] on every replica concurrently; `on_step` hears replica 0 (whose
    /// reports carry the global losses). The summary is replica 0's with the exchange's
    /// figures over every worker: `grad_bytes_sent` and `grad_bytes_uncompressed` summed,
    /// `communication_overhead` the mean of the replicas' (processes') shares.
    ///
    /// A replica that fails leaves the others waiting in the exchange until their
    /// `recv_timeout`; the error reported is the first replica's (in replica order) that is
    /// not a timeout of the exchange, if any.
    pub fn run(
        &mut self,
        mut on_step: impl FnMut(StepEvent<'_>) -> Result<(), String>,
    ) -> Result<RunSummary, TrainError> {
        let (first, rest) = self
            .replicas
            .split_first_mut()
            .ok_or_else(|| TrainError::Execution("no replica".into()))?;
        let (head, tail) = std::thread::scope(|scope| {
            let handles: Vec<_> = rest
                .iter_mut()
                .map(|t| scope.spawn(move || t.run(|_| Ok(()))))
                .collect();
            let head = first.run(&mut on_step);
            let tail: Vec<_> = handles.into_iter().map(join).collect();
            (head, tail)
        });
        let mut results = vec![head];
        results.extend(tail);
        // Every replica's summary already holds the figures over every worker; the replicas'
        // rank threads ran at the same time.
        let replicas = self.replicas.len();
        first_error(results).map(|mut summaries| {
            let mut summary = summaries.swap_remove(0);
            summary.rank_threads = summary.rank_threads.saturating_mul(replicas);
            summary
        })
    }

    fn on_every_replica<R: Send>(
        &mut self,
        f: impl Fn(&mut Trainer<LocalThreads>, usize) -> Result<R, TrainError> + Sync,
    ) -> Vec<Result<R, TrainError>> {
        let f = &f;
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .replicas
                .iter_mut()
                .enumerate()
                .map(|(d, t)| scope.spawn(move || f(t, d)))
                .collect();
            handles.into_iter().map(join).collect()
        })
    }
}

fn join<R>(h: std::thread::ScopedJoinHandle<'_, Result<R, TrainError>>) -> Result<R, TrainError> {
    h.join()
        .unwrap_or_else(|_| Err(TrainError::Execution("a replica's thread panicked".into())))
}

/// Every value, or the first error that is not an exchange timeout (else the first error).
fn first_error<R>(results: Vec<Result<R, TrainError>>) -> Result<Vec<R>, TrainError> {
    if results.iter().all(Result::is_ok) {
        return Ok(results.into_iter().filter_map(Result::ok).collect());
    }
    let errors: Vec<TrainError> = results.into_iter().filter_map(Result::err).collect();
    let timed_out = |e: &TrainError| {
        matches!(
            e,
            TrainError::Exchange(dualpipe_dp::DpError::TimedOut { .. })
        )
    };
    let pick = errors.iter().position(|e| !timed_out(e)).unwrap_or(0);
    Err(errors
        .into_iter()
        .nth(pick)
        .unwrap_or_else(|| TrainError::Execution("a replica failed".into())))
}
