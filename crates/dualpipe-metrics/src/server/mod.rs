//! [`MetricsServer`]: `/metrics` over HTTP/1.1 on one thread of its own, bounded in every
//! resource a client could make it spend.
//!
//! A minimal server on `std::net` and `poll(2)` (no async runtime, no thread per
//! connection): one thread holds at most [`ServerLimits::max_connections`] connections;
//! each must send its request head (request line and headers, capped at
//! [`ServerLimits::max_request_line`] and [`ServerLimits::max_head`] bytes: `414`/`431`
//! past them) and take its response within [`ServerLimits::request_timeout`]. When every
//! slot is taken, a new connection replaces the oldest one that has waited
//! [`ServerLimits::eviction_grace`] without a whole request, so idle connections cannot
//! lock scrapers out; otherwise new connections wait in the kernel's backlog. When
//! `accept` fails for want of file descriptors (`EMFILE`, `ENFILE`) the listener backs off
//! (50 ms doubling to 1 s) and keeps listening, saying so once on standard error; if the
//! endpoint must stop, one line on standard error says that too.
//!
//! A scrape encodes the registry from atomics on the server's thread; the training thread
//! never waits for it, so scraping as hard as one likes costs training at most the CPU the
//! server thread uses, and no client can end the run. Every response closes its
//! connection.

mod http;
mod serve;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::MetricsError;
use crate::registry::TrainingMetrics;

/// The Prometheus text format's content type.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The OpenMetrics text format's content type.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The bounds of the metrics server: what any number of clients can make it hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections held open at once (each a file descriptor and at most
    /// `max_head` + 4 KiB of buffer); further ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// From accepting a connection to the end of its response: a client that has not sent
    /// its whole request head by then, or not taken its response, is disconnected.
    pub request_timeout: Duration,
    /// How long a new connection may wait for its request before, with every slot taken, a
    /// newer connection may replace it.
    pub eviction_grace: Duration,
    /// The longest request line, in bytes (`414 URI Too Long` past it).
    pub max_request_line: usize,
    /// The longest request head (request line and headers), in bytes (`431 Request Header
    /// Fields Too Large` past it).
    pub max_head: usize,
}

impl Default for ServerLimits {
    /// 128 connections, 10 s per request, 250 ms of grace, an 8 KiB request line and a
    /// 16 KiB head (Prometheus sends about 300 bytes).
    fn default() -> Self {
        ServerLimits {
            max_connections: 128,
            request_timeout: Duration::from_secs(10),
            eviction_grace: Duration::from_millis(250),
            max_request_line: 8 * 1024,
            max_head: 16 * 1024,
        }
    }
}

/// What the server has done so far (counters since it started, and the connections open
/// now).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Requests answered (any status but the rejections below).
    pub served: u64,
    /// Requests rejected as malformed or past a cap (`400`, `414`, `431`, `505`).
    pub rejected: u64,
    /// Connections closed at their deadline before their response was sent.
    pub timed_out: u64,
    /// Connections closed to make room for a new one.
    pub evicted: u64,
    /// Failed `accept` calls (out of file descriptors and the like).
    pub accept_errors: u64,
    /// Connections open now.
    pub open: usize,
    /// The most connections open at once.
    pub peak_open: usize,
    /// Whether the endpoint has stopped for good (said on standard error).
    pub stopped: bool,
}

/// The counters behind [`ServerStats`], shared with the server's thread.
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    served: AtomicU64,
    rejected: AtomicU64,
    timed_out: AtomicU64,
    evicted: AtomicU64,
    accept_errors: AtomicU64,
    open: AtomicUsize,
    peak_open: AtomicUsize,
    stopped: AtomicBool,
}

/// Serves `/metrics` until dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    counters: Arc<Counters>,
    waker: UnixStream,
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
    /// [`MetricsServer::addr`]) and serves `metrics` on a new thread, within the default
    /// [`ServerLimits`], its warnings on standard error.
    pub fn start(addr: &str, metrics: TrainingMetrics) -> Result<Self, MetricsError> {
        Self::start_with(
            addr,
            metrics,
            ServerLimits::default(),
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
        let fail = |reason: String| MetricsError::Listen {
            addr: addr.to_string(),
            reason,
        };
        if limits.max_connections == 0 || limits.max_head < limits.max_request_line {
            return Err(fail(format!(
                "the limits allow no request: {limits:?}; max_connections must be at least 1 \
                 and max_head at least max_request_line"
            )));
        }
        let resolved = addr
            .to_socket_addrs()
            .map_err(|e| fail(format!("{e}; give HOST:PORT such as 127.0.0.1:9090")))?
            .next()
            .ok_or_else(|| fail("the host has no address; give HOST:PORT".into()))?;
        let listener = TcpListener::bind(resolved).map_err(|e| fail(e.to_string()))?;
        let bound = listener.local_addr().map_err(|e| fail(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| fail(e.to_string()))?;
        let (waker, wakee) = UnixStream::pair()
            .map_err(|e| fail(format!("cannot make the server's wake-up socket: {e}")))?;
        let counters = Arc::new(Counters::default());
        let serve = serve::Serve {
            listener,
            waker: wakee,
            metrics,
            limits,
            counters: Arc::clone(&counters),
            report,
            addr: bound.to_string(),
        };
        let thread = std::thread::Builder::new()
            .name("dualpipe-metrics".into())
            .spawn(move || serve.run())
            .map_err(|e| fail(format!("cannot start the server thread: {e}")))?;
        Ok(MetricsServer {
            addr: bound,
            counters,
            waker,
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

    /// What the server has done so far.
    pub fn stats(&self) -> ServerStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServerStats {
            accepted: get(&c.accepted),
            served: get(&c.served),
            rejected: get(&c.rejected),
            timed_out: get(&c.timed_out),
            evicted: get(&c.evicted),
            accept_errors: get(&c.accept_errors),
            open: c.open.load(Ordering::Relaxed),
            peak_open: c.peak_open.load(Ordering::Relaxed),
            stopped: c.stopped.load(Ordering::Relaxed),
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        // One byte (or, failing that, the closed socket) wakes the thread to end.
        let _ = (&self.waker).write_all(&[1]);
        let _ = self.waker.shutdown(std::net::Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
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
