//! [`MetricsServer`]: `/metrics` over HTTP on a thread of its own (tiny_http, synchronous).
//!
//! A scrape encodes the registry from atomics on the server's thread; the training thread
//! never waits for it, so scraping as hard as one likes costs training at most the CPU the
//! server thread uses. Requests are served one at a time; a failed response is dropped and
//! the server goes on.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::thread::JoinHandle;

use tiny_http::{Header, Method, Request, Response, Server};

use crate::error::MetricsError;
use crate::registry::TrainingMetrics;

/// The Prometheus text format's content type.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The OpenMetrics text format's content type.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `/metrics` until dropped.
pub struct MetricsServer {
    server: Arc<Server>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl MetricsServer {
    /// Listens on `addr` (`HOST:PORT`; port 0 picks a free port, see
    /// [`MetricsServer::addr`]) and serves `metrics` on a new thread.
    pub fn start(addr: &str, metrics: TrainingMetrics) -> Result<Self, MetricsError> {
        let fail = |reason: String| MetricsError::Listen {
            addr: addr.to_string(),
            reason,
        };
        let resolved = addr
            .to_socket_addrs()
            .map_err(|e| fail(format!("{e}; give HOST:PORT such as 127.0.0.1:9090")))?
            .next()
            .ok_or_else(|| fail("the host has no address; give HOST:PORT".into()))?;
        let server = Server::http(resolved).map_err(|e| fail(e.to_string()))?;
        let bound = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| fail("not an IP socket".into()))?;
        let server = Arc::new(server);
        let serving = Arc::clone(&server);
        let thread = std::thread::Builder::new()
            .name("dualpipe-metrics".into())
            .spawn(move || {
                for request in serving.incoming_requests() {
                    respond(request, &metrics);
                }
            })
            .map_err(|e| fail(format!("cannot start the server thread: {e}")))?;
        Ok(MetricsServer {
            server,
            addr: bound,
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the port chosen when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL of the metrics, `http://HOST:PORT/metrics`.
    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Whether the request's `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

fn respond(request: Request, metrics: &TrainingMetrics) {
    let path = request.url().split('?').next().unwrap_or("");
    let response = match (request.method(), path) {
        (Method::Get | Method::Head, "/metrics") => {
            let accept = request
                .headers()
                .iter()
                .find(|h| h.field.equiv("Accept"))
                .map(|h| h.value.as_str());
            let (body, content_type) = if wants_openmetrics(accept) {
                (metrics.openmetrics(), OPENMETRICS_TEXT)
            } else {
                (metrics.prometheus_text(), PROMETHEUS_TEXT)
            };
            with_type(Response::from_string(body), content_type)
        }
        (Method::Get | Method::Head, "/") => with_type(
            Response::from_string("dualpipe: metrics at /metrics\n"),
            "text/plain; charset=utf-8",
        ),
        (Method::Get | Method::Head, _) => {
            Response::from_string("not found; metrics at /metrics\n").with_status_code(404)
        }
        _ => Response::from_string("only GET /metrics\n").with_status_code(405),
    };
    // A client that went away is no concern of the training.
    let _ = request.respond(response);
}

fn with_type(
    response: Response<std::io::Cursor<Vec<u8>>>,
    content_type: &str,
) -> Response<std::io::Cursor<Vec<u8>>> {
    match Header::from_bytes("Content-Type", content_type) {
        Ok(h) => response.with_header(h),
        Err(()) => response,
    }
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
