//! Mixed precision in the trainer: f16's dynamic loss scaling skips a step whose gradients
//! overflow (no parameter moves, the scale halves, the skip is counted) and takes the others
//! with the gradients unscaled; bf16 has no loss scale.

use dualpipe_nn::stage::to_f64_vec;
use dualpipe_nn::OptimizerKind;
use dualpipe_schedule::ScheduleKind;
use dualpipe_train::step::loss_scale::{LossScale, INITIAL_SCALE};
use dualpipe_train::{
    DType, ModelKind, ModelSection, OptimizerSection, ScheduleSection, TrainConfig, Trainer,
};

fn tiny(dtype: DType) -> TrainConfig {
    TrainConfig {
        model: ModelSection {
            kind: ModelKind::Gpt,
            layers_per_stage: 1,
            d_model: 16,
            heads: 2,
            seq_len: 8,
            dtype,
            ..TrainConfig::DEFAULT.model
        },
        schedule: ScheduleSection::new(ScheduleKind::DualPipeV, 2, 4, 2),
        steps: 3,
        ..TrainConfig::DEFAULT
    }
}

fn parameters(trainer: &Trainer) -> Vec<Vec<f64>> {
    trainer
        .stages()
        .iter()
        .flat_map(|r| r.iter())
        .flat_map(|(_, s)| {
            s.params()
                .into_iter()
                .map(|p| to_f64_vec(&p.value).unwrap())
        })
        .collect()
}

#[test]
fn f16_skips_an_overflowing_step_and_takes_the_next() {
    let mut trainer = Trainer::new(tiny(DType::F16)).unwrap();
    assert_eq!(trainer.loss_scale().unwrap().scale, INITIAL_SCALE);
    // A scale of 1e38 keeps the f32 loss gradient finite, but the gradients the stages keep
    // and send in f16 (largest 65504) overflow.
    trainer
        .set_loss_scale(LossScale {
            scale: 1e38,
            ..LossScale::default()
        })
        .unwrap();
    let before = parameters(&trainer);
    let report = trainer.step().unwrap();
    assert!(report.skipped);
    assert_eq!(report.loss_scale, Some(1e38));
    assert!(report.loss.is_finite(), "the loss itself is not scaled");
    assert_eq!(parameters(&trainer), before, "a skipped step moves nothing");
    let after = trainer.loss_scale().unwrap();
    assert_eq!((after.scale, after.skipped_steps), (5e37, 1));

    trainer.set_loss_scale(LossScale::default()).unwrap();
    let report = trainer.step().unwrap();
    assert!(!report.skipped);
    assert_eq!(report.loss_scale, Some(INITIAL_SCALE));
    let moved = parameters(&trainer);
    assert_ne!(moved, before, "a taken step moves the parameters");
    for p in moved.iter().flatten() {
        assert!(p.is_finite());
    }
}

#[test]
fn an_unscaled_f16_step_matches_f32_closely() {
    // One plain SGD step (lr 1, so a parameter moves by its gradient): f16's gradients,
    // scaled by 2^16 through the backward and unscaled before the update, against f32's.
    let sgd = |dtype| TrainConfig {
        optimizer: OptimizerSection {
            lr: 1.0,
            kind: OptimizerKind::Sgd { momentum: 0.0 },
            ..TrainConfig::DEFAULT.optimizer
        },
        ..tiny(dtype)
    };
    let mut f16 = Trainer::new(sgd(DType::F16)).unwrap();
    let mut f32 = Trainer::new(sgd(DType::F32)).unwrap();
    let start = parameters(&f32);
    let (a, b) = (f16.step().unwrap(), f32.step().unwrap());
    assert!(!a.skipped);
    assert!(
        (a.loss - b.loss).abs() < 1e-3 * b.loss,
        "{} {}",
        a.loss,
        b.loss
    );
    let moves = |t: &Trainer| -> Vec<f64> {
        parameters(t)
            .iter()
            .flatten()
            .zip(start.iter().flatten())
            .map(|(x, y)| x - y)
            .collect()
    };
    let (ma, mb) = (moves(&f16), moves(&f32));
    let diff: f64 = ma.iter().zip(&mb).map(|(x, y)| (x - y) * (x - y)).sum();
    let norm: f64 = mb.iter().map(|y| y * y).sum();
    let err = (diff / norm).sqrt();
    assert!(
        err > 0.0 && err < 1e-2,
        "relative error of the update {err}"
    );
}

#[test]
fn bf16_has_no_loss_scale() {
    let mut trainer = Trainer::new(tiny(DType::Bf16)).unwrap();
    assert!(trainer.loss_scale().is_none());
    let err = trainer.set_loss_scale(LossScale::default()).unwrap_err();
    assert!(err.to_string().contains("only f16"), "{err}");
    let report = trainer.step().unwrap();
    assert_eq!((report.loss_scale, report.skipped), (None, false));
}
