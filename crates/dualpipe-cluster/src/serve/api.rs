//! The HTTP/JSON API on `tiny_http`: one thread turns requests into [`Call`]s for the
//! scheduler's loop and sends back its [`Reply`].
//!
//! | request | call |
//! | --- | --- |
//! | `POST /jobs` with a [`JobRequest`] | submit: `201 {"id": ...}` or `400 {"error": ...}` |
//! | `GET /jobs` | list: the slots, the counters and every job |
//! | `DELETE /jobs/ID` | cancel: `200`, `404` (no such job) or `409` (already ended) |
//! | `GET /metrics` | the scheduler's Prometheus metrics |

use std::io::Read;
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::Duration;

use super::spec::JobRequest;

/// The largest request body read (bytes).
const MAX_BODY: u64 = 1 << 20;

/// What a request asks of the scheduler.
#[derive(Debug)]
pub enum Call {
    /// Queue a job.
    Submit(JobRequest),
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
}

/// A call with the channel its reply goes back on.
pub type Envelope = (Call, Sender<Reply>);

/// Serves `server`'s requests until it is unblocked, handing each call to `calls`.
pub fn run(server: Arc<tiny_http::Server>, calls: Sender<Envelope>) {
    for mut rq in server.incoming_requests() {
        let reply = match parse(&mut rq) {
            Ok(call) => {
                let (tx, rx) = channel();
                if calls.send((call, tx)).is_err() {
                    Reply::error(503, "the scheduler is shutting down")
                } else {
                    rx.recv_timeout(Duration::from_secs(30))
                        .unwrap_or_else(|_| Reply::error(503, "the scheduler did not answer"))
                }
            }
            Err(reply) => reply,
        };
        let header = tiny_http::Header::from_bytes("Content-Type", reply.content_type)
            .expect("a valid header");
        let response = tiny_http::Response::from_string(reply.body)
            .with_status_code(reply.status)
            .with_header(header);
        let _ = rq.respond(response);
    }
}

/// The call a request makes, or the error answer.
fn parse(rq: &mut tiny_http::Request) -> Result<Call, Reply> {
    use tiny_http::Method;
    let path = rq.url().split('?').next().unwrap_or("").to_string();
    match (rq.method(), path.as_str()) {
        (Method::Post, "/jobs") => {
            let mut body = String::new();
            rq.as_reader()
                .take(MAX_BODY + 1)
                .read_to_string(&mut body)
                .map_err(|e| {
                    Reply::error(400, &format!("the request body is not UTF-8 text: {e}"))
                })?;
            if body.len() as u64 > MAX_BODY {
                return Err(Reply::error(413, "the job is larger than 1 MiB"));
            }
            serde_json::from_str(&body)
                .map(Call::Submit)
                .map_err(|e| Reply::error(400, &format!("not a job ({e}): send {{\"args\": [...], \"min_ranks\": N, \"max_ranks\": M}}")))
        }
        (Method::Get, "/jobs") => Ok(Call::List),
        (Method::Get, "/metrics") => Ok(Call::Metrics),
        (Method::Delete, p) if p.starts_with("/jobs/") && p.len() > 6 => {
            Ok(Call::Cancel(p[6..].to_string()))
        }
        (_, "/jobs" | "/metrics") => Err(Reply::error(405, "method not allowed")),
        _ => Err(Reply::error(
            404,
            "no such resource: use /jobs, /jobs/ID or /metrics",
        )),
    }
}
