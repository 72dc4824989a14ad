//! Kubernetes manifests for a placement: one Kubeflow `MPIJob` (kubeflow.org/v2beta1, the
//! shape of deploy/k8s/mpijob.yaml) per placed job, its workers pinned to the placed nodes.
//!
//! The MPIJob has one pod template for all its workers, so the placement is expressed per
//! node, not per worker: one worker pod per placed node (`replicas` = nodes), each with the
//! job's devices on that node (`slotsPerWorker`, and the device resource's request), a
//! required node affinity to the placed nodes (`kubernetes.io/hostname In [...]`) and a
//! required pod anti-affinity among the job's workers on `kubernetes.io/hostname`: the
//! workers land exactly on the placed nodes, one each. This is exact when the job holds the
//! same number of devices on each of its nodes; an uneven placement is refused (one
//! template cannot ask for different device counts).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::cluster::MAX_DEVICES;
use crate::ClusterError;

/// A placement: which nodes (by Kubernetes node name) hold how many devices of each job.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodePlacement {
    /// When (simulated seconds) the placement was taken, if it comes from a simulation.
    #[serde(default)]
    pub time_s: Option<f64>,
    /// The placed jobs.
    pub jobs: Vec<PlacedJob>,
}

/// One placed job.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PlacedJob {
    /// The job's name.
    pub job: String,
    /// Its nodes and the devices it holds on each.
    pub nodes: Vec<PlacedNode>,
    /// `dualpipe train`'s flags for it (without `--ranks`, `--transport`, `--metrics-addr`,
    /// `--checkpoint-dir`: the manifest sets them).
    #[serde(default)]
    pub train: Vec<String>,
}

/// A node of a placed job.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PlacedNode {
    /// The Kubernetes node name (`kubernetes.io/hostname`).
    pub node: String,
    /// Devices (ranks) of the job on it.
    pub devices: usize,
}

/// How the manifests are made.
#[derive(Clone, Debug, PartialEq)]
pub struct ManifestOptions {
    /// The container image.
    pub image: String,
    /// The extended resource one device is (`nvidia.com/gpu`).
    pub device_resource: String,
}

impl Default for ManifestOptions {
    fn default() -> Self {
        ManifestOptions {
            image: "dualpipe:latest".into(),
            device_resource: "nvidia.com/gpu".into(),
        }
    }
}

/// The flags a placed job's `train` may not give (the manifest sets them).
const SET_BY_MANIFEST: [&str; 6] = [
    "--ranks",
    "--transport",
    "--metrics-addr",
    "--checkpoint-dir",
    "--resume",
    "--resume-from",
];

/// The placement of a simulation at `time_s`: each job holding devices then, with its
/// devices counted per node (node names from the cluster file), in trace order; refused when
/// no job holds a device then (before the first start, after the last finish).
pub fn placement_at(
    outcome: &crate::Outcome,
    cluster: &crate::Cluster,
    jobs: &[crate::trace::Job],
    time_s: f64,
) -> Result<NodePlacement, ClusterError> {
    let mut held: std::collections::BTreeMap<usize, std::collections::BTreeMap<usize, usize>> =
        Default::default();
    for seg in outcome
        .segments
        .iter()
        .filter(|s| s.start_s <= time_s && time_s < s.end_s)
    {
        let per_node = held.entry(seg.job).or_default();
        for &d in &seg.devices {
            *per_node.entry(cluster.node_of[d]).or_default() += 1;
        }
    }
    if held.is_empty() {
        let (first, last) = outcome.held_span();
        return Err(ClusterError::NodePlacement(format!(
            "no job holds a device then; give a time in the run, from {first:.1} to {last:.1} s"
        )));
    }
    Ok(NodePlacement {
        time_s: Some(time_s),
        jobs: held
            .into_iter()
            .map(|(j, per_node)| PlacedJob {
                job: jobs[j].name.clone(),
                nodes: per_node
                    .into_iter()
                    .map(|(n, devices)| PlacedNode {
                        node: cluster.nodes[n].name.clone(),
                        devices,
                    })
                    .collect(),
                train: Vec::new(),
            })
            .collect(),
    })
}

/// A DNS-1123 name made of `job` (lower case, `-` for anything else, at most 40 bytes).
fn dns_name(job: &str) -> String {
    let mut s: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s.truncate(40);
    let s = s.trim_matches('-').to_string();
    if s.is_empty() {
        "job".into()
    } else {
        s
    }
}

impl NodePlacement {
    /// Reads a placement (JSON), checking every job: a name, at least one node, node names,
    /// at least one device per node, each node once, the same devices on each node.
    pub fn from_json(text: &str) -> Result<NodePlacement, ClusterError> {
        let bad = |m: String| ClusterError::NodePlacement(m);
        let p: NodePlacement = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if p.jobs.is_empty() {
            return Err(bad("no jobs: give at least one placed job".into()));
        }
        let mut names = std::collections::BTreeSet::new();
        for j in &p.jobs {
            if !names.insert(dns_name(&j.job)) {
                return Err(bad(format!(
                    "job {:?}: two jobs share the manifest name dualpipe-{}",
                    j.job,
                    dns_name(&j.job)
                )));
            }
            if j.nodes.is_empty() {
                return Err(bad(format!("job {:?}: no nodes; give at least one", j.job)));
            }
            let mut seen = std::collections::BTreeSet::new();
            for n in &j.nodes {
                if n.node.is_empty()
                    || n.node.len() > 253
                    || n.node.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return Err(bad(format!(
                        "job {:?}: node {:?} is not a Kubernetes node name",
                        j.job, n.node
                    )));
                }
                if n.devices == 0 {
                    return Err(bad(format!(
                        "job {:?}: node {}: devices = 0; give at least 1",
                        j.job, n.node
                    )));
                }
                if n.devices > MAX_DEVICES {
                    return Err(bad(format!(
                        "job {:?}: node {}: devices = {}; a cluster holds at most {MAX_DEVICES} \
                         devices",
                        j.job, n.node, n.devices
                    )));
                }
                if !seen.insert(&n.node) {
                    return Err(bad(format!(
                        "job {:?}: node {} is listed twice",
                        j.job, n.node
                    )));
                }
            }
            let first = j.nodes[0].devices;
            if first.saturating_mul(j.nodes.len()) > MAX_DEVICES {
                return Err(bad(format!(
                    "job {:?}: {} nodes x {first} devices; a cluster holds at most \
                     {MAX_DEVICES} devices",
                    j.job,
                    j.nodes.len()
                )));
            }
            if let Some(n) = j.nodes.iter().find(|n| n.devices != first) {
                return Err(bad(format!(
                    "job {:?}: uneven placement ({} devices on {}, {} on {}); an MPIJob has one worker template, so give the same devices on each node",
                    j.job, first, j.nodes[0].node, n.devices, n.node
                )));
            }
            if let Some(f) = j
                .train
                .iter()
                .find(|a| SET_BY_MANIFEST.contains(&a.split('=').next().unwrap_or(a)))
            {
                return Err(bad(format!(
                    "job {:?}: train flag {f}: the manifest sets it; leave it out",
                    j.job
                )));
            }
        }
        Ok(p)
    }
}

/// The MPIJob of one placed job.
pub fn mpijob(job: &PlacedJob, o: &ManifestOptions) -> Value {
    let name = format!("dualpipe-{}", dns_name(&job.job));
    let per_node = job.nodes[0].devices;
    let ranks = per_node * job.nodes.len();
    let nodes: Vec<&str> = job.nodes.iter().map(|n| n.node.as_str()).collect();
    let mut args: Vec<Value> = vec![
        json!("-n"),
        json!(ranks.to_string()),
        json!("dualpipe"),
        json!("train"),
        json!("--transport"),
        json!("mpi"),
        json!("--ranks"),
        json!(ranks.to_string()),
    ];
    args.extend(job.train.iter().map(|a| json!(a)));
    args.extend([
        json!("--metrics-addr"),
        json!("0.0.0.0:9100"),
        json!("--checkpoint-dir"),
        json!(format!("/checkpoints/{name}")),
        json!("--resume"),
    ]);
    let container_security = json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "capabilities": { "drop": ["ALL"] }
    });
    let labels = |component: &str| {
        json!({
            "app.kubernetes.io/name": "dualpipe",
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/instance": name,
        })
    };
    json!({
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": { "name": name, "labels": { "app.kubernetes.io/name": "dualpipe", "app.kubernetes.io/instance": name } },
        "spec": {
            "slotsPerWorker": per_node,
            "mpiImplementation": "MPICH",
            "sshAuthMountPath": "/home/dualpipe/.ssh",
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": { "cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 86400, "backoffLimit": 0 },
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "Never",
                    "template": {
                        "metadata": { "labels": labels("launcher") },
                        "spec": {
                            "securityContext": { "runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true },
                            "containers": [{
                                "name": "launcher",
                                "image": o.image,
                                "imagePullPolicy": "IfNotPresent",
                                "command": ["mpiexec"],
                                "args": args,
                                "env": [
                                    { "name": "MPIEXEC_PORT_RANGE", "value": "29500:29510" },
                                    { "name": "UCX_TCP_PORT_RANGE", "value": "29500-29510" }
                                ],
                                "securityContext": container_security,
                                "resources": {
                                    "requests": { "cpu": "250m", "memory": "256Mi" },
                                    "limits": { "cpu": "1", "memory": "512Mi" }
                                },
                                "volumeMounts": [{ "name": "tmp", "mountPath": "/tmp" }]
                            }],
                            "volumes": [{ "name": "tmp", "emptyDir": {} }]
                        }
                    }
                },
                "Worker": {
                    "replicas": job.nodes.len(),
                    "restartPolicy": "Never",
                    "template": {
                        "metadata": {
                            "labels": labels("worker"),
                            "annotations": { "prometheus.io/scrape": "true", "prometheus.io/port": "9100", "prometheus.io/path": "/metrics" }
                        },
                        "spec": {
                            "affinity": {
                                "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [{
                                    "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In", "values": nodes }]
                                }] } },
                                "podAntiAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": [{
                                    "labelSelector": { "matchLabels": labels("worker") },
                                    "topologyKey": "kubernetes.io/hostname"
                                }] }
                            },
                            "securityContext": {
                                "runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true, "fsGroup": 1000,
                                "sysctls": [{ "name": "net.ipv4.ip_unprivileged_port_start", "value": "22" }]
                            },
                            "containers": [{
                                "name": "worker",
                                "image": o.image,
                                "imagePullPolicy": "IfNotPresent",
                                "command": ["/usr/sbin/sshd"],
                                "args": ["-De", "-f", "/etc/ssh/sshd_config.dualpipe"],
                                "ports": [
                                    { "name": "ssh", "containerPort": 22, "protocol": "TCP" },
                                    { "name": "metrics", "containerPort": 9100, "protocol": "TCP" }
                                ],
                                "readinessProbe": { "tcpSocket": { "port": "ssh" }, "initialDelaySeconds": 2, "periodSeconds": 5 },
                                "securityContext": container_security,
                                "resources": {
                                    "requests": { "cpu": "4", "memory": "8Gi", o.device_resource.as_str(): per_node.to_string() },
                                    "limits": { "cpu": "4", "memory": "8Gi", o.device_resource.as_str(): per_node.to_string() }
                                },
                                "volumeMounts": [
                                    { "name": "checkpoints", "mountPath": "/checkpoints" },
                                    { "name": "tmp", "mountPath": "/tmp" }
                                ]
                            }],
                            "volumes": [
                                { "name": "checkpoints", "persistentVolumeClaim": { "claimName": "dualpipe-checkpoints" } },
                                { "name": "tmp", "emptyDir": {} }
                            ]
                        }
                    }
                }
            }
        }
    })
}

/// `value` as block YAML (keys in the value's order; strings double-quoted as JSON
/// strings, which YAML reads the same).
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    emit(value, 0, &mut out);
    out
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => serde_json::to_string(s).expect("a string"),
        Value::Object(m) if m.is_empty() => "{}".into(),
        Value::Array(a) if a.is_empty() => "[]".into(),
        other => other.to_string(),
    }
}

fn is_block(v: &Value) -> bool {
    matches!(v, Value::Object(m) if !m.is_empty()) || matches!(v, Value::Array(a) if !a.is_empty())
}

fn emit(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let key = if k
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
                {
                    k.clone()
                } else {
                    scalar(&Value::String(k.clone()))
                };
                if is_block(x) {
                    out.push_str(&format!("{pad}{key}:\n"));
                    emit(x, indent + 2, out);
                } else {
                    out.push_str(&format!("{pad}{key}: {}\n", scalar(x)));
                }
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for x in a {
                if is_block(x) {
                    let mut inner = String::new();
                    emit(x, indent + 2, &mut inner);
                    let inner = inner
                        .strip_prefix(&" ".repeat(indent + 2))
                        .unwrap_or(&inner)
                        .to_string();
                    out.push_str(&format!("{pad}- {inner}"));
                } else {
                    out.push_str(&format!("{pad}- {}\n", scalar(x)));
                }
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_NODES: &str = r#"{"jobs": [{"job": "Big_1", "nodes": [{"node": "gpu-a", "devices": 4}, {"node": "gpu-b", "devices": 4}], "train": ["--steps", "100"]}]}"#;

    #[test]
    fn one_worker_per_placed_node_pinned_there() {
        let p = NodePlacement::from_json(TWO_NODES).unwrap();
        let m = mpijob(&p.jobs[0], &ManifestOptions::default());
        assert_eq!(m["metadata"]["name"], "dualpipe-big-1");
        assert_eq!(m["spec"]["slotsPerWorker"], 4);
        let worker = &m["spec"]["mpiReplicaSpecs"]["Worker"];
        assert_eq!(worker["replicas"], 2);
        let spec = &worker["template"]["spec"];
        let values = &spec["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchExpressions"][0]["values"];
        assert_eq!(values, &json!(["gpu-a", "gpu-b"]));
        assert_eq!(
            spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "4"
        );
        let args =
            &m["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"];
        assert_eq!(args[1], "8");
        assert!(args.as_array().unwrap().contains(&json!("--steps")));
    }

    #[test]
    fn the_yaml_reads_back_as_the_same_value() {
        let p = NodePlacement::from_json(TWO_NODES).unwrap();
        let m = mpijob(&p.jobs[0], &ManifestOptions::default());
        let y = to_yaml(&m);
        assert!(
            y.starts_with("apiVersion: \"kubeflow.org/v2beta1\"\nkind: \"MPIJob\"\n"),
            "{y}"
        );
        assert!(
            y.contains("        - key: \"kubernetes.io/hostname\"\n")
                || y.contains("- key: \"kubernetes.io/hostname\""),
            "{y}"
        );
        assert!(y.contains("emptyDir: {}"));
    }

    #[test]
    fn bad_placements_are_refused_in_one_line() {
        for (text, needle) in [
            (r#"{"jobs": []}"#, "no jobs"),
            (r#"{"jobs": [{"job": "a", "nodes": []}]}"#, "no nodes"),
            (
                r#"{"jobs": [{"job": "a", "nodes": [{"node": "n", "devices": 0}]}]}"#,
                "devices = 0",
            ),
            (
                r#"{"jobs": [{"job": "a", "nodes": [{"node": "n", "devices": 2}, {"node": "m", "devices": 1}]}]}"#,
                "uneven placement",
            ),
            (
                r#"{"jobs": [{"job": "a", "nodes": [{"node": "n", "devices": 1}, {"node": "n", "devices": 1}]}]}"#,
                "listed twice",
            ),
            (
                r#"{"jobs": [{"job": "a", "nodes": [{"node": "n", "devices": 1}], "train": ["--ranks", "2"]}]}"#,
                "the manifest sets it",
            ),
            (
                r#"{"jobs": [{"job": "a", "nodes": [{"node": "n", "devices": 1, "gpus": 1}]}]}"#,
                "unknown field",
            ),
            (
                r#"{"jobs": [{"job": "a", "nodes": [{"node": "n", "devices": 1000000000000000}]}]}"#,
                "at most 65536 devices",
            ),
            (
                r#"{"jobs": [{"job": "a", "nodes": [{"node": "n", "devices": 40000}, {"node": "m", "devices": 40000}]}]}"#,
                "at most 65536 devices",
            ),
        ] {
            let e = NodePlacement::from_json(text).unwrap_err().to_string();
            assert!(e.contains(needle) && !e.contains('\n'), "{e}");
        }
    }
}
