//! The scheduler's API and its processes, in process with a launcher of `sh` commands
//! (loopback only): the token, idempotent submissions, a journal that cannot be written,
//! "recovering" answers, and processes known by identity, never by their command line.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dualpipe_cluster::serve::access::token_path;
use dualpipe_cluster::serve::journal::Journal;
use dualpipe_cluster::serve::{
    serve, Identity, JobPaths, JobRecord, JobRequest, Launch, Launcher, Phase, PolicyParams,
    ServeOptions,
};
use dualpipe_http::client::{request, Response};

/// Runs every job as `sleep 300` in its own folder.
struct Sleeper;

impl Launcher for Sleeper {
    fn check(&self, _: &[String], min: usize, max: usize) -> Result<(Vec<usize>, usize), String> {
        Ok(((min..=max).collect(), 1))
    }

    fn command(
        &self,
        _: &JobRecord,
        _: usize,
        paths: &JobPaths,
        _: &str,
    ) -> Result<Launch, String> {
        Ok(Launch {
            program: "sleep".into(),
            args: vec!["300".into()],
            cwd: paths.files.clone(),
        })
    }
}

fn options(state: &Path, stop_grace: f64) -> ServeOptions {
    ServeOptions {
        slots: 4,
        state: state.to_path_buf(),
        addr: "127.0.0.1:0".into(),
        tick: Duration::from_millis(50),
        scrape_interval: Duration::from_secs(1),
        policy: PolicyParams::default(),
        max_restarts: 3,
        stop_grace: Duration::from_secs_f64(stop_grace),
        allow_remote: false,
    }
}

/// Starts a scheduler on a thread of its own; returns it and its address once bound.
fn start(options: ServeOptions, stop: fn() -> Option<i32>) -> (JoinHandle<()>, String) {
    let (tx, rx) = channel();
    let thread = std::thread::spawn(move || {
        let mut say = |line: &str| {
            if let Some(rest) = line.split("http://").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap().to_string());
            }
        };
        serve(options, Arc::new(Sleeper), stop, &mut say).unwrap();
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    (thread, addr)
}

fn call(addr: &str, token: Option<&str>, method: &str, path: &str, body: Option<&str>) -> Response {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .iter()
        .map(|b| ("Authorization", b.as_str()))
        .collect();
    request(addr, method, path, &headers, body, Duration::from_secs(30)).unwrap()
}

fn jobs(addr: &str, token: &str) -> serde_json::Value {
    let r = call(addr, Some(token), "GET", "/jobs", None);
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

/// Polls until `ready` holds of the job list (30 s at most).
#[track_caller]
fn wait(addr: &str, token: &str, ready: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = call(addr, Some(token), "GET", "/jobs", None);
        if r.status == 200 {
            let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
            if ready(&v) {
                return v;
            }
        }
        assert!(Instant::now() < deadline, "waited 30 s: {}", r.body);
        std::thread::sleep(Duration::from_millis(30));
    }
}

static STOP_API: AtomicBool = AtomicBool::new(false);
fn stop_api() -> Option<i32> {
    STOP_API.load(Ordering::Relaxed).then_some(15)
}

#[test]
fn the_api_wants_its_token_and_submissions_are_idempotent_and_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (thread, addr) = start(options(&state, 5.0), stop_api);
    let token = std::fs::read_to_string(token_path(&state)).unwrap();
    let token = token.trim();
    // Ready once its (empty) recovery is over.
    wait(&addr, token, |_| true);
    let job = r#"{"args": ["--steps", "3"], "min_ranks": 1, "max_ranks": 1, "request_id": "r-1"}"#;
    // No token, or a wrong one: 401, and nothing is queued.
    for bad in [None, Some("0".repeat(64))] {
        let r = call(&addr, bad.as_deref(), "POST", "/jobs", Some(job));
        assert_eq!(r.status, 401, "{}", r.body);
        assert_eq!(
            call(&addr, bad.as_deref(), "GET", "/jobs", None).status,
            401
        );
        assert_eq!(
            call(&addr, bad.as_deref(), "DELETE", "/jobs/job-0001", None).status,
            401
        );
    }
    assert_eq!(jobs(&addr, token)["jobs"], serde_json::json!([]));
    // The metrics need no token.
    let m = call(&addr, None, "GET", "/metrics", None);
    assert!(
        m.body.contains("dualpipe_cluster_journal_ok 1\n"),
        "{}",
        m.body
    );
    // A submission sent twice with one request id queues one job.
    let first = call(&addr, Some(token), "POST", "/jobs", Some(job));
    assert_eq!(first.status, 201, "{}", first.body);
    let again = call(&addr, Some(token), "POST", "/jobs", Some(job));
    assert_eq!(again.status, 200, "{}", again.body);
    let id =
        |r: &Response| serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["id"].clone();
    assert_eq!(id(&first), id(&again));
    assert_eq!(jobs(&addr, token)["jobs"].as_array().unwrap().len(), 1);
    // A NUL in an argument is refused at submission.
    let nul = r#"{"args": ["-o", "a\u0000b"], "min_ranks": 1, "max_ranks": 1}"#;
    let r = call(&addr, Some(token), "POST", "/jobs", Some(nul));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("NUL"), "{}", r.body);
    // The journal cannot be written (a folder stands where it goes): changes are refused
    // with 503, and the API and the metrics say so.
    let journal = Journal::path(&state);
    std::fs::remove_file(&journal).unwrap();
    std::fs::create_dir_all(journal.join("blocker")).unwrap();
    let other = r#"{"args": [], "min_ranks": 1, "max_ranks": 1, "request_id": "r-2"}"#;
    let r = call(&addr, Some(token), "POST", "/jobs", Some(other));
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("nothing was"), "{}", r.body);
    let listed = jobs(&addr, token);
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 1);
    assert!(listed["journal_error"].is_string(), "{listed}");
    let m = call(&addr, None, "GET", "/metrics", None);
    assert!(
        m.body.contains("dualpipe_cluster_journal_ok 0\n"),
        "{}",
        m.body
    );
    // Once it can be written again, the same request goes through.
    std::fs::remove_dir_all(&journal).unwrap();
    let r = call(&addr, Some(token), "POST", "/jobs", Some(other));
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(jobs(&addr, token)["journal_error"].is_null());
    STOP_API.store(true, Ordering::Relaxed);
    thread.join().unwrap();
}

static STOP_ID: AtomicBool = AtomicBool::new(false);
fn stop_id() -> Option<i32> {
    STOP_ID.load(Ordering::Relaxed).then_some(15)
}

/// A process in a group of its own that ignores SIGTERM (a job's process that will not stop).
fn stubborn() -> Child {
    Command::new("sh")
        .args(["-c", "trap '' TERM; while :; do sleep 1; done"])
        .process_group(0)
        .spawn()
        .unwrap()
}

#[test]
fn processes_are_known_by_identity_never_by_their_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let state = std::fs::canonicalize(&state).unwrap();
    // An operator follows job-0001's checkpoints (its command line names them).
    let latest = JobPaths::new(&state, "job-0001").checkpoints.join("latest");
    let mut tail = Command::new("tail")
        .arg("-F")
        .arg(&latest)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // A killed scheduler's journal: job-0001 "running" as a pid that is the operator's
    // tail but with another start time (a reused pid), job-0002 running as a process
    // that is provably its own and will not stop.
    let mut own = stubborn();
    let mut journal = Journal::new(4);
    for (seq, pid, start) in [
        (1, tail.id(), Identity::of(tail.id()).unwrap().start + 1),
        (2, own.id(), Identity::of(own.id()).unwrap().start),
    ] {
        let request = JobRequest {
            name: None,
            args: vec![],
            min_ranks: 1,
            max_ranks: 1,
            request_id: None,
        };
        let mut job = JobRecord::new(format!("job-{seq:04}"), seq, request, vec![1], 1, 0.0);
        job.phase = Phase::Running;
        job.slots = vec![seq as usize - 1];
        job.pid = Some(pid);
        job.pid_start = Some(start);
        journal.jobs.push(job);
        journal.next_seq = seq + 1;
    }
    journal.save(&state).unwrap();
    let (thread, addr) = start(options(&state, 2.0), stop_id);
    let token = std::fs::read_to_string(token_path(&state)).unwrap();
    // While it waits for its own process: "recovering", nothing changed.
    let r = call(&addr, Some(token.trim()), "GET", "/jobs", None);
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("recovering"), "{}", r.body);
    // After the grace its own process group is killed, both jobs run again...
    let v = wait(&addr, token.trim(), |v| {
        v["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["phase"] == "running")
    });
    assert_eq!(own.wait().unwrap().signal(), Some(libc::SIGKILL));
    // ... the operator's tail is untouched, and job-0001 did not wait for it.
    assert_eq!(
        tail.try_wait().unwrap(),
        None,
        "the operator's tail was ended"
    );
    let new_pids: Vec<u64> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["pid"].as_u64().unwrap())
        .collect();
    assert!(!new_pids.contains(&(tail.id() as u64)), "{new_pids:?}");
    // Only the proven process was waited for and killed.
    let events = std::fs::read_to_string(state.join("events.log")).unwrap();
    assert!(!events.contains("job-0001: its process"), "{events}");
    assert!(
        events.contains("job-0002: its process") && events.contains("killing its process group"),
        "{events}"
    );
    STOP_ID.store(true, Ordering::Relaxed);
    thread.join().unwrap();
    assert_eq!(
        tail.try_wait().unwrap(),
        None,
        "the operator's tail was ended"
    );
    tail.kill().unwrap();
    tail.wait().unwrap();
}
