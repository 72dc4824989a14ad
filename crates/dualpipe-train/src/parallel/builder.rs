//! [`TrainerBuilder`]: the one way a [`Trainer`] is built. It assembles the trainer's stages
//! and optimizers (`Trainer::assemble`), then adds the parallelisms the configuration asks
//! for, in the order they act (data parallelism when this trainer is one replica, the MoE
//! experts, stage re-partitioning), then the caller's own ([`TrainerBuilder::parallelism`]).
//! [`Trainer::new`] and the other constructors are shorthands for it.

use dualpipe_schedule::Schedule;

use crate::config::{Field, Naming, TrainConfig};
use crate::error::TrainError;
use crate::model::Workload;
use crate::parallel::data::{ReplicaExchange, ReplicaLinks};
use crate::parallel::experts::parallelism::Experts;
use crate::parallel::stages::parallelism::Repartitioning;
use crate::step::driver::{Driver, LocalThreads};
use crate::step::{Parallelism, Trainer};

/// Builds a [`Trainer`]: the configuration, and optionally a prebuilt schedule, a driver
/// (where the ranks run; every rank on a thread of this process by default), a replica's
/// exchange ends, a model other than the one the configuration describes, and parallelisms of
/// the caller's own.
#[derive(Debug)]
pub struct TrainerBuilder<D: Driver = LocalThreads> {
    config: TrainConfig,
    schedule: Option<Schedule>,
    driver: D,
    links: Option<ReplicaLinks>,
    workload: Option<Workload>,
    added: Vec<Box<dyn Parallelism<D>>>,
}

impl TrainerBuilder<LocalThreads> {
    /// A trainer of `config` with every rank on a thread of this process.
    pub fn new(config: TrainConfig) -> Self {
        TrainerBuilder::with_driver(config, LocalThreads)
    }
}

impl<D: Driver> TrainerBuilder<D> {
    /// A trainer of `config` whose ranks run where `driver` says (e.g.
    /// [`OneRank`](crate::OneRank): this process is one rank).
    pub fn with_driver(config: TrainConfig, driver: D) -> Self {
        Self::from_parts(config, None, driver, None, None)
    }

    fn from_parts(
        config: TrainConfig,
        schedule: Option<Schedule>,
        driver: D,
        links: Option<ReplicaLinks>,
        workload: Option<Workload>,
    ) -> Self {
        TrainerBuilder {
            config,
            schedule,
            driver,
            links,
            workload,
            added: Vec::new(),
        }
    }

    /// Runs `schedule` (e.g. one read from a file and validated) instead of the one the
    /// configuration generates: it must be lowered and validated, and match the configuration
    /// in kind, ranks, micro-batches and stages per pipeline.
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = Some(schedule);
        self
    }

    /// Makes the trainer replica `links.replica` of a data-parallel run (see
    /// [`LocalReplicas`](crate::LocalReplicas), which builds every replica of a local run):
    /// its data share and exchange ends.
    pub fn replica(mut self, links: ReplicaLinks) -> Self {
        self.links = Some(links);
        self
    }

    /// Trains `workload` (e.g. a user's model, [`Workload::Custom`]) instead of the one the
    /// configuration describes.
    pub fn workload(mut self, workload: Workload) -> Self {
        self.workload = Some(workload);
        self
    }

    /// Adds `parallelism`: it acts at every point of the step after the crate's own.
    pub fn parallelism(mut self, parallelism: impl Parallelism<D>) -> Self {
        self.added.push(Box::new(parallelism));
        self
    }

    /// Builds the schedule, the stage copies of the ranks the driver holds, the data set, the
    /// optimizers and the parallelisms. On failure the driver tells the other ranks, if any.
    pub fn build(self) -> Result<Trainer<D>, TrainError> {
        let TrainerBuilder {
            config,
            schedule,
            driver,
            links,
            workload,
            added,
        } = self;
        let mut trainer = Trainer::assemble(config, schedule, driver, workload)?;
        if let Err(err) = add_parallelisms(&mut trainer, links, added) {
            trainer.driver.fail(&err.to_string());
            return Err(err);
        }
        Ok(trainer)
    }
}

/// The parallelisms of `trainer`'s configuration, in the order they act, then `added`.
fn add_parallelisms<D: Driver>(
    trainer: &mut Trainer<D>,
    links: Option<ReplicaLinks>,
    added: Vec<Box<dyn Parallelism<D>>>,
) -> Result<(), TrainError> {
    let config = &trainer.config;
    match links {
        Some(links) => {
            let exchange = ReplicaExchange::new(
                config,
                links,
                &trainer.schedule.placement,
                &mut trainer.stages,
            )?;
            trainer.replica = exchange.replica();
            trainer.replicated = true;
            trainer.push_parallelism(Box::new(exchange));
        }
        None if config.parallelism.data_parallel > 1 => {
            return Err(TrainError::Config(format!(
                "{} {}: a Trainer holds one replica; build the replicas with \
                 LocalReplicas::new",
                Field::DataParallel.name(Naming::Fields),
                config.parallelism.data_parallel
            )))
        }
        None => {}
    }
    if trainer.config.model.moe.is_some() {
        trainer.push_parallelism(Box::new(Experts::default()));
    }
    if trainer.config.parallelism.rebalance.is_some() {
        let replicated = trainer.replicated;
        trainer.push_parallelism(Box::new(Repartitioning::new(replicated)));
    }
    for parallelism in added {
        trainer.push_parallelism(parallelism);
    }
    Ok(())
}

impl Trainer<LocalThreads> {
    /// The builder of a trainer of `config`, every rank on a thread of this process
    /// ([`TrainerBuilder::new`]).
    pub fn builder(config: TrainConfig) -> TrainerBuilder<LocalThreads> {
        TrainerBuilder::new(config)
    }

    /// Every rank on a thread of this process, with the schedule `config` generates
    /// (`dualpipe_schedule::build`): `Trainer::builder(config).build()`.
    pub fn new(config: TrainConfig) -> Result<Self, TrainError> {
        TrainerBuilder::new(config).build()
    }

    /// Every rank on a thread of this process, running `schedule` (see
    /// [`TrainerBuilder::schedule`]).
    pub fn with_schedule(config: TrainConfig, schedule: Schedule) -> Result<Self, TrainError> {
        TrainerBuilder::new(config).schedule(schedule).build()
    }
}

impl<D: Driver> Trainer<D> {
    /// The ranks `driver` holds, with `schedule` or the one `config` generates
    /// ([`TrainerBuilder::with_driver`]).
    pub fn with_driver(
        config: TrainConfig,
        schedule: Option<Schedule>,
        driver: D,
    ) -> Result<Self, TrainError> {
        TrainerBuilder::from_parts(config, schedule, driver, None, None).build()
    }

    /// Replica `links.replica` of a data-parallel run ([`TrainerBuilder::replica`]).
    pub fn for_replica(
        config: TrainConfig,
        schedule: Option<Schedule>,
        driver: D,
        links: ReplicaLinks,
    ) -> Result<Self, TrainError> {
        TrainerBuilder::from_parts(config, schedule, driver, Some(links), None).build()
    }

    /// [`Trainer::with_driver`] or [`Trainer::for_replica`] (with `links`) training
    /// `workload` (e.g. a user's model, [`Workload::Custom`]) instead of the one `config`
    /// describes ([`TrainerBuilder::workload`]).
    pub fn with_workload(
        config: TrainConfig,
        schedule: Option<Schedule>,
        driver: D,
        links: Option<ReplicaLinks>,
        workload: Workload,
    ) -> Result<Self, TrainError> {
        TrainerBuilder::from_parts(config, schedule, driver, links, Some(workload)).build()
    }
}
