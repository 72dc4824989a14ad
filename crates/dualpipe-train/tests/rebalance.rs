//! Uneven partitions and blocks moved between stages while training: the math is unchanged,
//! so every f64 loss and the final weights are bit-identical to the run without moves.

use dualpipe_schedule::ScheduleKind;
use dualpipe_train::parallel::stages::rebalance::{RebalanceSettings, SlowRank};
use dualpipe_train::{DType, OptimizerKind, TrainConfig, Trainer};
use dualpipe_train::{
    DataSection, ModelSection, OptimizerSection, ParallelismSection, ScheduleSection,
};

fn config(schedule: ScheduleKind, optimizer: OptimizerKind, steps: usize) -> TrainConfig {
    TrainConfig {
        model: ModelSection {
            layers_per_stage: 2,
            d_model: 16,
            heads: 2,
            seq_len: 8,
            dtype: DType::F64,
            ..TrainConfig::DEFAULT.model
        },
        schedule: ScheduleSection {
            kind: schedule,
            ranks: 4,
            micro_batches: 8,
            micro_batch_size: 2,
            ..TrainConfig::DEFAULT.schedule
        },
        optimizer: OptimizerSection {
            lr: 0.01,
            kind: optimizer,
            ..TrainConfig::DEFAULT.optimizer
        },
        data: DataSection {
            eval_every: 0,
            ..TrainConfig::DEFAULT.data
        },
        steps,
        seed: 5,
        ..TrainConfig::DEFAULT
    }
}

fn bits(losses: &[f64]) -> Vec<u64> {
    losses.iter().map(|l| l.to_bits()).collect()
}

/// Every step's micro-batch losses as f64 bits, and the final weights' bits by name.
type Outcome = (Vec<Vec<u64>>, Vec<(String, Vec<u64>)>);

/// Every step's micro-batch losses, and the final weights as f64 bits by name.
fn run(mut trainer: Trainer, moves: &[(usize, Vec<usize>)]) -> Outcome {
    let mut losses = Vec::new();
    while trainer.steps_done() < trainer.config().steps {
        for (after, blocks) in moves {
            if *after == trainer.steps_done() {
                trainer.repartition(blocks.clone()).unwrap();
            }
        }
        losses.push(bits(&trainer.step().unwrap().losses));
    }
    let weights = trainer.weights().unwrap().unwrap().clone();
    let mut named: Vec<(String, Vec<u64>)> = dualpipe_nn::gpt::tensor_names(weights.config())
        .into_iter()
        .map(|(n, _)| {
            let t = weights.get(&n).unwrap();
            let v = dualpipe_nn::stage::to_f64_vec(t).unwrap();
            (n, v.iter().map(|x| x.to_bits()).collect())
        })
        .collect();
    named.sort();
    (losses, named)
}

#[test]
fn uneven_partitions_train_the_same_model() {
    for schedule in [ScheduleKind::DualPipe, ScheduleKind::OneFOneB] {
        let even = config(schedule, OptimizerKind::adamw(), 3);
        let uneven = TrainConfig {
            model: ModelSection {
                partition: Some(vec![3, 1, 1, 3]),
                ..even.model.clone()
            },
            ..even.clone()
        };
        let a = run(Trainer::new(even).unwrap(), &[]);
        let b = run(Trainer::new(uneven.clone()).unwrap(), &[]);
        assert_eq!(a, b, "{schedule}: an uneven partition changed the math");
        let t = Trainer::new(uneven).unwrap();
        assert_eq!(t.partition_text(), "3,1,1,3");
    }
}

#[test]
fn blocks_moved_between_steps_keep_every_loss_bit_identical() {
    for schedule in [ScheduleKind::DualPipe, ScheduleKind::OneFOneB] {
        for optimizer in [OptimizerKind::adamw(), OptimizerKind::sgd()] {
            let c = config(schedule, optimizer, 6);
            let still = run(Trainer::new(c.clone()).unwrap(), &[]);
            let moved = run(
                Trainer::new(c).unwrap(),
                &[(2, vec![1, 3, 3, 1]), (4, vec![4, 1, 1, 2])],
            );
            assert_eq!(still.0.len(), 6);
            assert_eq!(
                still, moved,
                "{schedule}, {optimizer}: moving blocks changed the math"
            );
        }
    }
}

#[test]
fn a_bad_partition_is_refused_and_the_trainer_keeps_going() {
    let c = config(ScheduleKind::OneFOneB, OptimizerKind::adamw(), 2);
    let mut t = Trainer::new(c).unwrap();
    t.step().unwrap();
    let err = t.repartition(vec![4, 4]).unwrap_err().to_string();
    assert!(err.contains("lists 2 stages"), "{err}");
    let err = t.repartition(vec![8, 0, 0, 0]).unwrap_err().to_string();
    assert!(err.contains("stage 1 holds no block"), "{err}");
    assert_eq!(t.partition_text(), "2,2,2,2");
    t.step().unwrap();
}

#[test]
fn a_slow_rank_makes_the_stages_rebalance_without_changing_the_math() {
    for schedule in [ScheduleKind::OneFOneB, ScheduleKind::DualPipe] {
        let plain = config(schedule, OptimizerKind::adamw(), 6);
        let slowed = TrainConfig {
            parallelism: ParallelismSection {
                slow_rank: Some(SlowRank {
                    rank: 1,
                    factor: 8.0,
                }),
                rebalance: Some(RebalanceSettings {
                    threshold: 0.05,
                    window: 1,
                }),
                ..plain.parallelism.clone()
            },
            ..plain.clone()
        };
        let expected = Trainer::new(plain).unwrap().run(|_| Ok(())).unwrap();
        let mut trainer = Trainer::new(slowed).unwrap();
        let got = trainer.run(|_| Ok(())).unwrap();
        assert_eq!(bits(&got.losses), bits(&expected.losses), "{schedule}");
        let moves = trainer.repartitions();
        assert!(
            !moves.is_empty(),
            "{schedule}: rank 1 eight times slower and nothing moved"
        );
        let first = &moves[0];
        assert_eq!(first.from, vec![2, 2, 2, 2]);
        assert!(first.predicted.1 < first.predicted.0, "{first:?}");
        // The slow rank's stages lose blocks.
        let slow_blocks = |b: &[usize]| match schedule {
            ScheduleKind::DualPipe => b[1] + b[2],
            _ => b[1],
        };
        assert!(
            slow_blocks(&first.to) < slow_blocks(&first.from),
            "{first:?}"
        );
    }
}

/// Activation recomputation (one value for all stages, or one per stage, and across a
/// re-partition) trains the same model: every f64 loss and final weight bit-identical.
#[test]
fn recomputation_trains_the_same_model() {
    use dualpipe_train::Recompute;
    for schedule in [ScheduleKind::DualPipe, ScheduleKind::DualPipeV] {
        let plain = config(schedule, OptimizerKind::adamw(), 3);
        let want = run(Trainer::new(plain.clone()).unwrap(), &[]);
        let stages = plain.model_stages();
        let per_stage: Vec<Recompute> = (0..stages)
            .map(|s| [Recompute::Full, Recompute::Selective, Recompute::None][s % 3])
            .collect();
        for r in [vec![Recompute::Full], vec![Recompute::Selective], per_stage] {
            let c = TrainConfig {
                model: ModelSection {
                    recompute: Some(r.clone()),
                    ..plain.model.clone()
                },
                ..plain.clone()
            };
            assert_eq!(
                run(Trainer::new(c).unwrap(), &[]),
                want,
                "{schedule} with recompute {r:?}"
            );
        }
    }
}
