//! Who may use `dualpipe cluster serve`, what its jobs may touch, and which processes it
//! acts on (issue 55, findings H1 and H2 of probe 3): requests without the token change
//! nothing; a job's outputs stay in its own folder and its inputs under `--data-root`;
//! two schedulers with the same relative `--state` in different folders never touch each
//! other's processes.

use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::cluster_serve::wait;
use crate::{dualpipe, s, TempDir};

/// A `cluster serve` on 127.0.0.1:0 in `cwd`, stopped with SIGTERM when dropped.
struct Serve {
    child: Child,
    addr: String,
}

impl Serve {
    fn start(cwd: &Path, state: &str, extra: &[&str]) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dualpipe"))
            .current_dir(cwd)
            .args(["cluster", "serve", "--slots", "2", "--state", state])
            .args([
                "--addr",
                "127.0.0.1:0",
                "--tick",
                "0.05",
                "--scrape-interval",
                "0.5",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let addr = first
            .split("http://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {first:?}"))
            .to_string();
        Serve { child, addr }
    }

    fn kill(mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
        std::mem::forget(self);
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// The tiny f64 MLP job of docs/cluster.md.
fn mlp(steps: &str) -> Vec<String> {
    "--model mlp --hidden 8 --micro-batch-size 2 --micro-batches 4 --schedule 1f1b --dtype f64 --quiet --checkpoint-every 100 --steps"
        .split(' ')
        .chain([steps])
        .map(String::from)
        .collect()
}

fn submit(addr: &str, state: &Path, train: &[String]) -> crate::Run {
    let mut rest = vec!["--ranks", "1", "--"];
    rest.extend(train.iter().map(String::as_str));
    crate::cluster_serve::client(addr, state, "submit", &rest)
}

fn jobs(addr: &str, state: &Path) -> Vec<Value> {
    crate::cluster_serve::jobs(addr, state).expect("the scheduler answers")
}

#[test]
fn requests_need_the_token_and_jobs_touch_only_their_folder_and_the_data_roots() {
    let dir = TempDir::new("cluster-access");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("corpus.txt"), "hello world ".repeat(100)).unwrap();
    let victim = dir.write("victim.txt", "my notes, do not lose\n");
    std::os::unix::fs::symlink(&victim, data.join("sneaky.txt")).unwrap();
    let serve = Serve::start(dir.path(), "state", &["--data-root", s(&data)]);
    let state = dir.join("state");
    let mode = std::fs::metadata(state.join("token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let addr = serve.addr.clone();

    // No token: one line, exit 2, nothing queued.
    let mut cmd: Vec<String> = ["cluster", "submit", "--addr", &addr, "--ranks", "1", "--"]
        .map(String::from)
        .to_vec();
    cmd.extend(mlp("3"));
    dualpipe(&cmd).usage_error(&["wants its token", "--state DIR"]);
    dualpipe(["cluster", "list", "--addr", &addr]).usage_error(&["wants its token"]);
    assert!(jobs(&addr, &state).is_empty());

    // Outputs outside the job's folder and inputs outside the data roots: refused.
    let outside = s(&victim);
    for (flags, needle) in [
        (vec!["-o", outside], "writes only in its own folder"),
        (
            vec!["--trace", "../../victim.txt"],
            "writes only in its own folder",
        ),
        (
            vec!["--data", "/etc/passwd"],
            "reads only under the scheduler's data roots",
        ),
        (vec!["--data", "corpus.txt"], "give an absolute path"),
    ] {
        let mut train = mlp("3");
        train.extend(flags.iter().map(|f| f.to_string()));
        submit(&addr, &state, &train).usage_error(&[needle]);
    }
    // A relative output is the job's own: `.lock` is in its folder, not the scheduler's.
    let mut train = mlp("3");
    train.extend(["-o".to_string(), ".lock".to_string()]);
    submit(&addr, &state, &train).ok();
    // A link inside a data root that leads out of it is followed, and refused.
    let gpt = "--d-model 32 --heads 4 --seq-len 16 --micro-batch-size 2 --quiet --layers-per-stage 1 --schedule 1f1b --micro-batches 2 --steps 2 --data";
    let mut train: Vec<String> = gpt.split(' ').map(String::from).collect();
    train.push(s(&data.join("sneaky.txt")).to_string());
    submit(&addr, &state, &train).usage_error(&["reads only under the scheduler's data roots"]);
    train.pop();
    train.push(s(&data.join("corpus.txt")).to_string());
    train.extend(["-o".to_string(), "summary.txt".to_string()]);
    submit(&addr, &state, &train).ok();
    wait(&addr, &state, "every job done", |j| {
        j.len() == 2 && j.iter().all(|x| x["phase"] == "done")
    });
    // The outputs are in the jobs' folders; the victim and the lock are untouched.
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "my notes, do not lose\n"
    );
    assert_eq!(std::fs::metadata(state.join(".lock")).unwrap().len(), 0);
    assert!(
        std::fs::metadata(state.join("jobs/job-0001/files/.lock"))
            .unwrap()
            .len()
            > 0
    );
    let summary = std::fs::read_to_string(state.join("jobs/job-0002/files/summary.txt")).unwrap();
    assert!(!summary.is_empty());
    drop(serve);

    // Beyond loopback only with --allow-remote (refused before anything is bound).
    dualpipe([
        "cluster",
        "serve",
        "--slots",
        "1",
        "--state",
        s(&dir.join("st2")),
        "--addr",
        "0.0.0.0:0",
    ])
    .usage_error(&["beyond loopback", "--allow-remote"]);
}

#[test]
fn two_schedulers_with_the_same_relative_state_never_touch_each_others_processes() {
    let dir = TempDir::new("cluster-two-states");
    let (x, y) = (dir.join("x"), dir.join("y"));
    std::fs::create_dir_all(&x).unwrap();
    std::fs::create_dir_all(&y).unwrap();
    let (sx, sy) = (x.join("state"), y.join("state"));
    let long = mlp("4000000");
    let grace = ["--stop-grace", "2"];
    let serve_x = Serve::start(&x, "state", &grace);
    submit(&serve_x.addr, &sx, &long).ok();
    wait(&serve_x.addr, &sx, "X's job-0001 running", |j| {
        j[0]["phase"] == "running"
    });
    let serve_y = Serve::start(&y, "state", &grace);
    submit(&serve_y.addr, &sy, &long).ok();
    // Y's job-0001 is not held back by X's, whose checkpoint path reads the same.
    let before = wait(&serve_y.addr, &sy, "Y's job-0001 running", |j| {
        j[0]["phase"] == "running"
    });
    let y_pid = before[0]["pid"].as_u64().unwrap();
    // X killed outright and restarted: its recovery waits for its own process only.
    serve_x.kill();
    let serve_x = Serve::start(&x, "state", &grace);
    wait(&serve_x.addr, &sx, "X's job-0001 resumed", |j| {
        j[0]["phase"] == "running" && j[0]["attempts"] == 2
    });
    std::thread::sleep(Duration::from_secs(3));
    let after = jobs(&serve_y.addr, &sy);
    assert_eq!(after[0]["pid"].as_u64(), Some(y_pid), "{after:#?}");
    assert_eq!(
        (after[0]["attempts"].as_u64(), after[0]["crashes"].as_u64()),
        (Some(1), Some(0))
    );
    let events = std::fs::read_to_string(sy.join("events.log")).unwrap();
    assert!(!events.contains("crashed"), "{events}");
    drop(serve_x);
    drop(serve_y);
}
