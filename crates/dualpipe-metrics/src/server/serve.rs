//! The server's one thread: `poll(2)` over a wake-up socket, the listener and at most
//! [`ServerLimits::max_connections`] open connections, each read under the caps and closed
//! by its deadline.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::registry::TrainingMetrics;

use super::http::{self, Parsed};
use super::{Counters, ServerLimits};

/// Where the server's warnings go (one line each).
pub(crate) type Report = Box<dyn FnMut(&str) + Send>;

/// At most this much of what a client sends after its request is read and discarded
/// before the connection is closed (closing with unread data would reset it and could
/// lose the response on the client's side).
const DRAIN_BYTES: usize = 64 * 1024;
/// How long a connection may linger after its response to let the client close first.
const DRAIN_TIME: Duration = Duration::from_secs(1);
/// The first and the longest pause after `accept` fails for want of descriptors or memory.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

enum Phase {
    /// Reading the request head.
    Reading,
    /// Sending `out[sent..]`.
    Writing,
    /// Response sent and the write side shut down; discarding what the client still sends.
    Draining(usize),
}

struct Connection {
    stream: TcpStream,
    opened: Instant,
    deadline: Instant,
    phase: Phase,
    head: Vec<u8>,
    out: Vec<u8>,
    sent: usize,
}

enum Next {
    Keep,
    Close,
}

/// The loop's state.
pub(crate) struct Serve {
    pub listener: TcpListener,
    pub waker: UnixStream,
    pub metrics: TrainingMetrics,
    pub limits: ServerLimits,
    pub counters: Arc<Counters>,
    pub report: Report,
    pub addr: String,
}

impl Serve {
    /// Serves until a byte arrives on the waker (or it closes), or the endpoint cannot go
    /// on (said in one line through `report`).
    pub(crate) fn run(mut self) {
        let mut connections: Vec<Connection> = Vec::new();
        let mut paused_until: Option<Instant> = None;
        let mut backoff = BACKOFF.0;
        let mut failing = false;
        let mut fds: Vec<libc::pollfd> = Vec::new();
        loop {
            let now = Instant::now();
            if paused_until.is_some_and(|t| t <= now) {
                paused_until = None;
            }
            let full = connections.len() >= self.limits.max_connections;
            let evictable = full && self.oldest_evictable(&connections, now).is_some();
            let listen = paused_until.is_none() && (!full || evictable);
            fds.clear();
            fds.push(pollfd(self.waker.as_raw_fd(), libc::POLLIN));
            let listener_fd = if listen {
                self.listener.as_raw_fd()
            } else {
                -1
            };
            fds.push(pollfd(listener_fd, libc::POLLIN));
            for c in &connections {
                let events = match c.phase {
                    Phase::Writing => libc::POLLOUT,
                    _ => libc::POLLIN,
                };
                fds.push(pollfd(c.stream.as_raw_fd(), events));
            }
            let mut wake = connections.iter().map(|c| c.deadline).min();
            if full && !evictable {
                let grace = self.limits.eviction_grace;
                let soonest = connections
                    .iter()
                    .filter(|c| !matches!(c.phase, Phase::Writing))
                    .map(|c| c.opened + grace)
                    .min();
                wake = earliest(wake, soonest);
            }
            wake = earliest(wake, paused_until);
            let timeout = wake.map_or(-1, |t| {
                let ms = t.saturating_duration_since(now).as_millis() + 1;
                i32::try_from(ms).unwrap_or(i32::MAX)
            });
            // SAFETY: `fds` is a valid, initialised array of `fds.len()` pollfd structs that
            // lives through the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                self.counters.stopped.store(true, Ordering::Relaxed);
                (self.report)(&format!(
                    "warning: the metrics endpoint {} stopped: poll failed: {e}; the training \
                     goes on without it",
                    self.addr
                ));
                return;
            }
            if fds[0].revents != 0 {
                return;
            }
            let now = Instant::now();
            // Connections first (their slots may free), in reverse so removal keeps indices.
            for i in (0..connections.len()).rev() {
                let revents = fds[i + 2].revents;
                let c = &mut connections[i];
                let next = if revents != 0 {
                    self.advance(c)
                } else {
                    Next::Keep
                };
                let expired = c.deadline <= now;
                if matches!(next, Next::Close) || expired {
                    if expired
                        && matches!(next, Next::Keep)
                        && !matches!(c.phase, Phase::Draining(_))
                    {
                        self.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                    connections.swap_remove(i);
                }
            }
            if fds[1].revents != 0 {
                self.accept(
                    &mut connections,
                    &mut paused_until,
                    &mut backoff,
                    &mut failing,
                );
            }
            self.counters
                .open
                .store(connections.len(), Ordering::Relaxed);
            self.counters
                .peak_open
                .fetch_max(connections.len(), Ordering::Relaxed);
            if self.counters.stopped.load(Ordering::Relaxed) {
                return;
            }
        }
    }

    /// The index of the connection to close for a new one when all slots are taken: the
    /// oldest that has waited past the grace without sending a whole request (or that is
    /// only lingering after its response).
    fn oldest_evictable(&self, connections: &[Connection], now: Instant) -> Option<usize> {
        connections
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                !matches!(c.phase, Phase::Writing) && c.opened + self.limits.eviction_grace <= now
            })
            .min_by_key(|(_, c)| c.opened)
            .map(|(i, _)| i)
    }

    fn accept(
        &mut self,
        connections: &mut Vec<Connection>,
        paused_until: &mut Option<Instant>,
        backoff: &mut Duration,
        failing: &mut bool,
    ) {
        loop {
            let now = Instant::now();
            if connections.len() >= self.limits.max_connections {
                let Some(i) = self.oldest_evictable(connections, now) else {
                    return;
                };
                connections.swap_remove(i);
                self.counters.evicted.fetch_add(1, Ordering::Relaxed);
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if *failing {
                        *failing = false;
                        (self.report)(&format!(
                            "the metrics endpoint {} accepts connections again",
                            self.addr
                        ));
                    }
                    *backoff = BACKOFF.0;
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    self.counters.accepted.fetch_add(1, Ordering::Relaxed);
                    connections.push(Connection {
                        stream,
                        opened: now,
                        deadline: now + self.limits.request_timeout,
                        phase: Phase::Reading,
                        head: Vec::new(),
                        out: Vec::new(),
                        sent: 0,
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if transient(&e) => continue,
                Err(e) if resources(&e) => {
                    self.counters.accept_errors.fetch_add(1, Ordering::Relaxed);
                    if !*failing {
                        *failing = true;
                        (self.report)(&format!(
                            "warning: the metrics endpoint {} cannot accept connections: {e}; \
                             it retries (up to every {} s) and the training goes on",
                            self.addr,
                            BACKOFF.1.as_secs()
                        ));
                    }
                    *paused_until = Some(now + *backoff);
                    *backoff = (*backoff * 2).min(BACKOFF.1);
                    return;
                }
                Err(e) => {
                    self.counters.accept_errors.fetch_add(1, Ordering::Relaxed);
                    self.counters.stopped.store(true, Ordering::Relaxed);
                    (self.report)(&format!(
                        "warning: the metrics endpoint {} stopped: accept failed: {e}; the \
                         training goes on without it",
                        self.addr
                    ));
                    return;
                }
            }
        }
    }

    /// Moves a connection on after poll said it is ready.
    fn advance(&mut self, c: &mut Connection) -> Next {
        match c.phase {
            Phase::Reading => self.read_head(c),
            Phase::Writing => self.write(c),
            Phase::Draining(_) => drain(c),
        }
    }

    fn read_head(&mut self, c: &mut Connection) -> Next {
        let (max_line, max_head) = (self.limits.max_request_line, self.limits.max_head);
        let mut chunk = [0u8; 4096];
        loop {
            // Never hold more than one byte past the cap: enough to know it was passed.
            let room = (max_head + 1)
                .saturating_sub(c.head.len())
                .clamp(1, chunk.len());
            match c.stream.read(&mut chunk[..room]) {
                Ok(0) => return Next::Close,
                Ok(n) => {
                    c.head.extend_from_slice(&chunk[..n]);
                    let out = match http::parse(&c.head, max_line, max_head) {
                        Parsed::Incomplete => continue,
                        Parsed::Request(request) => {
                            self.counters.served.fetch_add(1, Ordering::Relaxed);
                            http::respond(&request, &self.metrics)
                        }
                        Parsed::Reject(status) => {
                            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                            http::reject(status)
                        }
                    };
                    c.head = Vec::new();
                    c.out = out;
                    c.phase = Phase::Writing;
                    return self.write(c);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Keep,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return Next::Close,
            }
        }
    }

    fn write(&mut self, c: &mut Connection) -> Next {
        while c.sent < c.out.len() {
            match c.stream.write(&c.out[c.sent..]) {
                Ok(0) => return Next::Close,
                Ok(n) => c.sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Keep,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return Next::Close,
            }
        }
        c.out = Vec::new();
        if c.stream.shutdown(Shutdown::Write).is_err() {
            return Next::Close;
        }
        c.phase = Phase::Draining(0);
        c.deadline = c.deadline.min(Instant::now() + DRAIN_TIME);
        drain(c)
    }
}

/// Reads and drops what the client still sends after its response, up to [`DRAIN_BYTES`].
fn drain(c: &mut Connection) -> Next {
    let mut chunk = [0u8; 4096];
    loop {
        let Phase::Draining(drained) = &mut c.phase else {
            return Next::Close;
        };
        match c.stream.read(&mut chunk) {
            Ok(0) => return Next::Close,
            Ok(n) => {
                *drained += n;
                if *drained > DRAIN_BYTES {
                    return Next::Close;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Keep,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Next::Close,
        }
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn pollfd(fd: i32, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// An `accept` failure that concerns only the connection being accepted.
fn transient(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::Interrupted
        || matches!(
            e.raw_os_error(),
            Some(
                libc::ECONNABORTED
                    | libc::EPROTO
                    | libc::EPERM
                    | libc::ENETDOWN
                    | libc::ENOPROTOOPT
                    | libc::EHOSTDOWN
                    | libc::ENONET
                    | libc::EHOSTUNREACH
                    | libc::EOPNOTSUPP
                    | libc::ENETUNREACH
            )
        )
}

/// An `accept` failure for want of descriptors or memory: it passes when some are freed.
fn resources(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}
