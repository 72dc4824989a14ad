//! The flags of `dualpipe train`, the configuration and the job they become, and the job's
//! messages in flag words.

use dualpipe_schedule::ScheduleKind;
use dualpipe_train::job::{divergence, rank_addr, Failure, Finished, Job};
use dualpipe_train::OptimizerSection;
use dualpipe_train::{DType, Divergence, Naming, OptimizerKind, TrainConfig, TrainError};

use super::{parse_injection, TrainArgs, Transport};

fn parse(flags: &[&str]) -> TrainArgs {
    TrainArgs::try_parse_flags(flags).expect("flags parse")
}

/// The message of a refusal, which must be a configuration error (a usage error in the CLI).
fn config_error(err: TrainError) -> String {
    match err {
        TrainError::Config(msg) => msg,
        other => panic!("not a configuration error: {other}"),
    }
}

#[test]
fn defaults_come_from_the_train_config() {
    assert_eq!(parse(&[]).config().unwrap().0, TrainConfig::default());
}

#[test]
fn help_shows_the_config_defaults() {
    use clap::Args;
    let help = TrainArgs::augment_args(clap::Command::new("train"))
        .render_long_help()
        .to_string();
    let steps = help
        .split("--steps")
        .nth(1)
        .and_then(|rest| rest.split("--lr").next())
        .unwrap_or_default()
        .to_string();
    let expected = format!(
        "[default: {}; {} with --model mlp]",
        TrainConfig::DEFAULT.steps,
        TrainConfig::MLP.steps
    );
    assert!(steps.contains(&expected), "{steps}");
    assert!(help.contains("[default: dualpipe]"), "{help}");
}

#[test]
fn flags_override_defaults() {
    let (c, _) = parse(&[
        "--model",
        "mlp",
        "--schedule",
        "1F1B",
        "--ranks",
        "2",
        "--micro-batches",
        "6",
        "--micro-batch-size",
        "8",
        "--hidden",
        "16",
        "--layers-per-stage",
        "1",
        "--steps",
        "3",
        "--lr",
        "0.01",
        "--optimizer",
        "sgd",
        "--dtype",
        "f64",
        "--seed",
        "7",
    ])
    .config()
    .unwrap();
    assert_eq!(c.schedule.kind, ScheduleKind::OneFOneB);
    assert_eq!(
        (
            c.schedule.ranks,
            c.schedule.micro_batches,
            c.schedule.micro_batch_size,
            c.model.hidden
        ),
        (2, 6, 8, 16)
    );
    assert_eq!((c.model.layers_per_stage, c.steps, c.seed), (1, 3, 7));
    assert_eq!(c.optimizer.lr, 0.01);
    assert_eq!(c.optimizer.kind, OptimizerKind::sgd());
    assert_eq!(c.model.dtype, DType::F64);
}

#[test]
fn half_projections_need_the_gpt_in_mixed_precision() {
    let (c, _) = parse(&["--dtype", "bf16", "--half-projections"])
        .config()
        .unwrap();
    assert!(c.model.half_projections);
    let (c, _) = parse(&["--dtype", "bf16"]).config().unwrap();
    assert!(!c.model.half_projections, "off by default");
}

#[test]
fn interleaved_defaults_to_two_virtual_stages() {
    let (c, _) = parse(&["--schedule", "interleaved"]).config().unwrap();
    assert_eq!(c.schedule.virtual_stages, 2);
}

#[test]
fn bad_flags_are_usage_errors_naming_the_flag() {
    let cases: [(&[&str], &str); 19] = [
        (&["--schedule", "zigzag"], "--schedule"),
        (&["--optimizer", "lion"], "--optimizer"),
        (&["--dtype", "f8"], "--dtype"),
        (&["--ranks", "0"], "--ranks"),
        (&["--lr", "-1"], "--lr"),
        (
            &["--model", "mlp", "--hidden", "18446744073709551615"],
            "--hidden",
        ),
        (&["--model", "transformer"], "--model"),
        (&["--model", "mlp", "--d-model", "8"], "--d-model"),
        (&["--hidden", "8"], "--hidden"),
        (&["--d-model", "0"], "--d-model"),
        (&["--heads", "3"], "--heads"),
        (&["--d-model", "1000000"], "--d-model"),
        (&["--validation-fraction", "1"], "--validation-fraction"),
        (&["--momentum", "0.5"], "--momentum"),
        (
            &["--micro-batch-size", "18446744073709551615"],
            "--micro-batch-size",
        ),
        (&["--ranks", "4096"], "--transport mpi"),
        (&["--steps", "1000000000000"], "--steps"),
        (&["--half-projections"], "--dtype bf16 or f16"),
        (
            &["--model", "mlp", "--dtype", "bf16", "--half-projections"],
            "the mlp in bf16",
        ),
    ];
    for (flags, flag) in cases {
        let err = config_error(parse(flags).config().unwrap_err());
        assert!(err.contains(flag), "{flags:?}: {err}");
    }
}

#[test]
fn the_flags_the_configuration_cannot_hold_are_checked_with_it() {
    let err = config_error(
        parse(&["--checkpoint-dir", "d", "--checkpoint-every", "0"])
            .config()
            .unwrap_err(),
    );
    assert!(err.contains("--checkpoint-every 0"), "{err}");
    let err = config_error(
        parse(&["--inject-failure", "1:1:error"])
            .config()
            .unwrap_err(),
    );
    assert!(err.contains("--transport mpi"), "{err}");
}

#[test]
fn an_injected_failure_reads_rank_step_and_how() {
    let injection = parse_injection("2:1:error").unwrap();
    assert_eq!((injection.rank, injection.step), (2, 1));
    for bad in ["2:0:error", "2:1", "2:1:crash", "x:1:exit"] {
        let err = config_error(parse_injection(bad).unwrap_err());
        assert!(err.contains("RANK:STEP:HOW"), "{bad}: {err}");
    }
}

#[test]
fn each_rank_serves_its_own_port() {
    assert_eq!(
        rank_addr("127.0.0.1:9400", 0, Naming::Flags).unwrap(),
        "127.0.0.1:9400"
    );
    assert_eq!(
        rank_addr("127.0.0.1:9400", 3, Naming::Flags).unwrap(),
        "127.0.0.1:9403"
    );
    assert_eq!(
        rank_addr("0.0.0.0:0", 3, Naming::Flags).unwrap(),
        "0.0.0.0:0"
    );
    assert_eq!(
        rank_addr("[::1]:9400", 1, Naming::Flags).unwrap(),
        "[::1]:9401"
    );
    for bad in ["9400", "host:port", ":9400", "h:70000"] {
        let err = config_error(rank_addr(bad, 1, Naming::Flags).unwrap_err());
        assert!(err.contains("HOST:PORT"), "{bad}: {err}");
    }
    assert!(
        config_error(rank_addr("h:65535", 1, Naming::Flags).unwrap_err()).contains("passes 65535")
    );
}

#[test]
fn a_first_step_that_overflows_blames_the_inputs_not_the_learning_rate() {
    let config = TrainConfig::default();
    let first = Divergence {
        step: 0,
        loss: f64::INFINITY,
        lr: 1e-3,
    };
    let text = divergence(&first, &config, Naming::Flags);
    assert!(
        text.contains("overflow") && !text.contains("lower the learning rate"),
        "{text}"
    );
    let later = Divergence {
        step: 4,
        loss: f64::NAN,
        lr: 1e300,
    };
    let text = divergence(&later, &config, Naming::Flags);
    assert!(
        text.contains("diverged at step 5") && text.contains("--lr 1e300"),
        "{text}"
    );
}

#[test]
fn an_sgd_momentum_outside_zero_to_one_is_refused_by_the_one_check() {
    let err = config_error(
        parse(&["--optimizer", "sgd", "--momentum", "1.5"])
            .config()
            .unwrap_err(),
    );
    assert!(
        err.starts_with("--momentum 1.5: it must be in [0, 1)"),
        "{err}"
    );
    let config = TrainConfig {
        optimizer: OptimizerSection {
            kind: OptimizerKind::Sgd { momentum: -0.1 },
            ..TrainConfig::DEFAULT.optimizer
        },
        ..TrainConfig::default()
    };
    let err = config_error(config.validate().unwrap_err());
    assert!(
        err.starts_with("momentum -0.1: it must be in [0, 1)"),
        "{err}"
    );
}

/// The local run of `flags` as `dualpipe train` makes it (configuration, then the run, with
/// no watch and no notes).
fn run_local(flags: &[&str]) -> Result<Finished, Failure> {
    let args = parse(flags);
    let (job, given) = args.job().map_err(|e| Failure::usage(super::message(e)))?;
    Job::run(&job, given, |_, _| Ok(()), &mut |_| {}).map(|f| f.expect("a local job reports"))
}

#[test]
fn a_configuration_the_schedule_rejects_is_a_usage_error() {
    let failure = run_local(&["--ranks", "3", "--quiet"]).unwrap_err();
    assert!(failure.usage, "{failure}");
}

#[test]
fn transport_flags_parse_and_bad_combinations_are_usage_errors() {
    assert_eq!(parse(&[]).transport, Transport::Local);
    assert_eq!(parse(&["--transport", "mpi"]).transport, Transport::Mpi);
    let cases: [(&[&str], &str); 3] = [
        (&["--inject-failure", "1:1:error"], "--inject-failure"),
        (&["--recv-timeout", "0"], "--recv-timeout"),
        (&["--recv-timeout", "nan"], "--recv-timeout"),
    ];
    for (flags, flag) in cases {
        let failure = run_local(flags).unwrap_err();
        assert!(failure.usage, "{flags:?}: {failure}");
        assert!(failure.message.contains(flag), "{flags:?}: {failure}");
    }
}

#[test]
fn a_tiny_local_run_tells_nothing_when_quiet_and_returns_its_summary() {
    let tiny = "--model mlp --ranks 2 --micro-batches 4 --micro-batch-size 4 --hidden 8 \
                --layers-per-stage 1 --steps 3 --quiet";
    let args = parse(&tiny.split_whitespace().collect::<Vec<_>>());
    let (job, given) = args.job().unwrap();
    let mut said = Vec::new();
    let finished = Job::run(&job, given, |_, _| Ok(()), &mut |line| {
        said.push(line.to_string())
    })
    .unwrap()
    .unwrap();
    assert_eq!(finished.summary.losses.len(), 3);
    assert!(finished.weights.is_none() && finished.files(&job.outputs).is_empty());
    assert!(said.is_empty(), "{said:?}");
}
