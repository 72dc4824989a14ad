//! `dualpipe cluster trace / simulate`: seeded traces, metrics as JSON, the same bytes for the
//! same trace, one-line errors with exit code 2 on bad input.

use std::path::PathBuf;

use crate::{dualpipe, s, TempDir};

fn data(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/cluster");
    root.join(name).display().to_string()
}

#[test]
fn a_seeded_trace_simulates_under_both_policies() {
    let dir = TempDir::new("cluster");
    let trace = dir.join("trace.csv");
    let t = dualpipe([
        "cluster",
        "trace",
        "--jobs",
        "120",
        "--seed",
        "5",
        "--devices",
        "16",
        "--output",
        s(&trace),
    ]);
    t.ok();
    let text = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(text.lines().count(), 121);
    let again = dualpipe([
        "cluster",
        "trace",
        "--jobs",
        "120",
        "--seed",
        "5",
        "--devices",
        "16",
    ]);
    again.ok();
    assert_eq!(again.stdout, text);
    let cluster = data("small.json");
    for policy in ["static", "elastic"] {
        let svg = dir.join(&format!("{policy}.svg"));
        let run = || {
            dualpipe([
                "cluster",
                "simulate",
                "--cluster",
                &cluster,
                "--trace",
                s(&trace),
                "--policy",
                policy,
                "--format",
                "json",
                "--svg",
                s(&svg),
            ])
        };
        let a = run();
        a.ok();
        let m = a.json();
        for key in [
            "utilization",
            "mean_jct_s",
            "p95_jct_s",
            "mean_queue_s",
            "fragmentation",
            "migrations",
            "migration_overhead",
            "makespan_s",
        ] {
            assert!(m.get(key).is_some(), "{key} missing: {m}");
        }
        let u = m["utilization"].as_f64().unwrap();
        assert!(u > 0.0 && u <= 1.0, "{u}");
        assert_eq!(m["jobs"], 120);
        assert_eq!(
            run().stdout,
            a.stdout,
            "the same trace gives the same bytes"
        );
        let picture = std::fs::read_to_string(&svg).unwrap();
        assert!(picture.starts_with("<svg") && picture.contains("<rect"));
    }
}

#[test]
fn bad_input_is_one_line_and_exit_code_2() {
    let dir = TempDir::new("cluster-bad");
    let cluster = data("small.json");
    for (row, needle) in [
        ("a,0,0,60", "gpus = 0"),
        ("a,0,17,60", "gpus = 17 but the cluster has 16 devices"),
        ("a,-5,1,60", "arrival_s = -5"),
        ("a,0,1,-60", "duration_s = -60"),
        ("a,0,1,60,,,missing.json", "missing.json"),
    ] {
        let trace = dir.write("t.csv", row);
        dualpipe([
            "cluster",
            "simulate",
            "--cluster",
            &cluster,
            "--trace",
            s(&trace),
            "--policy",
            "elastic",
        ])
        .usage_error(&[needle]);
    }
    let trace = dir.write("t.csv", "a,0,1,60");
    let empty = dir.write(
        "empty.json",
        r#"{"links": {"intra_node": {"latency": 0, "bandwidth": 1},
            "inter_node": {"latency": 0, "bandwidth": 1},
            "inter_datacenter": {"latency": 0, "bandwidth": 1}}, "nodes": []}"#,
    );
    dualpipe([
        "cluster",
        "simulate",
        "--cluster",
        s(&empty),
        "--trace",
        s(&trace),
        "--policy",
        "static",
    ])
    .usage_error(&["no devices"]);
    dualpipe([
        "cluster",
        "simulate",
        "--cluster",
        &cluster,
        "--trace",
        s(&trace),
        "--policy",
        "lottery",
    ])
    .usage_error(&["--policy lottery"]);
    dualpipe(["cluster", "trace", "--jobs", "10", "--load", "-1"]).usage_error(&["load = -1"]);
}
