//! One rank per process, with every "process" a thread of this test joined by in-memory
//! links: the same losses as the local trainer, bit for bit, over the one shared step.

use dualpipe_runtime::transport::endpoint::ChannelLink;
use dualpipe_runtime::Endpoint;
use dualpipe_schedule::ScheduleKind;
use dualpipe_train::{DType, RankTrainer, StopRequest, TrainConfig, TrainError, Trainer};
use dualpipe_train::{ModelSection, ScheduleSection};

fn config(schedule: ScheduleKind) -> TrainConfig {
    TrainConfig {
        model: ModelSection {
            hidden: 8,
            layers_per_stage: 1,
            dtype: DType::F64,
            ..TrainConfig::MLP.model
        },
        schedule: ScheduleSection {
            kind: schedule,
            ranks: 4,
            micro_batches: 8,
            micro_batch_size: 4,
            ..TrainConfig::MLP.schedule
        },
        steps: 3,
        seed: 11,
        ..TrainConfig::MLP
    }
}

/// Every rank on its own thread with its own trainer, as processes would be; each runs the
/// whole run through `Trainer::run`.
fn run_ranks(config: &TrainConfig) -> Vec<Result<Vec<f64>, TrainError>> {
    let links = ChannelLink::world(config.schedule.ranks);
    std::thread::scope(|scope| {
        let handles: Vec<_> = links
            .into_iter()
            .map(|link| {
                let config = config.clone();
                scope.spawn(move || {
                    let mut trainer = RankTrainer::connect(config, Endpoint::new(link))?;
                    Ok(trainer.run(|_| Ok(()))?.losses)
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
        let expected: Vec<u64> = (0..config.steps)
            .map(|_| local.step().unwrap().loss.to_bits())
            .collect();
        for (rank, result) in run_ranks(&config).into_iter().enumerate() {
            let got = result.unwrap_or_else(|e| panic!("{kind}: rank {rank}: {e}"));
            let got: Vec<u64> = got.iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, expected, "{kind}: rank {rank}");
        }
    }
}

#[test]
fn a_world_of_the_wrong_size_fails_on_every_rank() {
    let mut config = config(ScheduleKind::OneFOneB);
    let links = ChannelLink::world(3);
    config.schedule.ranks = 4;
    for link in links {
        let err = RankTrainer::connect(config.clone(), Endpoint::new(link)).unwrap_err();
        assert!(
            err.to_string()
                .contains("3 processes were started for ranks 4"),
            "{err}"
        );
    }
}

#[test]
fn a_callback_that_stops_the_run_stops_every_rank_naming_the_reason() {
    let config = config(ScheduleKind::DualPipe);
    let links = ChannelLink::world(config.schedule.ranks);
    let results: Vec<Result<Vec<f64>, TrainError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = links
            .into_iter()
            .map(|link| {
                let config = config.clone();
                scope.spawn(move || {
                    let mut trainer = RankTrainer::connect(config, Endpoint::new(link))?;
                    let rank = trainer.rank();
                    let summary = trainer.run(|event| match event {
                        dualpipe_train::StepEvent::Starting { step: 1 } if rank == 2 => {
                            Err("rank 2: asked to stop".into())
                        }
                        _ => Ok(()),
                    })?;
                    Ok(summary.losses)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, result) in results.into_iter().enumerate() {
        let err = result.expect_err("every rank stops").to_string();
        assert!(err.contains("asked to stop"), "rank {rank}: {err}");
    }
}

/// Asked to stop on its second poll (before step 2): rank 2's signal source.
fn second_poll() -> Option<i32> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static POLLS: AtomicUsize = AtomicUsize::new(0);
    (POLLS.fetch_add(1, Ordering::SeqCst) >= 1).then_some(15)
}

fn never() -> Option<i32> {
    None
}

/// A signal that reaches one process only (rank 2, before step 2) stops every rank at that
/// same boundary: the ranks agree before each step, so none waits for a peer that stopped.
#[test]
fn a_stop_asked_of_one_rank_stops_every_rank_at_the_same_boundary() {
    let mut config = config(ScheduleKind::DualPipe);
    config.steps = 6;
    config.transport.recv_timeout = 10.0;
    let links = ChannelLink::world(config.schedule.ranks);
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = links
            .into_iter()
            .enumerate()
            .map(|(rank, link)| {
                let config = config.clone();
                scope.spawn(move || {
                    let mut trainer = RankTrainer::connect(config, Endpoint::new(link))?;
                    let source = if rank == 2 { second_poll } else { never };
                    trainer.set_stop(StopRequest::new(source, false));
                    trainer.run(|_| Ok(())).map(|s| s.losses)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Err(TrainError::Interrupted { step, signal }) => {
                assert_eq!((step, signal), (1, 15), "rank {rank}")
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}
