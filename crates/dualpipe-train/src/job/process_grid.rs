//! One worker per process under an MPI launcher (`mpirun`, `mpiexec`, `srun`): the process
//! grid's check and this process's [`Trainer`] in it.
//!
//! World rank `w` is pipeline rank `w % ranks` of replica `w / ranks` (docs/distributed.md).
//! With one replica the pipeline runs on the world communicator; with several, each replica's
//! pipeline runs on its own communicator, and each model stage a process holds exchanges
//! gradients over a communicator of its own: without compression MPI's own all-reduce
//! (`MPI_Iallreduce`) over every holder of a copy of the stage in every replica (DualPipe:
//! both copies, `2 D` processes, each adding its own copy), compressed our point-to-point
//! exchange over that pipeline rank in every replica; the losses go over one more. DualPipe
//! compressed: one more per stage and replica joins the stage's two copy holders, the lowest
//! direction's holder sums the copies and only it joins the replicas' exchange
//! (`dualpipe_dp::copies`). A mixture of experts adds its group's links over that pipeline
//! rank in every replica ([`crate::parallel::experts::mpi`]).
//!
//! Checkpoints: every process writes its layers' share ([`checkpoint_share`],
//! [`checkpoint::shared`](crate::checkpoint::shared)); on resume process 0 chooses the
//! checkpoint (verifying it whole, falling back past damaged ones), tells the others
//! ([`agree_resume`]), and each reads only its layers ([`read_share`]); [`restore_agreed`]
//! does the three.

use dualpipe_dp::{Compression, LinkTransport};
use dualpipe_runtime::launch::LaunchInfo;
use dualpipe_runtime::transport::mpi::{MpiLink, MpiWorld};
use dualpipe_runtime::Endpoint;
use dualpipe_schedule::Schedule;

use crate::checkpoint::{shared, Checkpoint, Share};
use crate::config::DType;
use crate::parallel::data::{GroupLink, GroupTransport, ReplicaLinks};
use crate::step::driver::Driver;
use crate::{OneRank, Restored, TrainConfig, TrainError, Trainer};

/// Checks that the launcher started one process per worker of `config`'s grid
/// (`ranks x data_parallel`); the error names the count to start.
pub fn check_grid(info: &LaunchInfo, config: &TrainConfig) -> Result<(), TrainError> {
    let replicas = config.parallelism.data_parallel;
    if replicas <= 1 {
        return info
            .check_world(config.schedule.ranks)
            .map_err(|e| TrainError::Config(e.to_string()));
    }
    let workers = config.schedule.ranks.saturating_mul(replicas);
    if info.world_size != workers {
        return Err(TrainError::Config(format!(
            "{} processes were started for `ranks` {} x `data_parallel` {replicas} = {workers} \
             workers; start {workers} (mpiexec -n {workers})",
            info.world_size, config.schedule.ranks
        )));
    }
    Ok(())
}

/// Refuses checkpoints (`checkpointing`: written or read) of an expert-parallel run over
/// several replicas: each replica stores other experts of a block, and the shared checkpoint
/// gives a block one file, written by one process.
pub fn check_checkpoints(config: &TrainConfig, checkpointing: bool) -> Result<(), TrainError> {
    if checkpointing
        && config.parallelism.data_parallel > 1
        && config.model.moe.is_some_and(|m| m.expert_parallel)
    {
        return Err(TrainError::Config(
            "checkpoints of an expert-parallel run are written in one process only for now \
             (under MPI the replicas' experts of a block would share its file); drop \
             `checkpoint.dir` and `checkpoint.resume`, or run without MPI"
                .into(),
        ));
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
    if config.parallelism.data_parallel <= 1 {
        let driver = OneRank::new(Endpoint::new(world.link()));
        return Trainer::with_driver(config.clone(), given, driver);
    }
    let info = world.info();
    let (replica, p) = (
        info.rank / config.schedule.ranks,
        info.rank % config.schedule.ranks,
    );
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
    let splits = (0..config.schedule.ranks)
        .map(|r| held(r).len())
        .max()
        .unwrap_or(0);
    let mine = held(p);
    let group = |link: MpiLink| -> Result<GroupTransport, TrainError> {
        let t = LinkTransport::new(link, (0..config.parallelism.data_parallel).collect())
            .map_err(|e| TrainError::Config(format!("the data-parallel group: {e}")))?;
        Ok(Box::new(t))
    };
    // How many copies of each model stage the placement holds, and whether no rank holds
    // two copies of one stage (MPI's sum takes one copy per process).
    let mut copies = vec![0usize; config.model_stages()];
    let mut one_copy_per_rank = true;
    for r in 0..config.schedule.ranks {
        let all = schedule.placement.stages_of(r).len();
        one_copy_per_rank &= held(r).len() == all;
        for (_, s) in schedule.placement.stages_of(r) {
            copies[s] += 1;
        }
    }
    // With expert parallelism, DualPipe's two copies of a block (on two ranks) sum their
    // routed experts' gradients before the holders do: the point-to-point exchange, which
    // sums the copies first, runs instead of MPI's sum over every copy.
    let expert_copies =
        config.model.moe.is_some_and(|m| m.expert_parallel) && copies.iter().any(|&c| c > 1);
    let native = config.transport.mpi_allreduce
        && config.parallelism.gradient_compression == Compression::None
        && one_copy_per_rank
        && !expert_copies;
    // Our exchange with DualPipe's copies of a stage in two processes of a replica: the copies
    // are summed inside it (the lowest direction's holder leads, dualpipe_dp::copies). Under
    // 1-bit Adam, whose momentum is folded from the copies' sum after the pipeline, the copies
    // are summed first and the lead alone exchanges its copy (presummed; before, both holders
    // exchanged the same sum: twice the bytes). Not for a placement whose holders list a stage
    // at different places, or with expert parallelism, whose routed experts the dense exchange
    // does not carry: summed after it.
    // The split of round i joins a stage's holders only if each lists the stage i-th.
    let same_place = (0..config.model_stages()).all(|s| {
        let mut places = (0..schedule.placement.dirs()).map(|d| {
            held(schedule.placement.rank(d, s))
                .iter()
                .position(|&h| h == s)
        });
        let first = places.next().flatten();
        places.all(|at| at == first)
    });
    let paired = !native
        && one_copy_per_rank
        && same_place
        && copies.iter().any(|&c| c > 1)
        && !expert_copies;
    let model_stages = config.model_stages();
    let mut stages = Vec::new();
    for i in 0..splits {
        if native {
            // Round i: every process's i-th held stage (a stage's holders list it at the same
            // place; the group's size is checked), or a colour of its own if it holds fewer.
            let color = mine.get(i).copied().unwrap_or(config.model_stages() + p);
            let sum = world.split_sum(color);
            if let Some(&s) = mine.get(i) {
                let want = copies[s] * config.parallelism.data_parallel;
                if sum.size() != want {
                    return Err(TrainError::Config(format!(
                        "stage {s}'s MPI group has {} processes, not the {want} that hold a \
                         copy of it: run this placement with --no-mpi-allreduce (the \
                         point-to-point exchange)",
                        sum.size()
                    )));
                }
                let link = match config.model.dtype.master() {
                    DType::F64 => GroupLink::SumF64(Box::new(sum)),
                    _ => GroupLink::SumF32(Box::new(sum)),
                };
                stages.push((s, link));
            }
        } else {
            let link = world.split_link(p);
            // Round i's copy holders of one stage in one replica (a stage's holders list it at
            // the same place), or a colour of its own.
            let pair = paired.then(|| {
                world.split_link(match mine.get(i) {
                    Some(&s) => replica * model_stages + s,
                    None => model_stages * config.parallelism.data_parallel + info.rank,
                })
            });
            if let Some(&s) = mine.get(i) {
                let holders: Vec<usize> = (0..schedule.placement.dirs())
                    .map(|d| schedule.placement.rank(d, s))
                    .collect();
                let g = match pair {
                    Some(pair) if holders.len() > 1 => copy_link(link, pair, &holders, p, group)?,
                    _ => GroupLink::Messages(group(link)?),
                };
                stages.push((s, g));
            }
        }
    }
    let losses = group(world.split_link(p))?;
    let experts = crate::parallel::experts::mpi::expert_links(world, config, p)?;
    let links = ReplicaLinks {
        replica,
        replicas: config.parallelism.data_parallel,
        stages,
        losses,
    };
    // The whole world too, for the replicas to agree on a stop (a signal) at one boundary.
    let driver = OneRank::new(Endpoint::new(pipeline)).with_world(Endpoint::new(world.link()));
    let mut trainer = Trainer::for_replica(config.clone(), given, driver, links)?;
    if let Some(experts) = experts {
        trainer.join_expert_group(replica, experts)?;
    }
    Ok(trainer)
}

/// The group of pipeline rank `p`'s copy of a stage held by `holders` (pipeline ranks, by
/// direction, one copy each): `pair` joins the holders (ranked in world order, so by pipeline
/// rank), `link` the same pipeline rank in every replica. The lowest direction's holder leads.
fn copy_link(
    link: MpiLink,
    pair: MpiLink,
    holders: &[usize],
    p: usize,
    group: impl Fn(MpiLink) -> Result<GroupTransport, TrainError>,
) -> Result<GroupLink, TrainError> {
    let mut by_rank = holders.to_vec();
    by_rank.sort_unstable();
    let members = holders
        .iter()
        .map(|h| by_rank.binary_search(h).unwrap_or(0))
        .collect();
    let copies: GroupTransport = Box::new(
        LinkTransport::new(pair, members)
            .map_err(|e| TrainError::Config(format!("a stage's copy holders: {e}")))?,
    );
    Ok(if holders.first() == Some(&p) {
        GroupLink::Lead {
            replicas: group(link)?,
            copies,
        }
    } else {
        GroupLink::Partner(copies)
    })
}

/// This process's share of the checkpoints of the job on `world`: its place, and the job's
/// number (process 0's, broadcast). Collective: every process calls it.
pub fn checkpoint_share(world: &MpiWorld) -> Share {
    let info = world.info();
    let mine =
        (u64::from(std::process::id()) << 32) | u64::from(crate::checkpoint::writer::nonce());
    Share {
        process: info.rank,
        processes: info.world_size,
        job: world.broadcast_u64(mine),
        wait: shared::DEFAULT_WAIT,
    }
}

/// The checkpoint process 0 chose to resume from, as every process learns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeChoice {
    /// No checkpoint: a fresh run.
    Fresh,
    /// The checkpoint of this step.
    Step(usize),
    /// Process 0 could not open one (it reports why; the others stop quietly).
    Failed,
}

const FRESH: u64 = u64::MAX;
const FAILED: u64 = u64::MAX - 1;

/// Tells every process process 0's `choice` (the others' is ignored). Collective: every
/// process calls it.
pub fn agree_resume(world: &MpiWorld, choice: ResumeChoice) -> ResumeChoice {
    let code = match choice {
        ResumeChoice::Fresh => FRESH,
        ResumeChoice::Failed => FAILED,
        ResumeChoice::Step(s) => s as u64,
    };
    match world.broadcast_u64(code) {
        FRESH => ResumeChoice::Fresh,
        FAILED => ResumeChoice::Failed,
        s => ResumeChoice::Step(usize::try_from(s).unwrap_or(usize::MAX)),
    }
}

/// Reads checkpoint `step` of `path` (a checkpoint's own directory, or a checkpoint
/// directory: [`step_dir`](crate::checkpoint::step_dir)) for `trainer`: only the files of
/// the layers it holds, its error feedback and the state, each verified.
pub fn read_share<D: Driver>(
    trainer: &Trainer<D>,
    path: &std::path::Path,
    step: usize,
) -> Result<Checkpoint, TrainError> {
    let dir = crate::checkpoint::step_dir(path, step);
    Ok(Checkpoint::read_files(&dir, |f| {
        trainer.needs_checkpoint_file(f)
    })?)
}

/// Restores `trainer` from the checkpoint process 0 chose (`chosen`; the other processes pass
/// `Ok(None)`): process 0 tells the others its step ([`agree_resume`]) and each of them reads
/// only its layers from `source` ([`read_share`]). `Ok(None)`: a fresh run. A failure on
/// process 0 is its own error; the others get a [`TrainError::Config`] to leave quietly by.
/// Collective: every process calls it.
pub fn restore_agreed<D: Driver>(
    world: &MpiWorld,
    trainer: &mut Trainer<D>,
    chosen: Result<Option<Checkpoint>, TrainError>,
    source: Option<&std::path::Path>,
) -> Result<Option<(Checkpoint, Restored)>, TrainError> {
    let choice = match &chosen {
        Ok(Some(c)) => ResumeChoice::Step(c.state.step),
        Ok(None) => ResumeChoice::Fresh,
        Err(_) => ResumeChoice::Failed,
    };
    let agreed = agree_resume(world, choice);
    let checkpoint = match (chosen?, agreed) {
        (Some(c), _) => c,
        (None, ResumeChoice::Step(step)) => {
            let Some(path) = source else {
                return Ok(None);
            };
            read_share(trainer, path, step)?
        }
        (None, ResumeChoice::Fresh) => return Ok(None),
        (None, ResumeChoice::Failed) => {
            return Err(TrainError::Config(
                "process 0 could not open the checkpoint".into(),
            ))
        }
    };
    let restored = trainer.restore(&checkpoint)?;
    Ok(Some((checkpoint, restored)))
}
