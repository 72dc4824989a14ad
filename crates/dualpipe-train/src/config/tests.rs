//! The configuration's tests: its one check, its JSON, its memory estimate.

use super::*;

#[test]
fn json_round_trips_and_missing_members_take_defaults() {
    let config = TrainConfig {
        model: ModelSection {
            dtype: DType::F64,
            ..TrainConfig::DEFAULT.model
        },
        schedule: ScheduleSection {
            kind: ScheduleKind::Zb1p,
            ..TrainConfig::DEFAULT.schedule
        },
        optimizer: OptimizerSection {
            kind: OptimizerKind::sgd(),
            ..TrainConfig::DEFAULT.optimizer
        },
        ..TrainConfig::default()
    };
    let text = serde_json::to_string(&config).unwrap();
    assert!(text.contains("\"schedule\":\"zb1p\""), "{text}");
    assert_eq!(serde_json::from_str::<TrainConfig>(&text).unwrap(), config);
    let partial: TrainConfig = serde_json::from_str(r#"{"ranks": 2}"#).unwrap();
    assert_eq!(
        partial,
        TrainConfig {
            schedule: ScheduleSection {
                ranks: 2,
                ..TrainConfig::DEFAULT.schedule
            },
            ..TrainConfig::default()
        }
    );
    assert!(
        !text.contains("half_projections"),
        "written only when on: {text}"
    );
    let on = TrainConfig {
        model: ModelSection {
            dtype: DType::Bf16,
            half_projections: true,
            ..TrainConfig::DEFAULT.model
        },
        ..TrainConfig::default()
    };
    let text = serde_json::to_string(&on).unwrap();
    assert!(text.contains("\"half_projections\":true"), "{text}");
    assert_eq!(serde_json::from_str::<TrainConfig>(&text).unwrap(), on);
    assert!(serde_json::from_str::<TrainConfig>(r#"{"schedule": "zigzag"}"#).is_err());
    assert!(serde_json::from_str::<TrainConfig>(r#"{"rank": 2}"#).is_err());
}

#[test]
fn json_stays_one_flat_object_in_the_members_order_it_always_had() {
    let text = serde_json::to_string(&TrainConfig::DEFAULT).unwrap();
    let order = [
        "model",
        "schedule",
        "ranks",
        "micro_batches",
        "micro_batch_size",
        "virtual_stages",
        "hidden",
        "layers_per_stage",
        "d_model",
        "heads",
        "seq_len",
        "data",
        "task",
        "validation_fraction",
        "eval_every",
        "shuffle",
        "init_from",
        "clip_grad",
        "steps",
        "lr",
        "optimizer",
        "dtype",
        "seed",
        "recv_timeout",
        "data_parallel",
        "bucket_mb",
        "overlap",
        "gradient_compression",
        "error_feedback",
        "moe",
    ];
    let at: Vec<usize> = order
        .iter()
        .map(|k| {
            text.find(&format!("\"{k}\":"))
                .unwrap_or_else(|| panic!("{k}: {text}"))
        })
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
    assert!(text.starts_with("{\"model\":\"gpt\",\"schedule\":\"dualpipe\",\"ranks\":4,"));
    // No section is named: `parallelism`, `transport` never appear.
    for section in ["parallelism", "transport", "kind", "path"] {
        assert!(!text.contains(&format!("\"{section}\"")), "{text}");
    }
}

#[test]
fn one_bit_adam_warms_up_in_int8_for_six_steps_and_refreshes_on_doubling_steps() {
    let one_bit = TrainConfig {
        parallelism: ParallelismSection {
            data_parallel: 2,
            gradient_compression: Compression::OneBit,
            ..TrainConfig::DEFAULT.parallelism
        },
        ..TrainConfig::default()
    };
    assert_eq!(
        one_bit.compression_warmup_steps(),
        6,
        "300 / 50, rounded up"
    );
    assert_eq!(one_bit.one_bit_adam_from(), Some(6));
    assert_eq!(one_bit.variance_refresh_every(), 12);
    assert!(one_bit.variance_refresh_doubling());
    let ex = one_bit.exchange_config();
    assert_eq!(ex.compression_warmup, 6);
    assert_eq!(ex.warmup_compression, Compression::Int8);
    assert_eq!((ex.refresh_every, ex.refresh_doubling), (12, true));
    let int8_steps: Vec<u64> = (0..300)
        .filter(|&s| ex.compression_at(s) == Compression::Int8)
        .map(|s| s + 1)
        .collect();
    // The byte goal (96% fewer over the run) leaves room for at most 11 int8 steps.
    assert_eq!(int8_steps, [1, 2, 3, 4, 5, 6, 12, 24, 48, 96, 192]);
    assert!(!ex.feedback_at(5) && ex.feedback_at(6) && !ex.feedback_at(11));
    // The optimizer refreshes on the same steps: frozen on every other step after the
    // warm-up (checked on its own in dualpipe-nn's optim tests).
    assert_eq!(one_bit.new_optimizer().variance_frozen_from(), Some(6));
    // A given period recurs, without doubling; 0 keeps the variance frozen.
    let every = TrainConfig {
        parallelism: ParallelismSection {
            variance_refresh: Some(42),
            compression_warmup: Some(75),
            ..one_bit.parallelism.clone()
        },
        ..one_bit.clone()
    };
    let ex = every.exchange_config();
    assert_eq!((ex.refresh_every, ex.refresh_doubling), (42, false));
    let int8_steps = (0..300)
        .filter(|&s| ex.compression_at(s) == Compression::Int8)
        .count();
    // Steps 1-75, then 84, 126, 168, 210, 252 and 294 (1-based).
    assert_eq!(int8_steps, 75 + 6, "the warm-up and six refreshes");
    let frozen = TrainConfig {
        parallelism: ParallelismSection {
            variance_refresh: Some(0),
            ..one_bit.parallelism.clone()
        },
        ..one_bit.clone()
    };
    assert_eq!(frozen.exchange_config().refresh_every, 0);
    let short = TrainConfig {
        steps: 3,
        ..one_bit.clone()
    };
    assert_eq!(short.one_bit_adam_from(), Some(1), "at least one step");
    // `--compression-warmup 0`: the gradient compressed from the first step, as before.
    let none = TrainConfig {
        parallelism: ParallelismSection {
            compression_warmup: Some(0),
            ..one_bit.parallelism.clone()
        },
        ..one_bit.clone()
    };
    assert_eq!(none.one_bit_adam_from(), None);
    assert_eq!(none.exchange_config().compression_warmup, 0);
    let given = TrainConfig {
        parallelism: ParallelismSection {
            compression_warmup: Some(120),
            ..one_bit.parallelism.clone()
        },
        ..one_bit.clone()
    };
    assert_eq!(given.one_bit_adam_from(), Some(120));
    assert_eq!(
        given.variance_refresh_every(),
        240,
        "refreshes from twice the warm-up"
    );
    // No default warm-up for int8 and bf16, SGD, or one replica.
    for other in [
        TrainConfig {
            parallelism: ParallelismSection {
                gradient_compression: Compression::Int8,
                ..one_bit.parallelism.clone()
            },
            ..one_bit.clone()
        },
        TrainConfig {
            optimizer: OptimizerSection {
                kind: OptimizerKind::sgd(),
                ..one_bit.optimizer.clone()
            },
            ..one_bit.clone()
        },
        TrainConfig {
            parallelism: ParallelismSection {
                data_parallel: 1,
                ..one_bit.parallelism.clone()
            },
            ..one_bit.clone()
        },
    ] {
        assert_eq!(other.compression_warmup_steps(), 0);
        assert_eq!(other.one_bit_adam_from(), None);
    }
    // The resolved default is not written; a given warm-up is.
    let text = serde_json::to_string(&one_bit).unwrap();
    assert!(!text.contains("compression_warmup"), "{text}");
    let text = serde_json::to_string(&given).unwrap();
    assert!(text.contains("\"compression_warmup\":120"), "{text}");
    assert_eq!(serde_json::from_str::<TrainConfig>(&text).unwrap(), given);
}

#[test]
fn messages_name_fields_or_flags() {
    let config = TrainConfig {
        schedule: ScheduleSection {
            micro_batch_size: 0,
            ..TrainConfig::DEFAULT.schedule
        },
        ..TrainConfig::default()
    };
    let fields = config.check(Naming::Fields, 1).unwrap_err().to_string();
    let flags = config.check(Naming::Flags, 1).unwrap_err().to_string();
    assert!(fields.contains("micro_batch_size is 0"), "{fields}");
    assert!(flags.contains("--micro-batch-size is 0"), "{flags}");
}

#[test]
fn a_bad_recv_timeout_states_the_range_in_short_numbers() {
    for (timeout, shown) in [(1e300, "1e300"), (0.0, "0"), (-5.0, "-5"), (2e9, "2e9")] {
        let config = TrainConfig {
            transport: TransportSection {
                recv_timeout: timeout,
                ..TrainConfig::DEFAULT.transport
            },
            ..TrainConfig::default()
        };
        let err = config.check(Naming::Flags, 1).unwrap_err().to_string();
        assert!(
            err.contains(&format!("--recv-timeout {shown}: "))
                && err.contains("less than 1e9 seconds"),
            "{err}"
        );
        assert!(err.len() < 200, "{err}");
    }
}

#[test]
fn memory_is_checked_against_the_cap_and_the_machine() {
    // 68 GB of parameters: under the cap, over a machine with 16 GiB available.
    let wide = TrainConfig {
        model: ModelSection {
            hidden: 8192,
            layers_per_stage: 1,
            ..TrainConfig::MLP.model
        },
        schedule: ScheduleSection {
            micro_batch_size: 1,
            micro_batches: 4,
            ..TrainConfig::MLP.schedule
        },
        ..TrainConfig::MLP
    };
    assert!(wide.check_memory(Naming::Flags, 1, None).is_ok());
    let err = wide
        .check_memory(Naming::Flags, 1, Some(16 << 30))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--hidden 8192") && err.contains("16 GiB"),
        "{err}"
    );
    // Spread over 8 processes, each holds an eighth.
    assert!(wide.check_memory(Naming::Flags, 8, Some(16 << 30)).is_ok());
    // A million rows a micro-batch: activations, naming --micro-batch-size.
    let rows = TrainConfig {
        schedule: ScheduleSection {
            micro_batch_size: 1_000_000,
            ..TrainConfig::MLP.schedule
        },
        ..TrainConfig::MLP
    };
    let err = rows
        .check_memory(Naming::Flags, 1, Some(16 << 30))
        .unwrap_err()
        .to_string();
    assert!(err.contains("use a smaller --micro-batch-size"), "{err}");
    let many = TrainConfig {
        schedule: ScheduleSection {
            micro_batches: 1 << 40,
            micro_batch_size: 1,
            ..TrainConfig::MLP.schedule
        },
        ..TrainConfig::MLP
    };
    let err = many
        .check_memory(Naming::Flags, 1, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("use fewer --micro-batches"), "{err}");
    let huge = TrainConfig {
        schedule: ScheduleSection {
            micro_batch_size: 100_000_000,
            ..TrainConfig::MLP.schedule
        },
        ..TrainConfig::MLP
    };
    let err = huge.check_memory(Naming::Fields, 1, None).unwrap_err();
    assert!(err.to_string().contains("micro_batch_size"), "{err}");
}

#[test]
fn steps_are_capped_and_the_mlp_default_is_six_hundred() {
    assert_eq!(TrainConfig::MLP.steps, 600);
    assert_eq!(TrainConfig::default().model.kind, ModelKind::Gpt);
    let many = TrainConfig {
        steps: 1_000_000_000_000,
        ..TrainConfig::default()
    };
    let err = many.validate().unwrap_err().to_string();
    assert!(err.contains("steps 1000000000000"), "{err}");
}
