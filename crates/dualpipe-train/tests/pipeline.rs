//! Every schedule, run on the runtime's executor, against the sequential reference: every
//! micro-batch loss and every parameter gradient equal to 1e-12 relative in f64, and the
//! parameters still agree after three optimizer steps (SGD with momentum and AdamW).

use candle_core::Tensor;
use dualpipe_schedule::ScheduleKind;
use dualpipe_testutil::{assert_close, scalar_rel};
use dualpipe_train::{DType, OptimizerKind, Reference, TrainConfig, TrainError, Trainer};
use dualpipe_train::{ModelSection, OptimizerSection, ScheduleSection};

const TOL: f64 = 1e-12;
const STEPS: usize = 3;

fn config(
    schedule: ScheduleKind,
    ranks: usize,
    virtual_stages: usize,
    optimizer: OptimizerKind,
) -> TrainConfig {
    TrainConfig {
        model: ModelSection {
            hidden: 4,
            layers_per_stage: 2,
            dtype: DType::F64,
            ..TrainConfig::MLP.model
        },
        schedule: ScheduleSection {
            kind: schedule,
            ranks,
            micro_batches: 8,
            micro_batch_size: 3,
            virtual_stages,
        },
        optimizer: OptimizerSection {
            lr: 0.05,
            kind: optimizer,
            ..TrainConfig::MLP.optimizer
        },
        steps: STEPS,
        seed: 17,
        ..TrainConfig::MLP
    }
}

fn assert_all_close(a: &[Vec<Tensor>], b: &[Vec<Tensor>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: stage counts differ");
    for (s, (sa, sb)) in a.iter().zip(b).enumerate() {
        assert_eq!(
            sa.len(),
            sb.len(),
            "{what}: stage {s} parameter counts differ"
        );
        for (i, (ta, tb)) in sa.iter().zip(sb).enumerate() {
            assert_close(ta, tb, TOL, &format!("{what}, stage {s}, parameter {i}"));
        }
    }
}

fn check(schedule: ScheduleKind, ranks: usize, virtual_stages: usize) {
    for optimizer in [OptimizerKind::sgd(), OptimizerKind::adamw()] {
        let config = config(schedule, ranks, virtual_stages, optimizer);
        let what = format!("{schedule} on {ranks} ranks (v = {virtual_stages}), {optimizer}");
        let mut trainer =
            Trainer::new(config.clone()).unwrap_or_else(|e| panic!("{what}: Trainer::new: {e}"));
        let mut reference = Reference::new(&config).unwrap();
        assert_all_close(
            &trainer.parameters(),
            &reference.parameters(),
            &format!("{what}: initial parameters"),
        );
        for step in 0..STEPS {
            let report = trainer
                .step()
                .unwrap_or_else(|e| panic!("{what}: step {step}: {e}"));
            let expected = reference.step().unwrap();
            assert_eq!(report.step, step);
            assert_eq!(report.losses.len(), config.schedule.micro_batches);
            for (mb, (a, b)) in report.losses.iter().zip(&expected.losses).enumerate() {
                assert!(
                    scalar_rel(*a, *b) <= TOL,
                    "{what}: step {step}, micro-batch {mb}: loss {a} vs reference {b}"
                );
            }
            assert!(scalar_rel(report.loss, expected.loss) <= TOL);
            assert!(
                report.timeline.is_some(),
                "{what}: the executor's timeline is reported"
            );
            assert_all_close(
                &trainer.gradients(),
                &expected.gradients,
                &format!("{what}: step {step} gradients"),
            );
            assert_all_close(
                &trainer.parameters(),
                &reference.parameters(),
                &format!("{what}: parameters after step {step}"),
            );
            assert!(
                trainer.copies_identical().unwrap(),
                "{what}: stage copies diverged after step {step}"
            );
        }
    }
}

#[test]
fn gpipe_matches_reference() {
    check(ScheduleKind::GPipe, 2, 1);
    check(ScheduleKind::GPipe, 4, 1);
}

#[test]
fn one_f_one_b_matches_reference() {
    check(ScheduleKind::OneFOneB, 2, 1);
    check(ScheduleKind::OneFOneB, 4, 1);
}

#[test]
fn interleaved_matches_reference() {
    check(ScheduleKind::Interleaved, 2, 2);
    check(ScheduleKind::Interleaved, 4, 2);
}

#[test]
fn zb1p_matches_reference() {
    check(ScheduleKind::Zb1p, 2, 1);
    check(ScheduleKind::Zb1p, 4, 1);
}

#[test]
fn dualpipe_matches_reference() {
    check(ScheduleKind::DualPipe, 2, 1);
    check(ScheduleKind::DualPipe, 4, 1);
}

#[test]
fn dualpipev_matches_reference() {
    check(ScheduleKind::DualPipeV, 2, 1);
    check(ScheduleKind::DualPipeV, 4, 1);
}

/// DualPipe on 4 ranks, 1F1B on 4 ranks and DualPipeV on 2 ranks hold the same 4-stage model
/// and see the same batches: their per-step losses agree.
#[test]
fn four_stage_schedules_train_the_same_model() {
    let runs: Vec<Vec<f64>> = [
        (ScheduleKind::DualPipe, 4),
        (ScheduleKind::OneFOneB, 4),
        (ScheduleKind::DualPipeV, 2),
    ]
    .into_iter()
    .map(|(kind, ranks)| {
        let mut trainer = Trainer::new(config(kind, ranks, 1, OptimizerKind::adamw()))
            .unwrap_or_else(|e| panic!("{kind} on {ranks} ranks: {e}"));
        (0..4).map(|_| trainer.step().unwrap().loss).collect()
    })
    .collect();
    for run in &runs[1..] {
        for (step, (a, b)) in run.iter().zip(&runs[0]).enumerate() {
            assert!(
                scalar_rel(*a, *b) <= 1e-10,
                "step {step}: loss {a} vs DualPipe's {b}"
            );
        }
    }
    assert!(runs[0][3] < runs[0][0], "the loss falls: {:?}", runs[0]);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = ScheduleKind> {
        prop::sample::select(ScheduleKind::ALL.to_vec())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]

        /// Any schedule that builds, on any small shape, gives the reference's losses and
        /// gradients (one step).
        #[test]
        fn any_schedule_matches_reference(
            kind in kind(),
            ranks in 1usize..5,
            micro_batches in 1usize..11,
            layers in 1usize..3,
            rows in 1usize..4,
            seed in 0u64..1000,
        ) {
            let config = TrainConfig {
                model: ModelSection {
                    layers_per_stage: layers,
                    ..(config(kind, ranks, if kind == ScheduleKind::Interleaved { 2 } else { 1 }, OptimizerKind::sgd())).model
                },
                schedule: ScheduleSection {
                    micro_batches,
                    micro_batch_size: rows,
                    ..(config(kind, ranks, if kind == ScheduleKind::Interleaved { 2 } else { 1 }, OptimizerKind::sgd())).schedule
                },
                seed,
                ..config(kind, ranks, if kind == ScheduleKind::Interleaved { 2 } else { 1 }, OptimizerKind::sgd())
            };
            // Configurations the schedule rejects are skipped (proptest draws others, so 12
            // cases really run); the rest must match.
            let mut trainer = match Trainer::new(config.clone()) {
                Ok(trainer) => trainer,
                Err(TrainError::Schedule(e)) => {
                    return Err(TestCaseError::reject(e.to_string()))
                }
                Err(e) => panic!("{config:?}: {e}"),
            };
            let report = trainer.step().unwrap();
            let expected = Reference::new(&config).unwrap().step().unwrap();
            for (a, b) in report.losses.iter().zip(&expected.losses) {
                prop_assert!(scalar_rel(*a, *b) <= TOL);
            }
            assert_all_close(&trainer.gradients(), &expected.gradients, &format!("{config:?}"));
            prop_assert!(trainer.copies_identical().unwrap());
        }
    }
}
