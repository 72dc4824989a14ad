use clap::Parser;

use super::*;
use dualpipe_schedule::ScheduleKind;
use dualpipe_train::{DType, OptimizerKind};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn parse(flags: &[&str]) -> Args {
    let mut argv = vec!["train"];
    argv.extend_from_slice(flags);
    Cli::try_parse_from(argv).expect("flags parse").args
}

#[test]
fn defaults_come_from_the_train_config() {
    assert_eq!(
        config_and_schedule(&parse(&[])).unwrap().0,
        TrainConfig::default()
    );
}

#[test]
fn help_shows_the_config_defaults() {
    use clap::CommandFactory;
    let help = Cli::command().render_long_help().to_string();
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
    let (c, _) = config_and_schedule(&parse(&[
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
    ]))
    .unwrap();
    assert_eq!(c.schedule, ScheduleKind::OneFOneB);
    assert_eq!(
        (c.ranks, c.micro_batches, c.micro_batch_size, c.hidden),
        (2, 6, 8, 16)
    );
    assert_eq!((c.layers_per_stage, c.steps, c.seed), (1, 3, 7));
    assert_eq!(c.lr, 0.01);
    assert_eq!(c.optimizer, OptimizerKind::sgd());
    assert_eq!(c.dtype, DType::F64);
}

#[test]
fn interleaved_defaults_to_two_virtual_stages() {
    let (c, _) = config_and_schedule(&parse(&["--schedule", "interleaved"])).unwrap();
    assert_eq!(c.virtual_stages, 2);
}

#[test]
fn bad_flags_are_usage_errors_naming_the_flag() {
    let cases: [(&[&str], &str); 17] = [
        (&["--schedule", "zigzag"], "--schedule"),
        (&["--optimizer", "lion"], "--optimizer"),
        (&["--dtype", "f16"], "--dtype"),
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
    ];
    for (flags, flag) in cases {
        let err = config_and_schedule(&parse(flags)).unwrap_err();
        assert!(err.0.contains(flag), "{flags:?}: {}", err.0);
    }
}

#[test]
fn a_tiny_run_writes_its_summary_and_files() {
    let dir = std::env::temp_dir().join(format!("dualpipe-train-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (trace_path, svg_path, out_path) =
        (dir.join("t.json"), dir.join("t.svg"), dir.join("s.json"));
    let mut args = parse(&[
        "--model",
        "mlp",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--micro-batch-size",
        "4",
        "--hidden",
        "8",
        "--layers-per-stage",
        "1",
        "--steps",
        "3",
        "--format",
        "json",
        "--quiet",
    ]);
    args.trace = Some(trace_path.clone());
    args.svg = Some(svg_path.clone());
    args.output = Some(out_path.clone());
    run(args).unwrap();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    assert_eq!(summary["losses"].as_array().unwrap().len(), 3);
    assert_eq!(summary["final_loss"], summary["losses"][2]);
    for key in [
        "samples_per_second",
        "step_seconds_median",
        "bubble_ratio",
        "comm_wait_seconds",
    ] {
        assert!(summary[key].as_f64().unwrap() >= 0.0, "{key}");
    }
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
    assert!(trace.is_object() || trace.is_array());
    assert!(std::fs::read_to_string(&svg_path)
        .unwrap()
        .starts_with("<svg"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_configuration_the_schedule_rejects_is_a_usage_error() {
    let err = execute(&parse(&["--ranks", "3", "--quiet"])).unwrap_err();
    assert!(err.downcast_ref::<UsageError>().is_some(), "{err:#}");
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
        let err = execute(&parse(flags)).unwrap_err();
        let usage = err.downcast_ref::<UsageError>().expect("a usage error");
        assert!(usage.0.contains(flag), "{flags:?}: {}", usage.0);
    }
}

#[cfg(not(feature = "mpi"))]
#[test]
fn mpi_without_the_feature_says_how_to_build_it() {
    let err = execute(&parse(&["--transport", "mpi"])).unwrap_err();
    let usage = err.downcast_ref::<UsageError>().expect("a usage error");
    assert!(usage.0.contains("--features mpi"), "{}", usage.0);
}

#[test]
fn a_first_step_that_overflows_blames_the_inputs_not_the_learning_rate() {
    let config = TrainConfig::default();
    let first = dualpipe_train::Divergence {
        step: 0,
        loss: f64::INFINITY,
        lr: 1e-3,
    };
    let text = run_error(TrainError::Diverged(first), &config).to_string();
    assert!(
        text.contains("overflow") && !text.contains("lower the learning rate"),
        "{text}"
    );
    let later = dualpipe_train::Divergence {
        step: 4,
        loss: f64::NAN,
        lr: 1e300,
    };
    let text = run_error(TrainError::Diverged(later), &config).to_string();
    assert!(
        text.contains("diverged at step 5") && text.contains("--lr 1e300"),
        "{text}"
    );
}
