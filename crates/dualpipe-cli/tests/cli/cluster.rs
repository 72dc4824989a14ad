//! `dualpipe cluster trace / simulate`: seeded traces, metrics as JSON, the same bytes for the
//! same trace, one-line errors with exit code 2 on bad input.

use std::path::{Path, PathBuf};

use crate::{dualpipe, s, TempDir};

fn data(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/cluster");
    root.join(name).display().to_string()
}

#[test]
fn a_seeded_trace_simulates_under_static_fifo_and_elastic() {
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
    assert!(
        t.stderr.contains("120 jobs, offered load ") && t.stderr.contains("on 16 devices"),
        "{}",
        t.stderr
    );
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
    for policy in ["static", "fifo", "elastic"] {
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
            "window_utilization",
            "useful_utilization",
            "mean_jct_s",
            "p95_jct_s",
            "mean_queue_s",
            "fragmentation",
            "migrations",
            "migration_overhead",
            "makespan_s",
            "makespan_bound_s",
            "bound_share",
            "waiting_fragmentation",
            "middle_mean_queue_s",
        ] {
            assert!(m.get(key).is_some(), "{key} missing: {m}");
        }
        // Above 1 where jobs ran grown past their request or on faster devices (speed 2 here).
        let share = m["bound_share"].as_f64().unwrap();
        assert!(share > 0.0 && share.is_finite(), "bound_share = {share}");
        for key in ["utilization", "window_utilization", "useful_utilization"] {
            let u = m[key].as_f64().unwrap();
            assert!(u > 0.0 && u <= 1.0, "{key} = {u}");
        }
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

/// deploy/cluster's manifests are `cluster manifests`' output for its placement, byte for
/// byte (so they cannot drift from the code; scripts/deploy_check.sh validates them).
#[test]
fn the_committed_manifests_are_the_generated_ones() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/cluster");
    let dir = TempDir::new("cluster-manifests");
    let placement = root.join("placement.json");
    dualpipe([
        "cluster",
        "manifests",
        "--placement",
        s(&placement),
        "--output-dir",
        s(dir.path()),
    ])
    .ok();
    for name in ["mpijob-dualpipe-llm-a.yaml", "mpijob-dualpipe-small-b.yaml"] {
        let made = std::fs::read_to_string(dir.join(name)).unwrap();
        let kept = std::fs::read_to_string(root.join(name)).unwrap();
        assert_eq!(made, kept, "{name}: regenerate deploy/cluster with `dualpipe cluster manifests --placement deploy/cluster/placement.json --output-dir deploy/cluster`");
    }
    // To stdout: the same documents, each after `---`.
    let out = dualpipe(["cluster", "manifests", "--placement", s(&placement)]);
    out.ok();
    assert_eq!(out.stdout.matches("---\n").count(), 2);
    assert!(out.stdout.contains("kind: \"MPIJob\""));
}

/// A simulation's placement at a time feeds `cluster manifests`; bad placements are one line.
#[test]
fn a_simulated_placement_becomes_manifests_and_bad_ones_are_refused() {
    let dir = TempDir::new("cluster-placement");
    let trace = dir.write("t.csv", "big,0,8,100\nsmall,0,4,100\n");
    let placement_at = |policy: &str, at: &str, out: &Path| {
        dualpipe([
            "cluster",
            "simulate",
            "--cluster",
            &data("small.json"),
            "--trace",
            s(&trace),
            "--policy",
            policy,
            "--placement-at",
            at,
            "--placement-out",
            s(out),
        ])
    };
    let placement = dir.join("p.json");
    placement_at("static", "20", &placement).ok();
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&placement).unwrap()).unwrap();
    assert_eq!(p["time_s"], 20.0);
    assert_eq!(p["jobs"].as_array().unwrap().len(), 2, "{p}");
    let yaml = dualpipe(["cluster", "manifests", "--placement", s(&placement)]);
    yaml.ok();
    assert!(
        yaml.stdout.contains("name: \"dualpipe-big\""),
        "{}",
        yaml.stdout
    );
    let uneven = dir.write(
        "uneven.json",
        r#"{"jobs": [{"job": "x", "nodes": [{"node": "a-0", "devices": 3}, {"node": "a-1", "devices": 1}]}]}"#,
    );
    dualpipe(["cluster", "manifests", "--placement", s(&uneven)]).usage_error(&[
        "uneven.json",
        "uneven placement",
        "same devices on each node",
    ]);
    let bad = dir.write("bad.json", r#"{"jobs": [{"job": "x", "nodes": []}]}"#);
    dualpipe(["cluster", "manifests", "--placement", s(&bad)]).usage_error(&["no nodes"]);
    dualpipe([
        "cluster",
        "manifests",
        "--placement",
        s(&bad),
        "--output-dir",
        s(&dir.join("missing")),
    ])
    .usage_error(&[]);
    // A negative time, and a time after the run (no placement: it wrote an empty one), are
    // refused and write nothing.
    let late = dir.join("late.json");
    for (at, needles) in [
        ("-1", &["--placement-at -1"][..]),
        (
            "1e300",
            &["--placement-at 1e300", "no job holds a device then"],
        ),
    ] {
        placement_at("las", at, &late).usage_error(needles);
    }
    assert!(!late.exists());
}
