//! `dualpipe plan` on inputs no plan can come from, and on previous plans that are not
//! plans: one sentence per cause, naming the file and the field, before any work.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::{dualpipe, Run, TempDir};

fn data(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/plan");
    root.join(name).display().to_string()
}

/// A topology of `devices` devices, 8 to a node, each with `memory` bytes.
fn topology(devices: usize, memory: f64) -> Value {
    let nodes: Vec<Value> = (0..devices.div_ceil(8))
        .map(|n| {
            json!({"name": format!("n{n}"), "devices": (0..8.min(devices - 8 * n))
                .map(|d| json!({"name": format!("g{d}"), "speed": 1.0, "memory": memory}))
                .collect::<Vec<_>>()})
        })
        .collect();
    json!({"links": {
            "intra_node": {"latency": 5e-6, "bandwidth": 1.5e11},
            "inter_node": {"latency": 2e-5, "bandwidth": 2.5e10},
            "inter_datacenter": {"latency": 0.2, "bandwidth": 1.25e9}},
        "datacenters": [{"name": "dc0", "nodes": nodes}]})
}

/// A profile of `layers` equal layers.
fn profile(layers: usize, f: f64, activation_bytes: f64) -> Value {
    json!({"message_bytes": 1000000, "layers": (0..layers)
        .map(|_| json!({"f": f, "i": f, "w": f, "activation_bytes": activation_bytes,
                        "parameter_bytes": 1e6}))
        .collect::<Vec<_>>()})
}

fn write(dir: &TempDir, name: &str, value: &Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string(value).unwrap()).unwrap();
    path.display().to_string()
}

fn plan(topology: &str, profile: &str, extra: &[&str]) -> Run {
    let mut args = vec!["plan", "--topology", topology, "--profile", profile];
    args.extend_from_slice(extra);
    dualpipe(args)
}

#[test]
fn too_few_layers_for_every_schedule_is_one_sentence_naming_both_files() {
    let dir = TempDir::new("plan-shapes");
    let t = write(&dir, "t512.json", &topology(512, 8e10));
    let p = write(&dir, "p32.json", &profile(32, 1e-3, 1e6));
    let run = plan(&t, &p, &[]);
    run.usage_error(&[
        &format!("no plan fits --topology {t} and --profile {p}"),
        "the profile has 32 layers but every schedule asked for has at least 512 stages",
    ]);
    assert_eq!(run.stderr.matches("every stage needs a layer").count(), 1);
}

#[test]
fn a_cause_shared_by_candidates_is_said_once_with_the_candidates() {
    let dir = TempDir::new("plan-causes");
    // 8 layers on 8 devices of 1 GB; each stage keeps several micro-batches' 1e9 bytes of
    // activations alive: nothing fits, for the same reason at every micro-batch count.
    let t = write(&dir, "t8.json", &topology(8, 1e9));
    let p = write(&dir, "p8.json", &profile(8, 1e-3, 1e9));
    let run = plan(
        &t,
        &p,
        &["--schedules", "1f1b,gpipe", "--micro-batches", "8,16,32"],
    );
    run.usage_error(&[
        "no contiguous partition of the 8 layers into 8 stages fits the devices' memory \
         (1f1b x 8, 16, 32; gpipe x 8, 16, 32 micro-batches)",
    ]);
    assert_eq!(run.stderr.matches("fits the devices' memory").count(), 1);
}

#[test]
fn out_of_scale_inputs_get_advice_for_their_field() {
    let dir = TempDir::new("plan-scale");
    let mut slow_link = topology(8, 8e10);
    slow_link["links"]["inter_node"]["bandwidth"] = json!(1e-308);
    let t = write(&dir, "slow.json", &slow_link);
    plan(&t, &data("gpt32.json"), &[]).usage_error(&[
        &format!("--topology {t}: links.inter_node.bandwidth = 1e-308"),
        "bytes per second",
    ]);
    let mut far = topology(8, 8e10);
    far["links"]["inter_datacenter"]["latency"] = json!(1e308);
    let t = write(&dir, "far.json", &far);
    plan(&t, &data("gpt32.json"), &[])
        .usage_error(&["links.inter_datacenter.latency = 1e308: more than 3600 seconds"]);
    let p = write(&dir, "slowlayers.json", &profile(32, 1e308, 1e6));
    plan(&data("hetero.json"), &p, &[]).usage_error(&[
        &format!("--profile {p}: layers[0].f = 1e308: more than 1e6"),
        "seconds",
    ]);
}

#[test]
fn device_names_with_escapes_slashes_or_nothing_are_refused_with_their_path() {
    let dir = TempDir::new("plan-names");
    for (name, why) in [
        ("\u{1b}[31mred\u{1b}[0m\n", "control character"),
        ("a/b", "'/'"),
        ("", "is empty"),
    ] {
        let mut t = topology(8, 8e10);
        t["datacenters"][0]["nodes"][0]["devices"][0]["name"] = json!(name);
        let t = write(&dir, "named.json", &t);
        let run = plan(&t, &data("gpt32.json"), &[]);
        run.usage_error(&["datacenters[0].nodes[0].devices[0].name = ", why]);
        assert!(!run.stderr.contains('\u{1b}'), "{}", run.stderr);
    }
}

#[test]
fn a_zero_cost_profile_has_a_bubble_ratio_of_at_most_one() {
    let dir = TempDir::new("plan-zero");
    let p = write(&dir, "zero.json", &profile(32, 0.0, 1e6));
    let run = plan(&data("hetero.json"), &p, &["--format", "json"]);
    run.ok();
    for plan in run.json()["plans"].as_array().unwrap() {
        let ratio = plan["bubble_ratio"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&ratio), "{plan}");
    }
}

#[test]
fn a_previous_plan_is_checked_like_a_train_plan() {
    let dir = TempDir::new("plan-previous-bad");
    let good = dir.join("good.json");
    let run = plan(
        &data("hetero.json"),
        &data("gpt32.json"),
        &["--format", "json", "--output", good.to_str().unwrap()],
    );
    run.ok();
    let good: Value = serde_json::from_str(&std::fs::read_to_string(&good).unwrap()).unwrap();
    let spoil = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v["plans"][0]);
        v
    };
    let first = good["plans"][0]["placement"][0]["device"].clone();
    let cases: Vec<(Value, &str)> = vec![
        (
            spoil(&|p| p["schedule"] = json!("bogus")),
            "plans[0].schedule",
        ),
        (spoil(&|p| p["ranks"] = json!(3)), "plans[0].stages"),
        (
            spoil(&|p| p["ranks"] = json!(1u64 << 40)),
            "plans[0].ranks: 1099511627776 is not 1 to 512",
        ),
        (
            spoil(&|p| p["micro_batches"] = json!(0)),
            "plans[0].micro_batches: 0",
        ),
        (
            spoil(&|p| p["virtual_stages"] = json!(7)),
            "plans[0].virtual_stages: 7",
        ),
        (
            spoil(&|p| p["partition"] = json!("weird")),
            "plans[0].partition",
        ),
        (
            spoil(&|p| {
                let s = p["stages"].as_array().unwrap()[..3].to_vec();
                p["stages"] = json!(s);
            }),
            "plans[0].stages: 3 stages listed",
        ),
        (
            spoil(&|p| {
                p["stages"][0]["first_layer"] = json!(5);
                p["stages"][0]["end_layer"] = json!(2);
            }),
            "plans[0].stages[0]: layers 5..2",
        ),
        (
            spoil(&|p| p["stages"][1]["first_layer"] = json!(7)),
            "plans[0].stages[1]",
        ),
        (
            spoil(&|p| p["placement"][1]["device"] = first.clone()),
            "holds two ranks",
        ),
        (
            spoil(&|p| {
                for (i, r) in p["placement"]
                    .as_array_mut()
                    .unwrap()
                    .iter_mut()
                    .enumerate()
                {
                    r["device"] = json!(format!("dc9/none/gpu{i}"));
                }
            }),
            "none of the previous plan's devices",
        ),
        (
            spoil(&|p| p["placement"][0]["layers"] = json!((0..100_000).collect::<Vec<_>>())),
            "plans[0].placement[0].layers: layer 32",
        ),
    ];
    for (previous, want) in cases {
        let path = dir.join("previous.json");
        std::fs::write(&path, serde_json::to_string(&previous).unwrap()).unwrap();
        let run = plan(
            &data("hetero-shrunk.json"),
            &data("gpt32.json"),
            &["--previous", path.to_str().unwrap()],
        );
        run.usage_error(&[&format!("--previous {}: ", path.display()), want]);
    }
}
