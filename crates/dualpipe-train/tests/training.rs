//! Training behaviour: determinism, f32, the default configuration, errors.

use dualpipe_schedule::ScheduleKind;
use dualpipe_train::{DType, ModelKind, OptimizerKind, TrainConfig, TrainError, Trainer};
use dualpipe_train::{ModelSection, OptimizerSection, ScheduleSection};

fn f32_config() -> TrainConfig {
    TrainConfig {
        model: ModelSection {
            hidden: 32,
            layers_per_stage: 1,
            dtype: DType::F32,
            ..TrainConfig::MLP.model
        },
        schedule: ScheduleSection::new(ScheduleKind::DualPipe, 4, 8, 64),
        optimizer: OptimizerSection {
            lr: 3e-3,
            kind: OptimizerKind::adamw(),
            ..TrainConfig::MLP.optimizer
        },
        seed: 1,
        ..TrainConfig::MLP
    }
}

/// The same configuration and seed give bit-identical losses, run after run, although the
/// ranks run on their own threads.
#[test]
fn runs_are_bit_identical_and_f32_loss_falls() {
    let run = || {
        let mut trainer = Trainer::new(f32_config()).unwrap();
        let losses: Vec<u64> = (0..6)
            .map(|_| trainer.step().unwrap().loss.to_bits())
            .collect();
        assert!(trainer.copies_identical().unwrap());
        losses
    };
    let a = run();
    let b = run();
    assert_eq!(a, b);
    let (first, last) = (f64::from_bits(a[0]), f64::from_bits(a[5]));
    assert!(last < 0.9 * first, "loss {first} -> {last}");
}

#[test]
fn another_seed_gives_another_model() {
    let loss = |seed| {
        Trainer::new(TrainConfig {
            seed,
            ..f32_config()
        })
        .unwrap()
        .step()
        .unwrap()
        .loss
    };
    assert_ne!(loss(1), loss(2));
}

#[test]
fn bad_configurations_are_errors() {
    let zero = TrainConfig {
        model: ModelSection {
            hidden: 0,
            ..TrainConfig::MLP.model
        },
        ..TrainConfig::MLP
    };
    let err = Trainer::new(zero).unwrap_err();
    assert!(matches!(err, TrainError::Config(_)), "{err}");
    assert!(err.to_string().contains("hidden"), "{err}");
    let lr = TrainConfig {
        optimizer: OptimizerSection {
            lr: f64::NAN,
            ..TrainConfig::MLP.optimizer
        },
        ..TrainConfig::MLP
    };
    assert!(matches!(
        Trainer::new(lr).unwrap_err(),
        TrainError::Config(_)
    ));
    let odd = TrainConfig {
        schedule: ScheduleSection {
            micro_batches: 7,
            ..TrainConfig::MLP.schedule
        },
        ..TrainConfig::MLP
    };
    let err = Trainer::new(odd).unwrap_err();
    assert!(matches!(err, TrainError::Schedule(_)), "{err}");
}

#[test]
fn sizes_that_cannot_be_allocated_are_config_errors_not_panics() {
    // Widths and batch sizes whose memory cannot exist are refused by `validate` (also for
    // library users, who never pass through the CLI's checks), naming the field.
    for (config, field) in [
        (
            TrainConfig {
                model: ModelSection {
                    hidden: usize::MAX,
                    ..TrainConfig::MLP.model
                },
                ..TrainConfig::MLP
            },
            "hidden",
        ),
        (
            TrainConfig {
                schedule: ScheduleSection {
                    micro_batch_size: usize::MAX,
                    ..TrainConfig::MLP.schedule
                },
                ..TrainConfig::MLP
            },
            "micro_batch_size",
        ),
        (
            TrainConfig {
                model: ModelSection {
                    layers_per_stage: 100_000_000,
                    ..TrainConfig::MLP.model
                },
                ..TrainConfig::MLP
            },
            "layers_per_stage",
        ),
    ] {
        let err = Trainer::new(config).unwrap_err();
        assert!(matches!(err, TrainError::Config(_)), "{err}");
        assert!(err.to_string().contains(field), "{err}");
    }
    // The default run fits with room to spare.
    let memory = TrainConfig::MLP.memory_bytes();
    assert!(memory.parameters < (1 << 30) && memory.activations < (1 << 30));
}

#[test]
fn default_configuration_builds() {
    let config = TrainConfig::MLP;
    assert_eq!(config.schedule.kind, ScheduleKind::DualPipe);
    assert_eq!(config.schedule.ranks, 4);
    assert_eq!(config.model_stages(), 4);
    let trainer = Trainer::new(config).unwrap();
    assert_eq!(trainer.schedule().ranks, 4);
    assert_eq!(trainer.parameters().len(), 4);
    // The embedded default is the GPT on the addition task: 4 stages of 2 blocks.
    let gpt = Trainer::new(TrainConfig::DEFAULT).unwrap();
    assert_eq!(gpt.config().model.kind, ModelKind::Gpt);
    assert_eq!(gpt.parameters().len(), 4);
    assert_eq!(gpt.workload().gpt().unwrap().weights.config().layers, 8);
}

#[test]
fn names_round_trip() {
    for name in DType::NAMES {
        assert_eq!(DType::from_name(name).unwrap().name(), name);
    }
    assert!(DType::from_name("bf8").is_none());
    assert_eq!(DType::from_name("BF16"), Some(DType::Bf16));
}
