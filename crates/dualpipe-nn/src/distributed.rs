//! Training with one process per pipeline rank: [`RankTrainer`] and the wire codec of
//! [`MlpStage`]'s candle tensors.
//!
//! Each process builds only its own rank's stage copies and talks to the others through an
//! [`Endpoint`] (over MPI with `dualpipe-runtime`'s `mpi` feature, or in memory in tests).
//! A step is the same as [`Trainer::step`](crate::Trainer::step)'s: the step's batch (every
//! process draws the whole batch from the seed, so no data moves), the rank's program
//! ([`run_rank_step`], which also gathers every rank's losses and timeline), the DualPipe
//! gradient exchange between a stage's two copies ([`sum_stage_copies_remote`]) and the
//! optimizer on the rank's copies. The arithmetic and its order are the local trainer's, so
//! the losses are bit-identical to a [`Trainer`](crate::Trainer) run with the same
//! configuration.

use std::time::Instant;

use candle_core::{DType as CDType, Device, Tensor};
use dualpipe_runtime::net::Link;
use dualpipe_runtime::wire::{WireDType, WireData, WireError};
use dualpipe_runtime::{
    barrier, run_rank_step, sum_stage_copies_remote, Endpoint, ExecOptions, RankStages, WireStage,
};
use dualpipe_schedule::Schedule;

use crate::data::DataSet;
use crate::error::NnError;
use crate::optim::Optimizer;
use crate::stage::{MlpStage, StagePosition};
use crate::trainer::{setup, StepReport, TrainConfig};

impl WireStage for MlpStage {
    fn tensor_to_wire(tensor: Tensor) -> Result<WireData, WireError> {
        tensor_to_wire(&tensor)
    }

    fn tensor_from_wire(data: WireData) -> Result<Tensor, WireError> {
        tensor_from_wire(data)
    }
}

fn candle_error(e: candle_core::Error) -> WireError {
    WireError(format!("candle: {e}"))
}

/// A candle tensor (f32 or f64) as (dtype, shape, little-endian bytes).
pub fn tensor_to_wire(tensor: &Tensor) -> Result<WireData, WireError> {
    let shape = tensor.dims().to_vec();
    let flat = tensor.flatten_all().map_err(candle_error)?;
    let (dtype, bytes) = match tensor.dtype() {
        CDType::F64 => {
            let values = flat.to_vec1::<f64>().map_err(candle_error)?;
            let mut bytes = Vec::with_capacity(values.len() * 8);
            for v in values {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            (WireDType::F64, bytes)
        }
        CDType::F32 => {
            let values = flat.to_vec1::<f32>().map_err(candle_error)?;
            let mut bytes = Vec::with_capacity(values.len() * 4);
            for v in values {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            (WireDType::F32, bytes)
        }
        other => {
            return Err(WireError(format!(
                "tensors of {other:?} cannot cross processes yet; train with --dtype f32 or f64"
            )))
        }
    };
    WireData::new(dtype, shape, bytes)
}

/// A candle tensor on the CPU from (dtype, shape, bytes).
pub fn tensor_from_wire(data: WireData) -> Result<Tensor, WireError> {
    data.check()?;
    let shape = data.shape.clone();
    match data.dtype {
        WireDType::F64 => {
            let values: Vec<f64> = data
                .bytes
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect();
            Tensor::from_vec(values, shape, &Device::Cpu).map_err(candle_error)
        }
        WireDType::F32 => {
            let values: Vec<f32> = data
                .bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Tensor::from_vec(values, shape, &Device::Cpu).map_err(candle_error)
        }
        other => Err(WireError(format!(
            "a {other:?} tensor arrived; this build trains in f32 or f64 only"
        ))),
    }
}

/// Trains this process's rank of the pipeline; the other ranks run in other processes.
///
/// Every process of the world creates one with the same [`TrainConfig`] and calls
/// [`RankTrainer::step`] the same number of times, then [`RankTrainer::finish`].
#[derive(Debug)]
pub struct RankTrainer<L> {
    config: TrainConfig,
    schedule: Schedule,
    data: DataSet,
    rank: usize,
    stages: RankStages<MlpStage>,
    /// `optimizers[i]` updates the `i`-th stage of `stages` in (dir, stage) order.
    optimizers: Vec<Optimizer>,
    endpoint: Endpoint<L>,
    exec_options: ExecOptions,
    steps_done: usize,
    failed: bool,
}

impl<L: Link> RankTrainer<L> {
    /// Builds the schedule, this rank's stage copies, the data set and the optimizers.
    ///
    /// Fails (and tells the other ranks) if the endpoint's world is not `config.ranks`
    /// processes or the configuration is not usable.
    pub fn new(config: TrainConfig, mut endpoint: Endpoint<L>) -> Result<Self, NnError> {
        let built = Self::build(&config, endpoint.rank(), endpoint.ranks());
        let (schedule, data, stages) = match built {
            Ok(parts) => parts,
            Err(err) => {
                endpoint.fail(
                    &format!("rank {}: {err}", endpoint.rank()),
                    dualpipe_runtime::remote::NOTICE_GRACE,
                );
                return Err(err);
            }
        };
        let optimizers = (0..stages.len())
            .map(|_| Optimizer::new(config.optimizer, config.lr))
            .collect();
        Ok(RankTrainer {
            rank: endpoint.rank(),
            config,
            schedule,
            data,
            stages,
            optimizers,
            endpoint,
            exec_options: ExecOptions::default(),
            steps_done: 0,
            failed: false,
        })
    }

    fn build(
        config: &TrainConfig,
        rank: usize,
        world: usize,
    ) -> Result<(Schedule, DataSet, RankStages<MlpStage>), NnError> {
        config.validate()?;
        if world != config.ranks {
            return Err(NnError::Config(format!(
                "{world} processes were started for {} pipeline ranks; start one process per \
                 rank (mpirun -n {})",
                config.ranks, config.ranks
            )));
        }
        let (schedule, model, data) = setup(config)?;
        let per_dir = schedule.micro_batches_per_dir();
        let mut stages = RankStages::new();
        for (dir, stage) in schedule.placement.stages_of(rank) {
            let copy = MlpStage::new(
                &model,
                StagePosition {
                    dir,
                    model_stage: stage,
                    micro_batches: config.micro_batches,
                    micro_batches_per_dir: per_dir,
                },
            )?;
            stages.insert(dir, stage, copy);
        }
        Ok((schedule, data, stages))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The lowered, validated schedule every step runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// This rank's stage copies.
    pub fn stages(&self) -> &RankStages<MlpStage> {
        &self.stages
    }

    /// Replaces the executor's options (the receive timeout bounds every wait for a peer).
    pub fn set_exec_options(&mut self, options: ExecOptions) {
        self.exec_options = options;
    }

    /// Runs one step on this rank; every rank returns the same losses.
    ///
    /// After an error (this rank's, or a peer's it was told of) every later call fails too.
    pub fn step(&mut self) -> Result<StepReport, NnError> {
        if self.failed {
            return Err(NnError::Execution(
                "an earlier step failed part-way; start the run again".into(),
            ));
        }
        self.failed = true;
        let start = Instant::now();
        let step = self.steps_done;
        let prepared = self.prepare(step);
        if let Err(err) = prepared {
            self.fail(&format!("rank {}: step {}: {err}", self.rank, step + 1));
            return Err(err);
        }
        let outcome = run_rank_step(
            &self.schedule,
            &mut self.stages,
            &mut self.endpoint,
            step as u64,
            &self.exec_options,
        )?;
        if let Err(err) = self.check_drained(outcome.losses.len()) {
            self.fail(&format!("rank {}: step {}: {err}", self.rank, step + 1));
            return Err(err);
        }
        sum_stage_copies_remote(
            &self.schedule.placement,
            &mut self.stages,
            &mut self.endpoint,
            step as u64,
            self.exec_options.recv_timeout,
        )?;
        let mut updated = Ok(());
        for ((_, stage), opt) in self.stages.iter_mut().zip(&mut self.optimizers) {
            updated = opt.step(&mut stage.params_mut());
            if updated.is_err() {
                break;
            }
        }
        if let Err(err) = updated {
            self.fail(&format!("rank {}: optimizer step: {err}", self.rank));
            return Err(err);
        }
        self.steps_done += 1;
        self.failed = false;
        let losses: Vec<f64> = outcome.losses.iter().map(|l| l.loss).collect();
        let loss = losses.iter().sum::<f64>() / losses.len() as f64;
        Ok(StepReport {
            step,
            losses,
            loss,
            timeline: Some(outcome.timeline),
            wall: start.elapsed(),
        })
    }

    fn prepare(&mut self, step: usize) -> Result<(), NnError> {
        let batch = self.data.batch(step, self.config.micro_batches)?;
        for (_, stage) in self.stages.iter_mut() {
            stage.set_batch(batch.clone());
            stage.zero_grad()?;
        }
        Ok(())
    }

    fn check_drained(&self, losses: usize) -> Result<(), NnError> {
        for (_, stage) in self.stages.iter() {
            if stage.pending() != 0 {
                return Err(NnError::Execution(format!(
                    "stage {} of direction {} still holds {} saved tensors after the step: the \
                     schedule missed a backward",
                    stage.model_stage(),
                    stage.dir(),
                    stage.pending()
                )));
            }
        }
        if losses != self.config.micro_batches {
            return Err(NnError::Execution(format!(
                "the step reported {losses} losses for {} micro-batches",
                self.config.micro_batches
            )));
        }
        Ok(())
    }

    /// Tells every other rank that this rank failed with `message` (they stop with an error
    /// naming this rank) and marks the trainer failed.
    pub fn fail(&mut self, message: &str) {
        self.failed = true;
        self.endpoint
            .fail(message, dualpipe_runtime::remote::NOTICE_GRACE);
    }

    /// Waits until every rank has finished its steps (call once, after the last step), so no
    /// process leaves while another may still need it.
    pub fn finish(&mut self) -> Result<(), NnError> {
        barrier(
            &mut self.endpoint,
            self.steps_done as u64,
            self.exec_options.recv_timeout,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use dualpipe_runtime::net::ChannelLink;
    use dualpipe_schedule::ScheduleKind;

    use super::*;
    use crate::trainer::{DType, Trainer};

    #[test]
    fn candle_tensors_round_trip_exactly() {
        let t = Tensor::from_vec(
            vec![1.5f64, -0.1, 3e-300, f64::MAX, 0.0, -0.0],
            (2, 3),
            &Device::Cpu,
        )
        .unwrap();
        let back = tensor_from_wire(tensor_to_wire(&t).unwrap()).unwrap();
        assert_eq!(back.dims(), &[2, 3]);
        let bits = |t: &Tensor| -> Vec<u64> {
            t.flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(bits(&back), bits(&t));
        let t32 = Tensor::from_vec(vec![0.25f32, -7.0, 1e-30], 3, &Device::Cpu).unwrap();
        let back = tensor_from_wire(tensor_to_wire(&t32).unwrap()).unwrap();
        assert_eq!(back.to_vec1::<f32>().unwrap(), vec![0.25, -7.0, 1e-30]);
        let bad = WireData::new(WireDType::U8, vec![2], vec![1, 2]).unwrap();
        assert!(tensor_from_wire(bad).is_err());
    }

    fn config(schedule: ScheduleKind) -> TrainConfig {
        TrainConfig {
            schedule,
            ranks: 4,
            micro_batches: 8,
            micro_batch_size: 4,
            hidden: 8,
            layers_per_stage: 1,
            steps: 3,
            dtype: DType::F64,
            seed: 11,
            ..TrainConfig::default()
        }
    }

    /// Every rank on its own thread with its own trainer, as processes would be.
    fn run_ranks(config: &TrainConfig) -> Vec<Result<Vec<Vec<f64>>, NnError>> {
        let links = ChannelLink::world(config.ranks);
        std::thread::scope(|scope| {
            let handles: Vec<_> = links
                .into_iter()
                .map(|link| {
                    let config = config.clone();
                    scope.spawn(move || {
                        let mut trainer = RankTrainer::new(config.clone(), Endpoint::new(link))?;
                        let mut losses = Vec::new();
                        for _ in 0..config.steps {
                            losses.push(trainer.step()?.losses);
                        }
                        trainer.finish()?;
                        Ok(losses)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn rank_trainers_match_the_local_trainer_bit_for_bit() {
        for kind in [
            ScheduleKind::DualPipe,
            ScheduleKind::DualPipeV,
            ScheduleKind::OneFOneB,
        ] {
            let config = config(kind);
            let mut local = Trainer::new(config.clone()).unwrap();
            let expected: Vec<Vec<f64>> = (0..config.steps)
                .map(|_| local.step().unwrap().losses)
                .collect();
            for (rank, result) in run_ranks(&config).into_iter().enumerate() {
                let got = result.unwrap_or_else(|e| panic!("{kind}: rank {rank}: {e}"));
                let bits = |v: &Vec<Vec<f64>>| -> Vec<Vec<u64>> {
                    v.iter()
                        .map(|s| s.iter().map(|x| x.to_bits()).collect())
                        .collect()
                };
                assert_eq!(bits(&got), bits(&expected), "{kind}: rank {rank}");
            }
        }
    }

    #[test]
    fn a_world_of_the_wrong_size_fails_on_every_rank() {
        let mut config = config(ScheduleKind::OneFOneB);
        let links = ChannelLink::world(3);
        config.ranks = 4;
        for link in links {
            let err = RankTrainer::new(config.clone(), Endpoint::new(link)).unwrap_err();
            assert!(
                err.to_string().contains("3 processes were started for 4"),
                "{err}"
            );
        }
    }
}
