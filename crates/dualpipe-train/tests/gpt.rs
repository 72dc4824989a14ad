//! The GPT under every schedule: per-step losses and every gradient equal a sequential
//! single-thread run of the same model (f64, 1e-10 relative), over several optimizer steps;
//! schedules that split the model into the same stages agree step by step; validation,
//! clipping and the weights gathered for saving.

use dualpipe_train::{DataSection, ModelSection, OptimizerSection, ScheduleSection};
use std::collections::HashMap;

use candle_core::Tensor;
use dualpipe_nn::gpt::pipeline::sequential_step;
use dualpipe_nn::gpt::GptStage;
use dualpipe_nn::stage::to_f64_vec;
use dualpipe_nn::{Optimizer, OptimizerKind, StagePosition, StepBatch};
use dualpipe_schedule::ScheduleKind;
use dualpipe_train::{DType, ModelKind, Task, TrainConfig, Trainer};

/// A tiny GPT: width 16, 2 heads, sequences of 8 bytes, one block per stage, f64, SGD with
/// momentum (so the optimizer's state matters from the second step on).
fn tiny(kind: ScheduleKind, ranks: usize, micro_batches: usize) -> TrainConfig {
    TrainConfig {
        model: ModelSection {
            kind: ModelKind::Gpt,
            layers_per_stage: 1,
            d_model: 16,
            heads: 2,
            seq_len: 8,
            dtype: DType::F64,
            ..TrainConfig::DEFAULT.model
        },
        schedule: ScheduleSection::new(kind, ranks, micro_batches, 2),
        optimizer: OptimizerSection {
            lr: 0.05,
            // A warm-up of two of the three steps: the schedule is part of what must match.
            lr_warmup: Some(2),
            kind: OptimizerKind::Sgd { momentum: 0.9 },
            ..TrainConfig::DEFAULT.optimizer
        },
        data: DataSection {
            eval_every: 0,
            ..TrainConfig::DEFAULT.data
        },
        steps: 3,
        ..TrainConfig::DEFAULT
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-10 * a.abs().max(b.abs()).max(1e-300)
}

fn values(t: &Tensor) -> Vec<f64> {
    to_f64_vec(t).unwrap()
}

/// Gradients of the trainer's last step by tensor name (one copy of each stage).
fn trainer_gradients(trainer: &Trainer) -> HashMap<String, Vec<f64>> {
    let mut out = HashMap::new();
    for (_, stage) in trainer.stages().iter().flat_map(|r| r.iter()) {
        let Some(s) = stage.as_gpt() else {
            panic!("a GPT run holds GPT stages")
        };
        for (name, p) in s.param_names().into_iter().zip(s.params()) {
            out.entry(name).or_insert_with(|| values(&p.grad));
        }
    }
    out
}

/// Trains `config` for its steps and checks each against the sequential reference.
fn matches_the_sequential_run(config: TrainConfig) -> Vec<f64> {
    let mut trainer = Trainer::new(config.clone()).unwrap();
    let gpt = trainer.workload().gpt().unwrap();
    let mut reference = GptStage::new(
        &gpt.weights,
        1,
        StagePosition {
            dir: 0,
            model_stage: 0,
            micro_batches: config.schedule.micro_batches,
            micro_batches_per_dir: config.schedule.micro_batches,
        },
    )
    .unwrap();
    let mut optimizer = Optimizer::scheduled(config.optimizer.kind, config.lr_schedule());
    let mut losses = Vec::new();
    for step in 0..config.steps {
        let StepBatch::Gpt(batch) = trainer.workload().batch(&config, step).unwrap() else {
            panic!("a GPT batch")
        };
        reference.zero_grad().unwrap();
        let expected = sequential_step(&mut reference, batch).unwrap();
        let report = trainer.step().unwrap();
        let what = format!(
            "{} on {} ranks, step {}",
            config.schedule.kind,
            config.schedule.ranks,
            step + 1
        );
        assert_eq!(report.losses.len(), expected.len(), "{what}");
        for (a, b) in report.losses.iter().zip(&expected) {
            assert!(close(*a, *b), "{what}: loss {a} vs {b}");
        }
        let got = trainer_gradients(&trainer);
        let names = reference.param_names();
        assert_eq!(got.len(), names.len(), "{what}");
        for (name, p) in names.iter().zip(reference.params()) {
            let want = values(&p.grad);
            let have = &got[name];
            let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
            for (a, b) in have.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-10 * scale.max(1e-300),
                    "{what}: {name}: {a} vs {b}"
                );
            }
        }
        optimizer.step(&mut reference.params_mut()).unwrap();
        losses.push(report.loss);
    }
    assert!(trainer.copies_identical().unwrap());
    losses
}

#[test]
fn every_schedule_matches_the_sequential_run_on_two_and_four_ranks() {
    for kind in ScheduleKind::ALL {
        for ranks in [2, 4] {
            matches_the_sequential_run(tiny(kind, ranks, 2 * ranks));
        }
    }
}

#[test]
fn schedules_splitting_the_same_stages_agree_step_by_step() {
    let dualpipe = matches_the_sequential_run(tiny(ScheduleKind::DualPipe, 4, 8));
    let one_f_one_b = matches_the_sequential_run(tiny(ScheduleKind::OneFOneB, 4, 8));
    let dualpipev = matches_the_sequential_run(tiny(ScheduleKind::DualPipeV, 2, 8));
    for ((a, b), c) in dualpipe.iter().zip(&one_f_one_b).zip(&dualpipev) {
        assert!(close(*a, *b) && close(*a, *c), "{a} {b} {c}");
    }
    assert!(dualpipe.last() < dualpipe.first(), "{dualpipe:?}");
}

#[test]
fn validation_runs_when_due_and_the_run_learns() {
    let config = TrainConfig {
        model: ModelSection {
            dtype: DType::F32,
            ..(tiny(ScheduleKind::DualPipe, 2, 4)).model
        },
        schedule: ScheduleSection {
            micro_batch_size: 4,
            ..(tiny(ScheduleKind::DualPipe, 2, 4)).schedule
        },
        optimizer: OptimizerSection {
            kind: OptimizerKind::adamw(),
            lr: 3e-3,
            ..(tiny(ScheduleKind::DualPipe, 2, 4)).optimizer
        },
        data: DataSection {
            eval_every: 2,
            ..(tiny(ScheduleKind::DualPipe, 2, 4)).data
        },
        steps: 6,
        ..tiny(ScheduleKind::DualPipe, 2, 4)
    };
    let summary = Trainer::new(config.clone())
        .unwrap()
        .run(|_| Ok(()))
        .unwrap();
    let steps: Vec<usize> = summary.evaluations.iter().map(|e| e.step).collect();
    assert_eq!(steps, [2, 4, 6]);
    let first = summary.evaluations.first().unwrap();
    let last = summary.evaluations.last().unwrap();
    assert!(last.loss < first.loss, "{first:?} -> {last:?}");
    // The default text is the Markov source: scored against its entropy rate.
    let best = last
        .best_loss
        .expect("the Markov source's entropy is known");
    assert!(best > 0.5 && last.loss > best, "{best} {last:?}");
    assert_eq!(last.accuracy, None);
    assert_eq!(summary.eval_loss, Some(last.loss));
    assert_eq!(summary.best_loss, Some(best));
    assert!(summary.tokens_per_second.unwrap() > 0.0);
    assert_eq!(summary.samples.len(), dualpipe_train::model::SAMPLES);
    // The addition task is scored by held-out accuracy instead.
    let addition = TrainConfig {
        data: DataSection {
            task: Task::Addition,
            ..config.data
        },
        steps: 1,
        ..config
    };
    let summary = Trainer::new(addition).unwrap().run(|_| Ok(())).unwrap();
    let e = summary.evaluations.last().unwrap();
    assert!(
        e.accuracy.is_some_and(|a| (0.0..=1.0).contains(&a)),
        "{e:?}"
    );
    assert_eq!(e.best_loss, None);
    assert!(summary.samples.iter().all(|s| s.prompt.ends_with('=')));
}

#[test]
fn clipping_bounds_the_update_and_reports_the_norm() {
    // A constant rate, so SGD's first step moves by exactly lr times the clipped gradient.
    let base = TrainConfig {
        optimizer: OptimizerSection {
            lr_warmup: Some(0),
            ..(tiny(ScheduleKind::DualPipe, 2, 4)).optimizer
        },
        ..tiny(ScheduleKind::DualPipe, 2, 4)
    };
    let clipped = TrainConfig {
        optimizer: OptimizerSection {
            clip_grad: Some(1e-3),
            ..base.optimizer.clone()
        },
        ..base.clone()
    };
    let mut free = Trainer::new(base).unwrap();
    let mut tight = Trainer::new(clipped).unwrap();
    let before: Vec<Vec<f64>> = tight.parameters().concat().iter().map(values).collect();
    let a = free.step().unwrap();
    let b = tight.step().unwrap();
    assert_eq!(a.losses, b.losses, "clipping acts after the backward");
    let norm = b.grad_norm.expect("the norm is reported");
    assert!(norm > 1e-3, "{norm}");
    // SGD's first step moves each weight by lr * grad: the whole move has norm lr * clip.
    let after: Vec<Vec<f64>> = tight.parameters().concat().iter().map(values).collect();
    let moved: f64 = before
        .iter()
        .flatten()
        .zip(after.iter().flatten())
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt();
    assert!((moved - 0.05 * 1e-3).abs() < 1e-9, "{moved}");
}

#[test]
fn gathered_weights_are_the_trained_ones_and_round_trip() {
    let mut trainer = Trainer::new(tiny(ScheduleKind::DualPipeV, 2, 4)).unwrap();
    trainer.step().unwrap();
    let weights = trainer.weights().unwrap().unwrap().clone();
    let bytes = weights.to_safetensors().unwrap();
    let back =
        dualpipe_nn::gpt::GptWeights::from_safetensors(&bytes, candle_core::DType::F64).unwrap();
    let first = trainer.stages()[0].iter().next().unwrap().1;
    let Some(stage) = first.as_gpt() else {
        panic!("a GPT stage")
    };
    for (name, p) in stage.param_names().iter().zip(stage.params()) {
        assert_eq!(values(back.get(name).unwrap()), values(&p.value), "{name}");
    }
}
