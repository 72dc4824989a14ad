//! The gradient-noise example (examples/gradient_noise.rs): a parallelism written outside the
//! crate acts in every step, through the public `Parallelism` and `StepView` alone.

#[allow(dead_code)]
#[path = "../examples/gradient_noise.rs"]
mod example;

use dualpipe_schedule::ScheduleKind;
use dualpipe_train::{DType, TrainConfig, Trainer};

/// A small f64 MLP under DualPipe on 2 ranks, 3 steps.
fn config() -> TrainConfig {
    let mut config = TrainConfig::MLP;
    (config.model.hidden, config.model.layers_per_stage) = (8, 1);
    config.model.dtype = DType::F64;
    (config.schedule.kind, config.schedule.ranks) = (ScheduleKind::DualPipe, 2);
    (
        config.schedule.micro_batches,
        config.schedule.micro_batch_size,
    ) = (4, 4);
    config.steps = 3;
    config
}

#[test]
fn no_noise_changes_nothing_and_noise_changes_the_later_losses() {
    let plain = Trainer::new(config()).unwrap().run(|_| Ok(())).unwrap();
    let none = example::train_with_noise(config(), 0.0).unwrap();
    assert_eq!(none, plain.losses);
    let noisy = example::train_with_noise(config(), 0.5).unwrap();
    // The first step's loss comes before any update; the noise shows in the next ones.
    assert_eq!(noisy[0], plain.losses[0]);
    assert_ne!(noisy[1], plain.losses[1]);
    assert_ne!(noisy[2], plain.losses[2]);
}

#[test]
fn dualpipe_copies_of_a_stage_get_the_same_noise() {
    let noise = example::GradientNoise {
        bound: 0.5,
        seed: 3,
    };
    let mut trainer = Trainer::builder(config())
        .parallelism(noise)
        .build()
        .unwrap();
    let noisy = trainer.run(|_| Ok(())).unwrap();
    let plain = Trainer::new(config()).unwrap().run(|_| Ok(())).unwrap();
    assert_ne!(noisy.final_loss, plain.final_loss, "the noise acted");
    assert!(trainer.copies_identical().unwrap());
}
