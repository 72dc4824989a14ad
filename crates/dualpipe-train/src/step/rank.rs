//! One rank per process: the [`OneRank`] driver and [`RankTrainer`].
//!
//! Each process builds only its own rank's stage copies and talks to the others through an
//! [`Endpoint`] (over MPI with `dualpipe-runtime`'s `mpi` feature, or in memory in tests).
//! The step is the trainer's one step: every process draws the whole batch from the seed (no
//! data moves), runs its rank's program ([`run_rank_step_with`], which also gathers every rank's
//! losses and timeline), exchanges DualPipe's stage-copy gradients
//! ([`sum_stage_copies_remote`], unless the data-parallel exchange sums the copies itself) and
//! steps the optimizer on its copies. The arithmetic and its
//! order are the local trainer's, so the losses are bit-identical to a local run.

use dualpipe_nn::ModelStage;
use dualpipe_runtime::transport::endpoint::NOTICE_GRACE;
use dualpipe_runtime::transport::wire::WireData;
use dualpipe_runtime::{
    all_gather, barrier, run_rank_step_with, sum_stage_copies_remote, Endpoint, ExecOptions, Link,
    RankStages, StepHook, StepOutcome,
};
use dualpipe_schedule::Schedule;

use crate::config::{Field, Naming, TrainConfig};
use crate::error::TrainError;
use crate::step::driver::{Driver, Round};
use crate::step::Trainer;

/// This process is one rank of a world of processes joined by an [`Endpoint`].
#[derive(Debug)]
pub struct OneRank<L> {
    endpoint: Endpoint<L>,
    /// Every process of the job, when `endpoint` joins only this replica's pipeline: the
    /// stop request is agreed over it ([`Driver::agree_stop`]).
    world: Option<Endpoint<L>>,
}

impl<L: Link> OneRank<L> {
    /// The driver of `endpoint`'s rank.
    pub fn new(endpoint: Endpoint<L>) -> Self {
        OneRank {
            endpoint,
            world: None,
        }
    }

    /// The same driver, agreeing on a stop over `world` (every process of a job whose
    /// replicas each run their pipeline on their own endpoint).
    pub fn with_world(mut self, world: Endpoint<L>) -> Self {
        self.world = Some(world);
        self
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.endpoint.rank()
    }
}

/// Trains this process's rank of the pipeline; the other ranks run in other processes.
///
/// Every process of the world connects one with the same [`TrainConfig`] and runs the same
/// steps ([`Trainer::run`], or [`Trainer::step`] then [`Trainer::finish`]).
pub type RankTrainer<L> = Trainer<OneRank<L>>;

impl<L: Link + 'static> Trainer<OneRank<L>> {
    /// Builds the schedule, this rank's stage copies, the data set and the optimizers.
    ///
    /// Fails (and tells the other ranks) if the endpoint's world is not `config.ranks`
    /// processes or the configuration is not usable.
    pub fn connect(config: TrainConfig, endpoint: Endpoint<L>) -> Result<Self, TrainError> {
        Trainer::with_driver(config, None, OneRank::new(endpoint))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.driver().rank()
    }
}

impl<L: Link + 'static> Driver for OneRank<L> {
    fn check(&self, config: &TrainConfig, naming: Naming) -> Result<(), TrainError> {
        let world = self.endpoint.ranks();
        // With data parallelism the endpoint joins one replica's pipeline (its own
        // communicator), so its world is still `ranks` processes.
        if world != config.schedule.ranks {
            return Err(TrainError::Config(format!(
                "{world} processes were started for {} {}; start one process per rank \
                 (mpirun -n {})",
                Field::Ranks.name(naming),
                config.schedule.ranks,
                config.schedule.ranks
            )));
        }
        if config.model.moe.is_some_and(|m| !m.link().is_none())
            && config.parallelism.data_parallel > 1
        {
            return Err(TrainError::Config(
                "the expert link emulation (`moe.link_latency`, `moe.link_bandwidth`) runs on the \
                 in-process links only; drop it, or run without MPI"
                    .into(),
            ));
        }
        Ok(())
    }

    fn held_ranks(&self, _schedule: &Schedule) -> Vec<usize> {
        vec![self.endpoint.rank()]
    }

    fn run_pipeline(
        &mut self,
        schedule: &Schedule,
        stages: &mut [RankStages<ModelStage>],
        step: usize,
        options: &ExecOptions,
        hook: &dyn StepHook<ModelStage>,
    ) -> Result<StepOutcome, TrainError> {
        let [mine] = stages else {
            return Err(TrainError::Execution(format!(
                "one rank per process holds one rank's stages, not {}",
                stages.len()
            )));
        };
        Ok(run_rank_step_with(
            schedule,
            mine,
            &mut self.endpoint,
            step as u64,
            options,
            hook,
        )?)
    }

    fn sum_stage_copies(
        &mut self,
        schedule: &Schedule,
        stages: &mut [RankStages<ModelStage>],
        step: usize,
        options: &ExecOptions,
    ) -> Result<(), TrainError> {
        for mine in stages {
            sum_stage_copies_remote(
                &schedule.placement,
                mine,
                &mut self.endpoint,
                step as u64,
                options.recv_timeout,
            )?;
        }
        Ok(())
    }

    fn all_gather(
        &mut self,
        step: usize,
        round: Round,
        data: Vec<WireData>,
        options: &ExecOptions,
    ) -> Result<Vec<Vec<WireData>>, TrainError> {
        Ok(all_gather(
            &mut self.endpoint,
            step as u64,
            round.index(),
            data,
            options.recv_timeout,
        )?)
    }

    fn agree_stop(
        &mut self,
        step: usize,
        asked: Option<i32>,
        options: &ExecOptions,
    ) -> Result<Option<i32>, TrainError> {
        let endpoint = self.world.as_mut().unwrap_or(&mut self.endpoint);
        let mine = vec![WireData::from_f64s(&[f64::from(asked.unwrap_or(0))])];
        let parts = all_gather(
            endpoint,
            step as u64,
            Round::Stop.index(),
            mine,
            options.recv_timeout,
        )?;
        for part in parts.iter().flatten() {
            let values = part
                .to_f64s()
                .map_err(|e| TrainError::Execution(format!("gathering the stop requests: {e}")))?;
            if let Some(&signal) = values.first().filter(|&&v| v != 0.0) {
                return Ok(Some(signal as i32));
            }
        }
        Ok(None)
    }

    fn reports(&self) -> bool {
        self.endpoint.rank() == 0
    }

    fn fail(&mut self, message: &str) {
        self.endpoint.fail(message, NOTICE_GRACE);
        if let Some(world) = &mut self.world {
            world.fail(message, NOTICE_GRACE);
        }
    }

    fn finish(&mut self, steps_done: usize, options: &ExecOptions) -> Result<(), TrainError> {
        barrier(&mut self.endpoint, steps_done as u64, options.recv_timeout)?;
        Ok(())
    }
}
