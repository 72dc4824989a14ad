//! The HTTP/JSON API on the workspace's bounded server ([`dualpipe_http::Server`]): its
//! worker threads check each request's token, read and check submissions (off the
//! scheduler's loop), and hand [`Call`]s to the loop, which answers each with a [`Reply`].
//!
//! | request | call |
//! | --- | --- |
//! | `POST /jobs` with a [`JobRequest`] | submit: `201 {"id": ...}` (`200` for a retried `request_id`) or `400 {"error": ...}` |
//! | `GET /jobs` | list: the slots, the counters, the journal's health and every job |
//! | `DELETE /jobs/ID` | cancel: `200`, `404` (no such job) or `409` (already ended) |
//! | `GET /metrics` | the scheduler's Prometheus metrics (no token needed) |
//!
//! Every request but `GET /metrics` needs `Authorization: Bearer TOKEN` (`401` without it,
//! and nothing changes). While the scheduler recovers the jobs of a previous run, every
//! request is answered `503` ("recovering"). A `503` always means nothing was changed.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::Duration;

use dualpipe_http::{Request, Response};

use super::access::authorized;
use super::process::Launcher;
use super::spec::JobRequest;

/// The largest request body taken (bytes).
pub const MAX_BODY: usize = 1 << 20;
/// Submissions checked at once (each on a worker thread); more are answered `503`.
const MAX_CHECKS: usize = 2;

/// A submission that passed its checks.
#[derive(Debug)]
pub struct Checked {
    /// What was submitted.
    pub request: JobRequest,
    /// The rank counts it runs on.
    pub allowed: Vec<usize>,
    /// The steps it trains.
    pub steps: usize,
}

/// What a request asks of the scheduler.
#[derive(Debug)]
pub enum Call {
    /// Queue a checked job.
    Submit(Checked),
    /// Every job and the counters.
    List,
    /// Cancel the job with this id.
    Cancel(String),
    /// The Prometheus page.
    Metrics,
}

/// The scheduler's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: String,
    /// Its content type.
    pub content_type: &'static str,
}

impl Reply {
    /// A JSON answer.
    pub fn json(status: u16, value: &serde_json::Value) -> Self {
        Reply {
            status,
            body: format!("{value}\n"),
            content_type: "application/json",
        }
    }

    /// A JSON error answer: `{"error": message}`.
    pub fn error(status: u16, message: &str) -> Self {
        Reply::json(status, &serde_json::json!({ "error": message }))
    }

    fn into_response(self) -> Response {
        Response::new(self.status, self.content_type, self.body)
    }
}

/// A call's claim: the loop takes it, or the waiting thread gives up on it, never both.
const PENDING: u8 = 0;
const TAKEN: u8 = 1;
const ABANDONED: u8 = 2;

/// A call with the channel its reply goes back on and its claim.
#[derive(Debug)]
pub struct Envelope {
    /// The call.
    pub call: Call,
    /// Where the reply goes.
    pub reply: Sender<Reply>,
    claim: Arc<AtomicU8>,
}

impl Envelope {
    /// Claims the call for the loop: `false` when the client was already told it was not
    /// done (then the loop must not act on it).
    pub fn take(&self) -> bool {
        self.claim
            .compare_exchange(PENDING, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// What the API's threads share.
pub struct Api {
    /// The token every request but `GET /metrics` must carry.
    pub token: String,
    /// Whether the loop answers calls (false while it recovers a previous run's jobs).
    pub ready: Arc<AtomicBool>,
    /// The loop's inbox.
    pub calls: Sender<Envelope>,
    /// The training command's checks.
    pub launcher: Arc<dyn Launcher>,
    /// The scheduler's slots (a job's `max_ranks` at most).
    pub slots: usize,
    /// How long a thread waits for the loop's answer.
    pub wait: Duration,
    /// Submissions being checked now.
    pub checking: AtomicUsize,
}

impl Api {
    /// The answer to one request.
    pub fn handle(&self, rq: &Request) -> Response {
        self.route(rq).into_response()
    }

    fn route(&self, rq: &Request) -> Reply {
        let path = rq.path.as_str();
        let method = rq.method.as_str();
        let known =
            matches!(path, "/jobs" | "/metrics") || (path.starts_with("/jobs/") && path.len() > 6);
        if path == "/metrics" && matches!(method, "GET" | "HEAD") {
            return self.ask(Call::Metrics);
        }
        if known && !authorized(rq.header("authorization"), &self.token) {
            return Reply::error(
                401,
                "no valid API token: send `Authorization: Bearer TOKEN` with the token in the \
                 scheduler's state directory (DIR/token; the clients take --state DIR or \
                 --token-file FILE)",
            );
        }
        match (method, path) {
            ("POST", "/jobs") => self.submit(&rq.body),
            ("GET", "/jobs") => self.ask(Call::List),
            ("DELETE", p) if p.starts_with("/jobs/") && p.len() > 6 => {
                self.ask(Call::Cancel(p[6..].to_string()))
            }
            _ if known => Reply::error(405, "method not allowed"),
            _ => Reply::error(404, "no such resource: use /jobs, /jobs/ID or /metrics"),
        }
    }

    /// Reads and checks a submission here, on the API's thread, then hands it to the loop.
    fn submit(&self, body: &[u8]) -> Reply {
        if !self.ready.load(Ordering::Acquire) {
            return recovering();
        }
        let Ok(text) = std::str::from_utf8(body) else {
            return Reply::error(400, "the request body is not UTF-8 text");
        };
        let request: JobRequest = match serde_json::from_str(text) {
            Ok(r) => r,
            Err(e) => {
                return Reply::error(
                    400,
                    &format!(
                    "not a job ({e}): send {{\"args\": [...], \"min_ranks\": N, \"max_ranks\": M}}"
                ),
                )
            }
        };
        if let Err(e) = request.check() {
            return Reply::error(400, &e);
        }
        if request.max_ranks > self.slots {
            return Reply::error(
                400,
                &format!(
                    "max_ranks {}: the scheduler has {} slots; give at most {}",
                    request.max_ranks, self.slots, self.slots
                ),
            );
        }
        if self.checking.fetch_add(1, Ordering::AcqRel) >= MAX_CHECKS {
            self.checking.fetch_sub(1, Ordering::AcqRel);
            return Reply::error(
                503,
                "other submissions are being checked; nothing was submitted: retry in a moment",
            );
        }
        let checked = self
            .launcher
            .check(&request.args, request.min_ranks, request.max_ranks);
        self.checking.fetch_sub(1, Ordering::AcqRel);
        let (allowed, steps) = match checked {
            Ok(c) => c,
            Err(e) => return Reply::error(400, &e),
        };
        if allowed.is_empty() {
            return Reply::error(400, "no rank count in min_ranks..=max_ranks fits the job");
        }
        self.ask(Call::Submit(Checked {
            request,
            allowed,
            steps,
        }))
    }

    /// Hands `call` to the loop and waits for its answer; a `503` when the loop does not
    /// take it in time (and then it never acts on it).
    fn ask(&self, call: Call) -> Reply {
        if !self.ready.load(Ordering::Acquire) {
            return recovering();
        }
        let (tx, rx) = channel();
        let claim = Arc::new(AtomicU8::new(PENDING));
        let envelope = Envelope {
            call,
            reply: tx,
            claim: Arc::clone(&claim),
        };
        if self.calls.send(envelope).is_err() {
            return Reply::error(503, "the scheduler is shutting down; nothing was changed");
        }
        if let Ok(reply) = rx.recv_timeout(self.wait) {
            return reply;
        }
        if claim
            .compare_exchange(PENDING, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Reply::error(
                503,
                &format!(
                    "the scheduler did not take the request in {} s; nothing was changed: retry",
                    self.wait.as_secs_f64()
                ),
            );
        }
        // The loop took it just now: its answer comes at once.
        rx.recv().unwrap_or_else(|_| {
            Reply::error(503, "the scheduler is shutting down; nothing was changed")
        })
    }
}

fn recovering() -> Reply {
    Reply::error(
        503,
        "recovering the jobs of the previous run (at most --stop-grace); nothing was changed: \
         retry in a few seconds",
    )
}
