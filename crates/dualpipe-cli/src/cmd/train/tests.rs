use super::*;

fn parse(flags: &[&str]) -> TrainArgs {
    TrainArgs::try_parse_flags(flags).expect("flags parse")
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
