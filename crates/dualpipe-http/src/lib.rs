//! The one HTTP/1.1 server of dualpipe ([`Server`]), bounded in every resource a client could
//! make it spend, and its minimal client ([`client`]).
//!
//! A server on `std::net` and `poll(2)` (no async runtime, no thread per connection): one
//! thread accepts and reads, holding at most [`Limits::max_connections`] connections; each
//! must send its request head (request line and headers, capped at
//! [`Limits::max_request_line`] and [`Limits::max_head`] bytes: `414`/`431` past them) and its
//! body (`Content-Length`, capped at [`Limits::max_body`]: `413` past it, `400` for a
//! malformed or negative length, `411` for a chunked body) within
//! [`Limits::request_timeout`]: a client that has not sent its whole head by then is
//! disconnected, one whose body is late is answered `408`. A non-ASCII request line is
//! `400`. Whole requests go to a fixed pool of [`Limits::workers`] threads that run the
//! handler, off the accept loop, so a slow handler never stops the others from being read.
//!
//! When every slot is taken, a new connection replaces the oldest one that has waited
//! [`Limits::eviction_grace`] without a whole request, so idle connections cannot lock
//! clients out; otherwise new connections wait in the kernel's backlog. When `accept` fails
//! for want of file descriptors (`EMFILE`, `ENFILE`) the listener backs off (50 ms doubling
//! to 1 s) and keeps listening, saying so once through the report; if it must stop, one line
//! says that too. Every response closes its connection. Dropping the [`Server`] ends the
//! loop at once: no client, and no handler still running, is waited for.

#![warn(missing_docs)]

pub mod client;
mod parse;
mod serve;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The bounds of a server: what any number of clients can make it hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections held open at once (each a file descriptor and at most `max_head` +
    /// `max_body` + 4 KiB of buffer); further ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// Threads that run the handler (requests beyond wait for one).
    pub workers: usize,
    /// From accepting a connection to its whole request, and from the handler's answer to
    /// the end of the response: a client that is slower is disconnected (`408` once its head
    /// is in).
    pub request_timeout: Duration,
    /// How long a new connection may wait for its request before, with every slot taken, a
    /// newer connection may replace it.
    pub eviction_grace: Duration,
    /// The longest request line, in bytes (`414 URI Too Long` past it).
    pub max_request_line: usize,
    /// The longest request head (request line and headers), in bytes (`431 Request Header
    /// Fields Too Large` past it).
    pub max_head: usize,
    /// The largest request body, in bytes (`413 Content Too Large` past it).
    pub max_body: usize,
}

impl Default for Limits {
    /// 128 connections, 2 workers, 10 s per request, 250 ms of grace, an 8 KiB request line,
    /// a 16 KiB head and a 64 KiB body.
    fn default() -> Self {
        Limits {
            max_connections: 128,
            workers: 2,
            request_timeout: Duration::from_secs(10),
            eviction_grace: Duration::from_millis(250),
            max_request_line: 8 * 1024,
            max_head: 16 * 1024,
            max_body: 64 * 1024,
        }
    }
}

/// What a server has done so far (counters since it started, and the connections open now).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted.
    pub accepted: u64,
    /// Requests handed to the handler.
    pub served: u64,
    /// Requests rejected as malformed or past a cap (`400`, `408`, `411`, `413`, `414`,
    /// `431`, `505`).
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
    /// Whether the server has stopped for good (said through the report).
    pub stopped: bool,
}

/// The counters behind [`Stats`], shared with the server's thread.
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

/// A whole request, as the handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The method, as sent (`GET`, `POST`, ...).
    pub method: String,
    /// The path, without the query (`/jobs/job-0001`).
    pub path: String,
    /// The query, without its `?`, if any.
    pub query: Option<String>,
    /// The headers, names in lower case, in the order sent.
    pub headers: Vec<(String, String)>,
    /// The body (`Content-Length` bytes).
    pub body: Vec<u8>,
}

impl Request {
    /// The value of the first header called `name` (any case), trimmed.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A handler's answer. The server adds `Content-Length` and `Connection: close`, and drops
/// the body of the answer to a `HEAD` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body's content type.
    pub content_type: String,
    /// Further headers (`Allow`, `WWW-Authenticate`, ...).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// An answer with `status`, its content type and body.
    pub fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status,
            content_type: content_type.to_string(),
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// A plain-text answer.
    pub fn text(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Response::new(status, TEXT, body)
    }

    /// This answer with one more header.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// The whole response on the wire (head and, unless `head_only`, body).
    pub(crate) fn encode(&self, head_only: bool) -> Vec<u8> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("Connection: close\r\n\r\n");
        let mut out = head.into_bytes();
        if !head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

/// Plain text's content type.
pub const TEXT: &str = "text/plain; charset=utf-8";

/// The reason phrase of a status code.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// What answers requests: called on the worker threads, never on the accept loop.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// Where the server's warnings go (one line each).
pub type Report = Box<dyn FnMut(&str) + Send>;

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {reason}")]
pub struct ListenError {
    /// The address asked for.
    pub addr: String,
    /// Why not.
    pub reason: String,
}

/// A running server; dropping it stops it.
pub struct Server {
    addr: SocketAddr,
    counters: Arc<Counters>,
    waker: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Listens on `addr` (`HOST:PORT`; port 0 picks a free port, see [`Server::addr`]) and
    /// serves requests with `handler` within `limits`; its threads are called `name` (the
    /// loop) and `name` followed by `-w` (the workers); each warning line goes to `report`.
    pub fn start(
        addr: &str,
        name: &str,
        limits: Limits,
        handler: Handler,
        report: Report,
    ) -> Result<Server, ListenError> {
        let fail = |reason: String| ListenError {
            addr: addr.to_string(),
            reason,
        };
        if limits.max_connections == 0
            || limits.workers == 0
            || limits.max_head < limits.max_request_line
        {
            return Err(fail(format!(
                "the limits allow no request: {limits:?}; max_connections and workers must be \
                 at least 1 and max_head at least max_request_line"
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
        let pool = serve::Pool::start(name, limits.workers, handler)
            .map_err(|e| fail(format!("cannot start the worker threads: {e}")))?;
        let serve = serve::Serve {
            listener,
            waker: wakee,
            pool,
            limits,
            counters: Arc::clone(&counters),
            report,
            addr: bound.to_string(),
        };
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || serve.run())
            .map_err(|e| fail(format!("cannot start the server thread: {e}")))?;
        Ok(Server {
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

    /// What the server has done so far.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
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

impl Drop for Server {
    fn drop(&mut self) {
        // One byte (or, failing that, the closed socket) wakes the loop to end; it never
        // waits for a client or a handler, so joining it is quick.
        let _ = (&self.waker).write_all(&[1]);
        let _ = self.waker.shutdown(std::net::Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
