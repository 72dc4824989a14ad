//! `dualpipe cluster serve` end to end, with real `train` processes on 4 local slots in 2
//! nodes of 2: an elastic job shrunk (a resize) to admit a 2-rank job, then migrated to
//! empty a node for it (a migration), then grown back (a resize); the scheduler killed with
//! SIGKILL and restarted; a job's process killed (a crash) and resumed. Every job finishes,
//! every step is in its run log once, and the f64 losses are the unmoved runs': bit for bit
//! on the same rank count, within 1e-10 across rank counts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{dualpipe, floats, s, TempDir};

/// A running `dualpipe cluster serve`.
struct Serve {
    child: Option<Child>,
}

impl Serve {
    fn start(state: &Path, addr: &str, out: &Path) -> Serve {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_dualpipe"))
            .args([
                "cluster",
                "serve",
                "--slots",
                "4",
                "--node-size",
                "2",
                "--state",
                s(state),
                "--addr",
                addr,
                "--tick",
                "0.05",
                "--scrape-interval",
                "0.1",
                "--overhead-budget",
                "1",
                "--move-cost-s",
                "0.01",
                "--stop-grace",
                "30",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let serve = Serve { child: Some(child) };
        wait(addr, state, "the scheduler answers", |_| true);
        serve
    }

    /// Ends the scheduler with `signal` and returns its exit status.
    fn end(&mut self, signal: i32) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        unsafe { libc::kill(child.id() as i32, signal) };
        child.wait().unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// The scheduler's jobs (`list --format json`), or `None` while it does not answer.
pub(crate) fn jobs(addr: &str, state: &Path) -> Option<Vec<Value>> {
    let r = dualpipe([
        "cluster",
        "list",
        "--addr",
        addr,
        "--state",
        s(state),
        "--format",
        "json",
    ]);
    (r.code == Some(0)).then(|| r.json()["jobs"].as_array().unwrap().clone())
}

/// Polls until `ready` holds of the jobs (60 s at most).
#[track_caller]
pub(crate) fn wait(
    addr: &str,
    state: &Path,
    what: &str,
    ready: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(j) = jobs(addr, state) {
            if ready(&j) {
                return j;
            }
        }
        assert!(
            Instant::now() < deadline,
            "waited 60 s for {what}: {:#?}",
            jobs(addr, state)
        );
        std::thread::sleep(Duration::from_millis(30));
    }
}

fn job<'a>(jobs: &'a [Value], id: &str) -> &'a Value {
    jobs.iter().find(|j| j["id"] == id).unwrap()
}

fn phase(jobs: &[Value], id: &str) -> String {
    job(jobs, id)["phase"].as_str().unwrap().to_string()
}

fn slots(jobs: &[Value], id: &str) -> Vec<u64> {
    job(jobs, id)["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect()
}

/// The tiny f64 MLP job's flags: `steps` steps, a checkpoint every 20.
fn mlp(steps: usize, extra: &[&str]) -> Vec<String> {
    mlp_on("1f1b", steps, extra)
}

/// [`mlp`] under another schedule.
fn mlp_on(schedule: &str, steps: usize, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--model",
        "mlp",
        "--hidden",
        "8",
        "--micro-batch-size",
        "2",
        "--micro-batches",
        "4",
        "--schedule",
        schedule,
        "--dtype",
        "f64",
        "--quiet",
        "--checkpoint-every",
        "20",
        "--steps",
    ]
    .map(String::from)
    .to_vec();
    a.push(steps.to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// `dualpipe cluster VERB --addr ADDR --state STATE REST...`.
pub(crate) fn client(addr: &str, state: &Path, verb: &str, rest: &[&str]) -> crate::Run {
    let mut cmd = vec!["cluster", verb, "--addr", addr, "--state", s(state)];
    cmd.extend(rest);
    dualpipe(cmd)
}

fn submit(addr: &str, state: &Path, name: &str, ranks: &[&str], args: &[String]) -> String {
    let mut cmd: Vec<String> = [
        "cluster",
        "submit",
        "--addr",
        addr,
        "--state",
        s(state),
        "--name",
        name,
    ]
    .map(String::from)
    .to_vec();
    cmd.extend(ranks.iter().map(|s| s.to_string()));
    cmd.push("--".into());
    cmd.extend(args.iter().cloned());
    let r = dualpipe(&cmd);
    r.ok();
    r.stdout.trim().to_string()
}

/// The job's run log: (step, loss) of every record, in order.
fn logged(state: &Path, id: &str) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(state.join("jobs").join(id).join("run.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap())
        })
        .collect()
}

/// The losses of the unmoved run of `args` on `ranks` ranks (checkpoints into `dir`, as the
/// scheduler's runs do: `--checkpoint-every` needs a directory; they do not change a loss).
fn unmoved(args: Vec<String>, ranks: usize, dir: PathBuf) -> Vec<f64> {
    let mut a: Vec<String> = vec!["train".into(), "--format".into(), "json".into()];
    a.extend(args);
    a.extend(["--ranks".to_string(), ranks.to_string()]);
    a.extend(["--checkpoint-dir".to_string(), s(&dir).to_string()]);
    floats(&dualpipe(&a).ok().json()["losses"])
}

/// The processes whose command line names `dir` (this test's own check that nothing is
/// left; the scheduler itself never looks for processes this way).
fn naming(dir: &Path) -> Vec<u32> {
    let needle = dir.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

fn events(out: &PathBuf) -> String {
    std::fs::read_to_string(out).unwrap()
}

#[test]
fn serve_resizes_restarts_and_recovers_without_losing_a_step() {
    const LONG: usize = 6000;
    let dir = TempDir::new("cluster-serve");
    let state = dir.join("state");
    let out = dir.join("serve.log");
    let addr = free_addr();
    let mut serve = Serve::start(&state, &addr, &out);

    // Bad input: one line, exit code 2, nothing queued.
    client(
        &addr,
        &state,
        "submit",
        &["--ranks", "5", "--", "--steps", "3"],
    )
    .usage_error(&["max_ranks 5", "4 slots"]);
    client(
        &addr,
        &state,
        "submit",
        &["--ranks", "1", "--", "--ranks", "2"],
    )
    .usage_error(&["--ranks", "the scheduler sets it"]);
    client(
        &addr,
        &state,
        "submit",
        &["--ranks", "1", "--", "--schedule", "nope"],
    )
    .usage_error(&["nope"]);
    client(&addr, &state, "cancel", &["job-9999"]).usage_error(&["no job job-9999"]);

    // The MLP has 2 blocks: E's first process runs them on 2 ranks (1 block each), and an
    // elastic job's model is that of its first shape; its unmoved run is on 2 ranks. The
    // unmoved runs go on beside the scheduler.
    let e_args = mlp(LONG, &[]);
    let b_args = mlp(LONG, &[]);
    let e_unmoved = {
        let (args, dir) = (
            mlp(LONG, &["--layers-per-stage", "1"]),
            dir.join("e-unmoved"),
        );
        std::thread::spawn(move || unmoved(args, 2, dir))
    };
    let b_unmoved = {
        let (args, dir) = (b_args.clone(), dir.join("b-unmoved"));
        std::thread::spawn(move || unmoved(args, 1, dir))
    };
    // E, elastic on 1-2 ranks and alone, starts on 2 slots of node 0; B and C fill node 1.
    let e = submit(
        &addr,
        &state,
        "elastic",
        &["--min-ranks", "1", "--max-ranks", "2"],
        &e_args,
    );
    let j = wait(&addr, &state, "E running", |j| phase(j, &e) == "running");
    assert_eq!(slots(&j, &e), [0, 1]);
    let b = submit(&addr, &state, "rigid", &["--ranks", "1"], &b_args);
    wait(&addr, &state, "B running", |j| phase(j, &b) == "running");
    let c = submit(&addr, &state, "short", &["--ranks", "1"], &mlp(30, &[]));
    let j = wait(&addr, &state, "C running", |j| phase(j, &c) == "running");
    assert_eq!((slots(&j, &b), slots(&j, &c)), (vec![2], vec![3]));
    // D needs 2 ranks: E shrinks to 1 (a resize) and, once C is done, D takes the two free
    // slots, one in each node (the elastic policy spreads a job no node has room for, and
    // would consolidate it when a node frees).
    let d = submit(&addr, &state, "pair", &["--ranks", "2"], &mlp(20, &[]));
    let j = wait(&addr, &state, "D done", |j| phase(j, &d) == "done");
    assert_eq!(job(&j, &e)["resizes"], 1, "{}", events(&out));
    assert!(
        events(&out).contains(&format!("{d}: started on slots [1, 3]")),
        "{}",
        events(&out)
    );
    // With nobody queued, E grows back to 2 ranks in node 0 (a second resize).
    let j = wait(&addr, &state, "E grown", |j| {
        job(j, &e)["resizes"] == 2 && phase(j, &e) == "running" && job(j, &e)["pause"].is_null()
    });
    assert_eq!(slots(&j, &e), [0, 1]);
    // The scheduler killed outright: its jobs stop at a checkpoint (PR_SET_PDEATHSIG) and
    // the restarted scheduler resumes them from its journal.
    let before = j;
    let status = serve.end(libc::SIGKILL);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    let mut serve = Serve::start(&state, &addr, &out);
    let j = wait(&addr, &state, "E and B resumed", |j| {
        [&e, &b].iter().all(|id| {
            let now = job(j, id);
            now["phase"] == "done"
                || (now["phase"] == "running"
                    && now["attempts"].as_u64() > job(&before, id)["attempts"].as_u64())
        })
    });
    // A crash: B's process killed; resumed from its last checkpoint.
    assert_eq!(
        phase(&j, &b),
        "running",
        "B ended too soon: {}",
        events(&out)
    );
    let pid = job(&j, &b)["pid"].as_u64().unwrap() as i32;
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait(&addr, &state, "B recovered", |j| {
        job(j, &b)["recoveries"].as_array().unwrap().len() == 1
    });
    let j = wait(&addr, &state, "every job done", |j| {
        j.iter().all(|x| x["phase"] == "done")
    });
    assert_eq!(j.len(), 4);
    assert_eq!(
        (
            job(&j, &b)["crashes"].as_u64(),
            job(&j, &b)["migrations"].as_u64()
        ),
        (Some(1), Some(0))
    );
    let metrics =
        dualpipe_http::client::request(&addr, "GET", "/metrics", &[], None, Duration::from_secs(5))
            .unwrap();
    for needle in [
        "dualpipe_cluster_recoveries_total 1\n",
        "dualpipe_cluster_queue_length 0\n",
        "dualpipe_cluster_jobs{phase=\"done\"} 4\n",
    ] {
        assert!(
            metrics.body.contains(needle),
            "{needle} in\n{}",
            metrics.body
        );
    }
    let moved = |name: &str| {
        let line = metrics.body.lines().find(|l| l.starts_with(name)).unwrap();
        line.split(' ').nth(1).unwrap().parse::<f64>().unwrap()
    };
    assert!(moved("dualpipe_cluster_resizes_total ") >= 2.0);
    assert_eq!(serve.end(libc::SIGTERM).code(), Some(0));
    // No process is left holding the state directory.
    assert_eq!(naming(&state), Vec::<u32>::new());

    // Nothing lost: every step logged once, in order; the losses are the unmoved runs'.
    for (id, steps) in [(&e, LONG), (&b, LONG), (&c, 30), (&d, 20)] {
        let steps_logged: Vec<u64> = logged(&state, id).iter().map(|r| r.0).collect();
        assert_eq!(steps_logged, (1..=steps as u64).collect::<Vec<_>>(), "{id}");
    }
    let b_losses: Vec<u64> = logged(&state, &b).iter().map(|r| r.1.to_bits()).collect();
    let b_unmoved: Vec<u64> = b_unmoved
        .join()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    assert_eq!(
        b_losses, b_unmoved,
        "B (restarted, crashed) is bit-identical"
    );
    let e_unmoved = e_unmoved.join().unwrap();
    assert_eq!(e_unmoved.len(), LONG);
    for ((step, got), want) in logged(&state, &e).iter().zip(&e_unmoved) {
        assert!(
            (got - want).abs() <= 1e-10 * want.abs().max(1.0),
            "E step {step}: {got} vs the unmoved {want}"
        );
    }
    let log = events(&out);
    for needle in [
        "resize from slots [0, 1] to [0]",
        "the move paused it",
        "recovered at step",
    ] {
        assert!(log.contains(needle), "missing {needle:?} in\n{log}");
    }
}

#[test]
fn serve_refuses_bad_input_in_one_line() {
    let dir = TempDir::new("cluster-serve-bad");
    let state = dir.join("state");
    let file = dir.write("a-file", "x");
    dualpipe(["cluster", "serve", "--slots", "2", "--state", s(&file)])
        .usage_error(&["--state", "not a directory"]);
    for (flags, needles) in [
        (
            &["--addr", "nowhere"][..],
            &["--addr nowhere", "cannot listen"][..],
        ),
        (&["--tick", "0"], &["--tick 0"]),
        (
            &["--tick", "1e300"],
            &["--tick 1e300", "at most 1e9 seconds"],
        ),
        (&["--overhead-budget", "2"], &["--overhead-budget 2"]),
    ] {
        let mut cmd = vec!["cluster", "serve", "--slots", "2", "--state", s(&state)];
        cmd.extend(flags);
        dualpipe(cmd).usage_error(needles);
    }
    dualpipe(["cluster", "serve", "--slots", "0", "--state", s(&state)])
        .usage_error(&["--slots 0"]);
    // Too many slots is refused before any of them is set up (it aborted out of memory).
    for slots in ["65537", "1000000000000", "18446744073709551615"] {
        dualpipe(["cluster", "serve", "--slots", slots, "--state", s(&state)])
            .usage_error(&[&format!("--slots {slots}"), "from 1 to 65536"]);
    }
    // A second scheduler on the same state directory is refused while the first runs.
    let addr = free_addr();
    let out = dir.join("serve.log");
    let _first = Serve::start(&state, &addr, &out);
    // A rank count the schedule refuses is refused at submission, not by the job's process
    // once placed: dualpipe folds over an even number of ranks.
    client(
        &addr,
        &state,
        "submit",
        &["--ranks", "1", "--", "--steps", "3"],
    )
    .usage_error(&["on 1 ranks", "even number of ranks"]);
    // An elastic job is never resized to such a count: 12 blocks split over 2, 3 and 4 model
    // stages, but dualpipe refuses 3 ranks (it was allowed: [2, 3, 4]).
    let even = mlp_on("dualpipe", 2, &["--layers-per-stage", "6"]);
    let id = submit(
        &addr,
        &state,
        "even",
        &["--min-ranks", "2", "--max-ranks", "4"],
        &even,
    );
    let j = wait(&addr, &state, "the elastic job listed", |j| {
        j.iter().any(|x| x["id"] == id.as_str())
    });
    assert_eq!(job(&j, &id)["allowed"], serde_json::json!([2, 4]));
    dualpipe([
        "cluster",
        "serve",
        "--slots",
        "4",
        "--state",
        s(&state),
        "--addr",
        &free_addr(),
    ])
    .usage_error(&["another `dualpipe cluster serve`"]);
    // Clients: a scheduler that is not there is one line too.
    let r = dualpipe(["cluster", "list", "--addr", &free_addr()]);
    assert_eq!(r.code, Some(1));
    assert_eq!(r.stderr_lines().len(), 1, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("is `dualpipe cluster serve` running there?"),
        "{}",
        r.stderr
    );
    // A submission that never left (no connection) is not called "may or may not be queued".
    let mut args = vec!["cluster", "submit", "--addr"];
    let nobody = free_addr();
    args.push(&nobody);
    args.extend(["--ranks", "1", "--"]);
    let train = mlp(5, &[]);
    args.extend(train.iter().map(String::as_str));
    let r = dualpipe(args);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(
        r.stderr.contains("cannot connect") && !r.stderr.contains("may or may not"),
        "{}",
        r.stderr
    );
}

#[test]
fn serve_on_port_0_says_the_port_it_took() {
    let dir = TempDir::new("cluster-serve-port-0");
    let mut child = Command::new(env!("CARGO_BIN_EXE_dualpipe"))
        .args(["cluster", "serve", "--slots", "1", "--state"])
        .arg(dir.join("state"))
        .args(["--addr", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let serve = Serve { child: Some(child) };
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    assert!(!addr.ends_with(":0"), "{first}");
    // The clients reach it there.
    let state = dir.join("state");
    let r = dualpipe([
        "cluster",
        "list",
        "--addr",
        &addr,
        "--state",
        s(&state),
        "--format",
        "json",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    drop(serve);
}
