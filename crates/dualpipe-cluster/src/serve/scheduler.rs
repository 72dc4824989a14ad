//! The scheduler's loop ([`serve`]): requests, the jobs' processes, their progress and
//! scrapes, the policy's decisions, the journal, and an orderly end.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::access;
use super::api::{Api, Envelope};
use super::journal::{DirLock, Journal};
use super::policy::{plan, Action, PolicyParams};
use super::process::{signal, spawn, Identity, JobPaths, Launcher};
use super::scrape::sample;
use super::spec::{JobRecord, Pause, PauseKind, Phase, StopReason};
use crate::cluster::MAX_DEVICES;
use crate::ClusterError;

/// How a scheduler runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Slots (one rank each).
    pub slots: usize,
    /// The state directory (journal, jobs' checkpoints, logs and output).
    pub state: PathBuf,
    /// The address of the HTTP/JSON API and the metrics (`HOST:PORT`).
    pub addr: String,
    /// Seconds between two decisions.
    pub tick: Duration,
    /// Seconds between two scrapes of each job's metrics.
    pub scrape_interval: Duration,
    /// The policy's parameters.
    pub policy: PolicyParams,
    /// Crashes of one job resumed before it is given up.
    pub max_restarts: u32,
    /// How long the jobs get to write their final checkpoints when the scheduler ends.
    pub stop_grace: Duration,
    /// Listen on an address beyond loopback (the operator's explicit choice: anyone who can
    /// reach it and holds the token may run jobs as the scheduler's user).
    pub allow_remote: bool,
}

/// How long an API thread waits for the loop to take a call.
const API_WAIT: Duration = Duration::from_secs(30);

/// Unix seconds now.
pub(super) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A job's live process.
struct Proc {
    child: Child,
    spawned: SystemTime,
}

/// The running scheduler.
pub(super) struct Scheduler<'a> {
    pub(super) options: ServeOptions,
    launcher: Arc<dyn Launcher>,
    pub(super) journal: Journal,
    procs: BTreeMap<String, Proc>,
    say: &'a mut dyn FnMut(&str),
    events: Option<std::fs::File>,
    started: Instant,
    dirty: bool,
    /// Why the journal could not be written last time, while it cannot.
    pub(super) journal_error: Option<String>,
}

/// Runs the scheduler until `stop` reports a signal: loads (or creates) the journal in
/// `options.state`, resumes the jobs a killed scheduler left, serves the API at
/// `options.addr`, and runs jobs with `launcher`'s commands; tells `say` of every event.
/// At the end every job's process is asked to stop (SIGTERM), given `stop_grace` to write its
/// final checkpoint, then killed; its job is journaled to resume on the next start.
///
/// Call it from the thread that lives as long as the scheduler (see [`spawn`]).
pub fn serve(
    mut options: ServeOptions,
    launcher: Arc<dyn Launcher>,
    stop: fn() -> Option<i32>,
    say: &mut dyn FnMut(&str),
) -> Result<(), ClusterError> {
    let usage = ClusterError::Serve;
    if !(1..=MAX_DEVICES).contains(&options.slots) {
        return Err(ClusterError::Serve(format!(
            "`slots` {}: give from 1 to {MAX_DEVICES} slots",
            options.slots
        )));
    }
    let remote = !access::loopback_only(&options.addr).map_err(usage)?;
    if remote && !options.allow_remote {
        return Err(ClusterError::Serve(format!(
            "`addr` {}: beyond loopback, anyone who reaches it and holds the token runs jobs as \
             this user; give a 127.0.0.1 address, or opt in with `allow_remote`",
            options.addr
        )));
    }
    let _lock = DirLock::take(&options.state).map_err(usage)?;
    // Absolute from here on: the jobs run in folders of their own.
    options.state = std::fs::canonicalize(&options.state)
        .map_err(|e| ClusterError::Serve(format!("`state` {}: {e}", options.state.display())))?;
    let mut journal = Journal::load(&options.state)
        .map_err(usage)?
        .unwrap_or_else(|| Journal::new(options.slots));
    if let Some(j) = journal
        .jobs
        .iter()
        .find(|j| !j.phase.is_final() && j.min_ranks > options.slots)
    {
        return Err(ClusterError::Serve(format!(
            "`slots` {}: {} in `state` {} needs at least {} slots; give `slots` {} or more",
            options.slots,
            j.id,
            options.state.display(),
            j.min_ranks,
            j.min_ranks
        )));
    }
    journal.slots = options.slots;
    let token = access::ensure_token(&options.state).map_err(usage)?;
    let (tx, rx) = channel::<Envelope>();
    let ready = Arc::new(AtomicBool::new(false));
    let api = Arc::new(Api {
        token,
        ready: Arc::clone(&ready),
        calls: tx,
        launcher: Arc::clone(&launcher),
        slots: options.slots,
        wait: API_WAIT,
        checking: AtomicUsize::new(0),
    });
    let limits = dualpipe_http::Limits {
        workers: 4,
        max_body: super::api::MAX_BODY,
        ..dualpipe_http::Limits::default()
    };
    let server = dualpipe_http::Server::start(
        &options.addr,
        "cluster-api",
        limits,
        Arc::new(move |rq: &dualpipe_http::Request| api.handle(rq)),
        Box::new(|line: &str| eprintln!("{line}")),
    )
    .map_err(|e| {
        ClusterError::Serve(format!(
            "`addr` {}: cannot listen: {}; give a free HOST:PORT",
            options.addr, e.reason
        ))
    })?;
    let events = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(options.state.join("events.log"))
        .ok();
    let mut s = Scheduler {
        options,
        launcher,
        journal,
        procs: BTreeMap::new(),
        say,
        events,
        started: Instant::now(),
        dirty: true,
        journal_error: None,
    };
    // The address bound (port 0 asks for a free port: say which).
    let bound = server.addr();
    s.event(&format!(
        "serving {} slots on http://{bound} (state {})",
        s.options.slots,
        s.options.state.display()
    ));
    if remote {
        s.event(&format!(
            "warning: the API listens beyond loopback ({bound}): anyone who reaches it with \
             the token in {} runs jobs as this user, and the token and jobs travel \
             unencrypted",
            access::token_path(&s.options.state).display()
        ));
    }
    s.recover();
    s.save();
    ready.store(true, Ordering::Release);
    let result = s.run(&rx, stop);
    ready.store(false, Ordering::Release);
    s.shutdown();
    // Ends the API at once: no client, and no request still being checked, is waited for.
    drop(server);
    result
}

impl Scheduler<'_> {
    /// Tells of an event (the session log) and appends it to `events.log`.
    pub(super) fn event(&mut self, text: &str) {
        let line = format!("[{:8.3} s] {text}", self.started.elapsed().as_secs_f64());
        (self.say)(&line);
        if let Some(f) = &mut self.events {
            let _ = writeln!(f, "{line}");
        }
    }

    /// Writes the journal; tells once when it cannot, and once when it can again.
    pub(super) fn save(&mut self) -> bool {
        self.dirty = false;
        match self.journal.save(&self.options.state) {
            Ok(()) => {
                if self.journal_error.take().is_some() {
                    self.event("the journal is written again");
                }
                true
            }
            Err(e) => {
                if self.journal_error.is_none() {
                    let text = format!(
                        "warning: cannot journal the state: {e}; submissions and cancels are \
                         refused until it can"
                    );
                    self.event(&text);
                }
                self.journal_error = Some(e);
                false
            }
        }
    }

    pub(super) fn job_mut(&mut self, id: &str) -> Option<&mut JobRecord> {
        self.journal.jobs.iter_mut().find(|j| j.id == id)
    }

    pub(super) fn paths(&self, id: &str) -> JobPaths {
        JobPaths::new(&self.options.state, id)
    }

    fn run(
        &mut self,
        rx: &Receiver<Envelope>,
        stop: fn() -> Option<i32>,
    ) -> Result<(), ClusterError> {
        let mut last_account = Instant::now();
        let mut last_scrape = Instant::now() - self.options.scrape_interval;
        let mut last_save = Instant::now();
        loop {
            let tick_end = Instant::now() + self.options.tick;
            loop {
                let left = tick_end.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left.max(Duration::from_millis(1))) {
                    Ok(envelope) => {
                        if envelope.take() {
                            let answer = self.call(envelope.call);
                            let _ = envelope.reply.send(answer);
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(ClusterError::Serve("the API thread ended".into()))
                    }
                }
                if Instant::now() >= tick_end || stop().is_some() {
                    break;
                }
            }
            if let Some(sig) = stop() {
                self.event(&format!(
                    "signal {sig}: stopping every job at a step boundary"
                ));
                return Ok(());
            }
            self.reap();
            let dt = last_account.elapsed().as_secs_f64();
            last_account = Instant::now();
            self.account(dt);
            self.progress();
            if last_scrape.elapsed() >= self.options.scrape_interval {
                self.scrape();
                last_scrape = Instant::now();
            }
            let actions = plan(
                &self.journal.jobs,
                self.options.slots,
                &self.options.policy,
                unix_now(),
            );
            for action in actions {
                self.apply(action);
            }
            if self.dirty || last_save.elapsed() >= self.options.scrape_interval {
                self.save();
                last_save = Instant::now();
            }
        }
    }

    /// Busy, capacity and stranded slot-seconds, and each running job's run time.
    fn account(&mut self, dt: f64) {
        let busy = self.busy();
        let waiting = self.journal.jobs.iter().any(|j| j.phase == Phase::Queued);
        let t = &mut self.journal.totals;
        t.busy_slot_s += dt * busy as f64;
        t.slot_s += dt * self.options.slots as f64;
        if waiting {
            t.stranded_slot_s += dt * self.options.slots.saturating_sub(busy) as f64;
        }
        for j in &mut self.journal.jobs {
            if j.pid.is_some() {
                j.run_s += dt;
            }
        }
    }

    /// Starts job `id`'s process on `slots`; a failure to start fails the job.
    fn start(&mut self, id: &str, slots: Vec<usize>) {
        let paths = self.paths(id);
        let port = match free_port() {
            Ok(p) => p,
            Err(e) => return self.fail(id, &format!("no free port for its metrics: {e}")),
        };
        let metrics_addr = format!("127.0.0.1:{port}");
        // An empty checkpoint directory: `--resume` then starts at step 1; and the folder of
        // the job's own files, its working directory.
        for dir in [&paths.checkpoints, &paths.files] {
            if let Err(e) = std::fs::create_dir_all(dir) {
                return self.fail(id, &format!("cannot create {}: {e}", dir.display()));
            }
        }
        let job = self.job_mut(id).expect("a known job").clone();
        let launch = match self
            .launcher
            .command(&job, slots.len(), &paths, &metrics_addr)
        {
            Ok(l) => l,
            Err(e) => return self.fail(id, &e),
        };
        let header = format!(
            "--- attempt {} on slots {:?} ({} ranks): {} {}\n",
            job.attempts + 1,
            slots,
            slots.len(),
            launch.program.display(),
            launch.args.join(" ")
        );
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&paths.output)
            .and_then(|mut f| f.write_all(header.as_bytes()));
        match spawn(&launch, &paths.output) {
            Ok(child) => {
                let pid = child.id();
                let pid_start = Identity::of(pid).map(|i| i.start);
                self.procs.insert(
                    id.to_string(),
                    Proc {
                        child,
                        spawned: SystemTime::now(),
                    },
                );
                let job = self.job_mut(id).expect("a known job");
                let resumes = job.attempts > 0;
                job.phase = Phase::Running;
                job.slots = slots.clone();
                job.target.clear();
                job.stop_reason = None;
                job.pid = Some(pid);
                job.pid_start = pid_start;
                job.metrics_addr = Some(metrics_addr);
                job.attempts += 1;
                job.started_at.get_or_insert(unix_now());
                let how = if resumes { "resumed" } else { "started" };
                let n = slots.len();
                let plural = if n == 1 { "" } else { "s" };
                let text = format!("{id}: {how} on slots {slots:?} ({n} rank{plural}, pid {pid})");
                self.event(&text);
            }
            Err(e) => self.fail(
                id,
                &format!("cannot start {}: {e}", launch.program.display()),
            ),
        }
        self.dirty = true;
    }

    fn fail(&mut self, id: &str, why: &str) {
        if let Some(job) = self.job_mut(id) {
            job.phase = Phase::Failed;
            job.slots.clear();
            job.target.clear();
            job.pid = None;
            job.pid_start = None;
            job.pause = None;
            job.finished_at = Some(unix_now());
            job.message = Some(why.to_string());
        }
        self.event(&format!("{id}: failed: {why}"));
        self.dirty = true;
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Start { id, slots } => self.start(&id, slots),
            Action::Move { id, slots } => {
                let Some(job) = self.job_mut(&id) else { return };
                let Some(pid) = job.pid else { return };
                let from = job.slots.clone();
                let kind = if slots.len() == from.len() {
                    "migrate"
                } else {
                    "resize"
                };
                job.phase = Phase::Stopping;
                job.stop_reason = Some(StopReason::Move);
                job.target = slots.clone();
                job.pause = Some(Pause {
                    since: unix_now(),
                    kind: PauseKind::Move,
                });
                let step = job.step;
                signal(pid, libc::SIGTERM);
                self.event(&format!(
                    "{id}: {kind} from slots {from:?} to {slots:?} at step {step} (SIGTERM, checkpoint, resume)"
                ));
                self.dirty = true;
            }
        }
    }

    /// Collects ended processes and decides what follows.
    fn reap(&mut self) {
        let mut ended = Vec::new();
        for (id, p) in &mut self.procs {
            match p.child.try_wait() {
                Ok(Some(status)) => ended.push((id.clone(), status)),
                Ok(None) => {}
                Err(_) => {}
            }
        }
        for (id, status) in ended {
            self.procs.remove(&id);
            self.ended(&id, status);
        }
    }

    fn ended(&mut self, id: &str, status: ExitStatus) {
        let paths = self.paths(id);
        self.read_step(id, &paths.log);
        let max_restarts = self.options.max_restarts;
        let Some(i) = self.journal.jobs.iter().position(|j| j.id == id) else {
            return;
        };
        self.dirty = true;
        let how = describe(status);
        let job = &mut self.journal.jobs[i];
        job.pid = None;
        job.pid_start = None;
        job.metrics_addr = None;
        let step = job.step;
        let reason = job.stop_reason;
        if status.code() == Some(0) {
            job.phase = Phase::Done;
            job.slots.clear();
            job.target.clear();
            job.pause = None;
            job.finished_at = Some(unix_now());
            return self.event(&format!("{id}: done ({step} steps)"));
        }
        if status.code() == Some(2) && reason != Some(StopReason::Cancel) {
            let why = last_line(&paths.output).unwrap_or_else(|| how.clone());
            return self.fail(id, &why);
        }
        match reason {
            Some(StopReason::Move) => {
                let target = std::mem::take(&mut job.target);
                if target.len() == job.slots.len() {
                    job.migrations += 1;
                    self.journal.totals.migrations += 1;
                } else {
                    job.resizes += 1;
                    self.journal.totals.resizes += 1;
                }
                self.event(&format!("{id}: stopped after step {step} ({how})"));
                self.start(id, target);
            }
            Some(StopReason::Cancel) => {
                job.phase = Phase::Cancelled;
                job.slots.clear();
                job.finished_at = Some(unix_now());
                self.event(&format!(
                    "{id}: cancelled after step {step} ({how}); its checkpoints are kept"
                ));
            }
            Some(StopReason::Shutdown) => {
                job.phase = Phase::Queued;
                job.slots.clear();
                job.stop_reason = None;
                self.event(&format!(
                    "{id}: stopped after step {step} ({how}); resumes when the scheduler starts again"
                ));
            }
            None => {
                job.crashes += 1;
                if job.crashes > max_restarts {
                    let mut why = format!(
                        "{how} after step {step}; crashed {} times (`max_restarts` {max_restarts})",
                        job.crashes
                    );
                    if let Some(last) = last_line(&paths.output) {
                        why.push_str(&format!("; its last line: {last}"));
                    }
                    return self.fail(id, &why);
                }
                job.pause = Some(Pause {
                    since: unix_now(),
                    kind: PauseKind::Crash,
                });
                let slots = job.slots.clone();
                self.event(&format!(
                    "{id}: crashed ({how}) after step {step}; resuming from its last checkpoint"
                ));
                self.start(id, slots);
            }
        }
    }

    /// Reads a job's last finished step from its run log.
    fn read_step(&mut self, id: &str, log: &Path) {
        if let Some(step) = last_step(log) {
            if let Some(job) = self.job_mut(id) {
                job.step = step;
            }
        }
    }

    /// Each live job's step, and the end of a pause once its log shows a new step.
    fn progress(&mut self) {
        let ids: Vec<(String, SystemTime)> = self
            .procs
            .iter()
            .map(|(id, p)| (id.clone(), p.spawned))
            .collect();
        for (id, spawned) in ids {
            let log = self.paths(&id).log;
            self.read_step(&id, &log);
            let written = std::fs::metadata(&log).and_then(|m| m.modified()).ok();
            let Some(job) = self.job_mut(&id) else {
                continue;
            };
            let (Some(pause), Some(written)) = (job.pause, written) else {
                continue;
            };
            if written <= spawned {
                continue;
            }
            let d = (unix_now() - pause.since).max(0.0);
            job.pause = None;
            let step = job.step;
            let text = match pause.kind {
                PauseKind::Move => {
                    job.move_pause_s += d;
                    job.move_pauses.push(d);
                    format!("{id}: running again at step {step}; the move paused it {d:.2} s")
                }
                PauseKind::Crash => {
                    job.recoveries.push(d);
                    self.journal.totals.recoveries += 1;
                    format!("{id}: recovered at step {step}, {d:.2} s after the crash")
                }
            };
            self.event(&text);
            self.dirty = true;
        }
    }

    /// Scrapes each running job's metrics endpoint: its step time and loss.
    fn scrape(&mut self) {
        for job in &mut self.journal.jobs {
            if job.phase != Phase::Running {
                continue;
            }
            let Some(addr) = &job.metrics_addr else {
                continue;
            };
            let timeout = Duration::from_secs(2);
            let Ok(r) = dualpipe_http::client::request(addr, "GET", "/metrics", &[], None, timeout)
            else {
                continue;
            };
            if r.status != 200 {
                continue;
            }
            let sum = sample(&r.body, "dualpipe_step_duration_seconds_sum");
            let count = sample(&r.body, "dualpipe_step_duration_seconds_count");
            if let (Some(sum), Some(count)) = (sum, count) {
                if count > 0.0 {
                    job.step_seconds = Some(sum / count);
                }
            }
            if let Some(loss) = sample(&r.body, "dualpipe_loss").filter(|l| l.is_finite()) {
                job.loss = Some(loss);
            }
        }
    }

    /// Asks every process to stop, waits `stop_grace` for them, kills the rest, and
    /// journals their jobs to resume.
    fn shutdown(&mut self) {
        let ids: Vec<String> = self.procs.keys().cloned().collect();
        for id in &ids {
            let Some(job) = self.job_mut(id) else {
                continue;
            };
            if job.stop_reason != Some(StopReason::Cancel) {
                job.stop_reason = Some(StopReason::Shutdown);
                job.target.clear();
                job.pause = None;
            }
            job.phase = Phase::Stopping;
            if let Some(pid) = job.pid {
                signal(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + self.options.stop_grace;
        while !self.procs.is_empty() && Instant::now() < deadline {
            self.reap();
            std::thread::sleep(Duration::from_millis(20));
        }
        for (id, mut p) in std::mem::take(&mut self.procs) {
            let _ = p.child.kill();
            let status = p.child.wait();
            if let Ok(status) = status {
                self.ended(&id, status);
            }
        }
        for job in &mut self.journal.jobs {
            if job.phase == Phase::Stopping {
                job.phase = Phase::Queued;
                job.slots.clear();
                job.stop_reason = None;
            }
        }
        self.save();
        self.event("stopped; every job is journaled");
    }
}

/// A free TCP port on 127.0.0.1 (another process may take it before the job binds it).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// How a process ended, in words.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "ended".into(),
    }
}

/// The last non-empty line of a text file, without control or format characters and cut to
/// 300 characters (it goes into a job's message).
pub(super) fn last_line(path: &Path) -> Option<String> {
    let text = tail(path, 8192)?;
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    Some(
        line.trim()
            .chars()
            .filter(|&c| !c.is_control() && !crate::names::is_format_char(c))
            .take(300)
            .collect(),
    )
}

/// The last `n` bytes of a file, as text.
fn tail(path: &Path, n: u64) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(n))).ok()?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The step of the last complete record of a JSONL run log.
pub fn last_step(log: &Path) -> Option<usize> {
    let text = tail(log, 65536)?;
    let complete = &text[..text.rfind('\n')?];
    complete.lines().rev().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        v.get("step")?.as_u64().map(|s| s as usize)
    })
}
