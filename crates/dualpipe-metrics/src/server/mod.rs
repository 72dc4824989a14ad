//! [`MetricsServer`]: `/metrics` over HTTP/1.1 on the workspace's one bounded server
//! ([`dualpipe_http::Server`]: a poll loop and one worker thread, every resource a client
//! could make it spend capped; see that crate for the bounds).
//!
//! A scrape encodes the registry from atomics on the server's worker thread; the training
//! thread never waits for it, so scraping as hard as one likes costs training at most the CPU
//! the server's threads use, and no client can end the run. Every response closes its
//! connection.

use std::net::SocketAddr;
use std::sync::Arc;

use dualpipe_http::{Request, Response, Server};

use crate::error::MetricsError;
use crate::registry::TrainingMetrics;

/// The Prometheus text format's content type.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The OpenMetrics text format's content type.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The bounds of the metrics server: what any number of clients can make it hold.
pub type ServerLimits = dualpipe_http::Limits;

/// What the server has done so far.
pub type ServerStats = dualpipe_http::Stats;

/// The bounds a metrics endpoint runs within by default: the shared server's, with one
/// worker (a scrape is a few microseconds of encoding) and a 4 KiB body cap (no request of
/// the endpoint has a body).
pub fn default_limits() -> ServerLimits {
    ServerLimits {
        workers: 1,
        max_body: 4096,
        ..ServerLimits::default()
    }
}

/// Serves `/metrics` until dropped.
#[derive(Debug)]
pub struct MetricsServer {
    server: Server,
}

impl MetricsServer {
    /// Listens on `addr` (`HOST:PORT`; port 0 picks a free port, see
    /// [`MetricsServer::addr`]) and serves `metrics` on threads of its own, within
    /// [`default_limits`], its warnings on standard error.
    pub fn start(addr: &str, metrics: TrainingMetrics) -> Result<Self, MetricsError> {
        Self::start_with(
            addr,
            metrics,
            default_limits(),
            Box::new(|line: &str| eprintln!("{line}")),
        )
    }

    /// [`MetricsServer::start`] within `limits`, each warning line (the endpoint cannot
    /// accept, accepts again, or stopped) given to `report`.
    pub fn start_with(
        addr: &str,
        metrics: TrainingMetrics,
        limits: ServerLimits,
        report: Box<dyn FnMut(&str) + Send>,
    ) -> Result<Self, MetricsError> {
        let handler = Arc::new(move |request: &Request| respond(request, &metrics));
        let server =
            Server::start(addr, "dualpipe-metrics", limits, handler, report).map_err(|e| {
                MetricsError::Listen {
                    addr: e.addr,
                    reason: e.reason,
                }
            })?;
        Ok(MetricsServer { server })
    }

    /// The address it listens on (with the port chosen when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The URL of the metrics, `http://HOST:PORT/metrics`.
    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr())
    }

    /// What the server has done so far.
    pub fn stats(&self) -> ServerStats {
        self.server.stats()
    }
}

/// The answer to one request: the registry at `/metrics` (Prometheus text, or OpenMetrics
/// when the `Accept` header asks for it), a pointer to it at `/`, `404` elsewhere, `405` for
/// methods but GET and HEAD.
fn respond(request: &Request, metrics: &TrainingMetrics) -> Response {
    if request.method != "GET" && request.method != "HEAD" {
        return Response::text(405, "only GET /metrics\n").with_header("Allow", "GET, HEAD");
    }
    match request.path.as_str() {
        "/metrics" => {
            if wants_openmetrics(request.header("accept")) {
                Response::new(200, OPENMETRICS_TEXT, metrics.openmetrics())
            } else {
                Response::new(200, PROMETHEUS_TEXT, metrics.prometheus_text())
            }
        }
        "/" => Response::text(200, "dualpipe: metrics at /metrics\n"),
        _ => Response::text(404, "not found; metrics at /metrics\n"),
    }
}

/// Whether the request's `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_header_chooses_the_format() {
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        )));
    }

    #[test]
    fn a_bad_address_is_one_clear_error() {
        let err = MetricsServer::start("nonsense", TrainingMetrics::new(1)).unwrap_err();
        assert!(err.to_string().contains("HOST:PORT"), "{err}");
    }
}
