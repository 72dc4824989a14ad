//! One worker per process under an MPI launcher (`mpirun`, `mpiexec`, `srun`): the process
//! grid's check and this process's [`Trainer`] in it.
//!
//! World rank `w` is pipeline rank `w % ranks` of replica `w / ranks` (docs/distributed.md).
//! With one replica the pipeline runs on the world communicator; with several, each replica's
//! pipeline runs on its own communicator, each model stage a process holds exchanges gradients
//! over a communicator of that pipeline rank in every replica, and the losses over one more.

use dualpipe_dp::LinkTransport;
use dualpipe_runtime::launch::LaunchInfo;
use dualpipe_runtime::transport::mpi::{MpiLink, MpiWorld};
use dualpipe_runtime::Endpoint;
use dualpipe_schedule::Schedule;

use crate::data_parallel::{GroupTransport, ReplicaLinks};
use crate::{OneRank, TrainConfig, TrainError, Trainer};

/// Checks that the launcher started one process per worker of `config`'s grid
/// (`ranks x data_parallel`); the error names the count to start.
pub fn check_grid(info: &LaunchInfo, config: &TrainConfig) -> Result<(), TrainError> {
    let replicas = config.data_parallel;
    if replicas <= 1 {
        return info
            .check_world(config.ranks)
            .map_err(|e| TrainError::Config(e.to_string()));
    }
    let workers = config.ranks.saturating_mul(replicas);
    if info.world_size != workers {
        return Err(TrainError::Config(format!(
            "{} processes were started for --ranks {} x --data-parallel {replicas} = {workers} \
             workers; start {workers} (mpiexec -n {workers})",
            info.world_size, config.ranks
        )));
    }
    Ok(())
}

/// This process's trainer in the grid of `config` ([`check_grid`] first). `given`: a schedule
/// to run instead of the configuration's generated one. Every process must call this with the
/// same arguments: the communicator splits are collective.
pub fn mpi_trainer(
    world: &MpiWorld,
    config: &TrainConfig,
    given: Option<Schedule>,
) -> Result<Trainer<OneRank<MpiLink>>, TrainError> {
    if config.data_parallel <= 1 {
        let driver = OneRank::new(Endpoint::new(world.link()));
        return Trainer::with_driver(config.clone(), given, driver);
    }
    let info = world.info();
    let (replica, p) = (info.rank / config.ranks, info.rank % config.ranks);
    // Every split is collective: every process makes the same calls in the same order.
    let pipeline = world.split_link(replica);
    let schedule = match &given {
        Some(s) => s.clone(),
        None => config.build_schedule()?,
    };
    let held = |r: usize| {
        let mut stages: Vec<usize> = schedule
            .placement
            .stages_of(r)
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        stages.sort_unstable();
        stages.dedup();
        stages
    };
    let splits = (0..config.ranks).map(|r| held(r).len()).max().unwrap_or(0);
    let mine = held(p);
    let group = |link: MpiLink| -> Result<GroupTransport, TrainError> {
        let t = LinkTransport::new(link, (0..config.data_parallel).collect())
            .map_err(|e| TrainError::Config(format!("the data-parallel group: {e}")))?;
        Ok(Box::new(t))
    };
    let mut stages = Vec::new();
    for i in 0..splits {
        let link = world.split_link(p);
        if let Some(&s) = mine.get(i) {
            stages.push((s, group(link)?));
        }
    }
    let losses = group(world.split_link(p))?;
    let links = ReplicaLinks {
        replica,
        replicas: config.data_parallel,
        stages,
        losses,
    };
    let driver = OneRank::new(Endpoint::new(pipeline));
    Trainer::for_replica(config.clone(), given, driver, links)
}
