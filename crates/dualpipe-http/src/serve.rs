//! The server's loop: `poll(2)` over a wake-up socket, the listener, the workers' answers and
//! at most [`Limits::max_connections`] open connections, each read under the caps and closed
//! by its deadline; and the [`Pool`] of worker threads that run the handler.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::parse::{self, Head, Parsed};
use super::{Counters, Handler, Limits, Report, Request, Response};

/// At most this much of what a client sends after its request is read and discarded
/// before the connection is closed (closing with unread data would reset it and could
/// lose the response on the client's side).
const DRAIN_BYTES: usize = 64 * 1024;
/// How long a connection may linger after its response to let the client close first.
const DRAIN_TIME: Duration = Duration::from_secs(1);
/// How long a `408` may take to send before the connection is closed anyway.
const LATE_ANSWER_TIME: Duration = Duration::from_secs(1);
/// The first and the longest pause after `accept` fails for want of descriptors or memory.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

/// A whole request for a worker.
struct Job {
    id: u64,
    request: Request,
}

/// The worker threads: requests go in on `jobs`, encoded answers come back on `done`, and
/// each answer writes a byte to the loop's `notify` socket.
pub(crate) struct Pool {
    jobs: Sender<Job>,
    done: Receiver<(u64, Vec<u8>)>,
    notify: UnixStream,
}

impl Pool {
    /// Starts `workers` threads running `handler`. They end when the pool is dropped and
    /// their current request is answered; nobody waits for them.
    pub(crate) fn start(name: &str, workers: usize, handler: Handler) -> std::io::Result<Pool> {
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let (done_tx, done) = channel();
        let (notify_tx, notify) = UnixStream::pair()?;
        notify.set_nonblocking(true)?;
        notify_tx.set_nonblocking(true)?;
        for _ in 0..workers {
            let queue = Arc::clone(&queue);
            let handler = Arc::clone(&handler);
            let done_tx: Sender<(u64, Vec<u8>)> = done_tx.clone();
            let notify_tx = notify_tx.try_clone()?;
            std::thread::Builder::new()
                .name(format!("{name}-w"))
                .spawn(move || loop {
                    let job = match queue.lock() {
                        Ok(q) => q.recv(),
                        Err(_) => return,
                    };
                    let Ok(job) = job else { return };
                    let head_only = job.request.method == "HEAD";
                    let response =
                        std::panic::catch_unwind(AssertUnwindSafe(|| handler(&job.request)))
                            .unwrap_or_else(|_| {
                                Response::text(500, "the request's handler failed\n")
                            });
                    if done_tx.send((job.id, response.encode(head_only))).is_err() {
                        return;
                    }
                    // A full socket already holds a wake-up: the byte is not needed.
                    let _ = (&notify_tx).write(&[1]);
                })?;
        }
        Ok(Pool { jobs, done, notify })
    }
}

enum Phase {
    /// Reading the request head and body.
    Reading,
    /// A worker has the request.
    Handling,
    /// Sending `out[sent..]`.
    Writing,
    /// Response sent and the write side shut down; discarding what the client still sends.
    Draining(usize),
}

struct Connection {
    id: u64,
    stream: TcpStream,
    opened: Instant,
    deadline: Option<Instant>,
    phase: Phase,
    buf: Vec<u8>,
    head: Option<Head>,
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
    pub pool: Pool,
    pub limits: Limits,
    pub counters: Arc<Counters>,
    pub report: Report,
    pub addr: String,
}

impl Serve {
    /// Serves until a byte arrives on the waker (or it closes), or the server cannot go on
    /// (said in one line through `report`).
    pub(crate) fn run(mut self) {
        let mut connections: Vec<Connection> = Vec::new();
        let mut next_id = 0u64;
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
            fds.push(pollfd(self.pool.notify.as_raw_fd(), libc::POLLIN));
            let listener_fd = if listen {
                self.listener.as_raw_fd()
            } else {
                -1
            };
            fds.push(pollfd(listener_fd, libc::POLLIN));
            for c in &connections {
                let (fd, events) = match c.phase {
                    Phase::Writing => (c.stream.as_raw_fd(), libc::POLLOUT),
                    // A worker has it: nothing to watch until the answer comes.
                    Phase::Handling => (-1, 0),
                    _ => (c.stream.as_raw_fd(), libc::POLLIN),
                };
                fds.push(pollfd(fd, events));
            }
            let mut wake = connections.iter().filter_map(|c| c.deadline).min();
            if full && !evictable {
                let grace = self.limits.eviction_grace;
                let soonest = connections
                    .iter()
                    .filter(|c| self.may_evict(c))
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
                    "warning: the HTTP endpoint {} stopped: poll failed: {e}",
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
                let revents = fds[i + 3].revents;
                let c = &mut connections[i];
                let next = if revents != 0 {
                    self.advance(c)
                } else {
                    Next::Keep
                };
                let next = match next {
                    Next::Keep if c.deadline.is_some_and(|d| d <= now) => self.expire(c),
                    next => next,
                };
                if matches!(next, Next::Close) {
                    connections.swap_remove(i);
                }
            }
            if fds[1].revents != 0 {
                let mut sink = [0u8; 256];
                while matches!((&self.pool.notify).read(&mut sink), Ok(n) if n > 0) {}
            }
            while let Ok((id, out)) = self.pool.done.try_recv() {
                let Some(i) = connections.iter().position(|c| c.id == id) else {
                    continue;
                };
                if let Next::Close = self.answer(&mut connections[i], out) {
                    connections.swap_remove(i);
                }
            }
            if fds[2].revents != 0 {
                self.accept(
                    &mut connections,
                    &mut next_id,
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

    /// Whether `c` may be closed for a new connection once its grace has passed: it has no
    /// whole request yet, or it only lingers after its response.
    fn may_evict(&self, c: &Connection) -> bool {
        matches!(c.phase, Phase::Reading | Phase::Draining(_))
    }

    /// The index of the connection to close for a new one when all slots are taken: the
    /// oldest evictable one past its grace.
    fn oldest_evictable(&self, connections: &[Connection], now: Instant) -> Option<usize> {
        connections
            .iter()
            .enumerate()
            .filter(|(_, c)| self.may_evict(c) && c.opened + self.limits.eviction_grace <= now)
            .min_by_key(|(_, c)| c.opened)
            .map(|(i, _)| i)
    }

    /// What happens to a connection past its deadline: a late body is answered `408`,
    /// anything else is closed.
    fn expire(&mut self, c: &mut Connection) -> Next {
        match c.phase {
            Phase::Draining(_) => Next::Close,
            Phase::Reading if c.head.is_some() => {
                self.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                let late = Response::text(
                    408,
                    "the request body did not arrive in time; send it whole and at once\n",
                );
                c.head = None;
                let next = self.answer(c, late.encode(false));
                c.deadline = Some(Instant::now() + LATE_ANSWER_TIME);
                next
            }
            _ => {
                self.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                Next::Close
            }
        }
    }

    fn accept(
        &mut self,
        connections: &mut Vec<Connection>,
        next_id: &mut u64,
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
                            "the HTTP endpoint {} accepts connections again",
                            self.addr
                        ));
                    }
                    *backoff = BACKOFF.0;
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    self.counters.accepted.fetch_add(1, Ordering::Relaxed);
                    *next_id += 1;
                    connections.push(Connection {
                        id: *next_id,
                        stream,
                        opened: now,
                        deadline: Some(now + self.limits.request_timeout),
                        phase: Phase::Reading,
                        buf: Vec::new(),
                        head: None,
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
                            "warning: the HTTP endpoint {} cannot accept connections: {e}; \
                             it retries (up to every {} s)",
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
                        "warning: the HTTP endpoint {} stopped: accept failed: {e}",
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
            Phase::Reading => self.read_request(c),
            Phase::Handling => Next::Keep,
            Phase::Writing => write(c),
            Phase::Draining(_) => drain(c),
        }
    }

    fn read_request(&mut self, c: &mut Connection) -> Next {
        let l = &self.limits;
        let (max_line, max_head, max_body) = (l.max_request_line, l.max_head, l.max_body);
        let mut chunk = [0u8; 4096];
        loop {
            // Never hold more than one byte past the head's cap, nor past the body's end.
            let want = c.head.as_ref().map_or(max_head + 1, |h| h.len + h.body_len);
            let room = want.saturating_sub(c.buf.len()).clamp(1, chunk.len());
            match c.stream.read(&mut chunk[..room]) {
                Ok(0) => return Next::Close,
                Ok(n) => {
                    c.buf.extend_from_slice(&chunk[..n]);
                    if c.head.is_none() {
                        match parse::parse(&c.buf, max_line, max_head, max_body) {
                            Parsed::Incomplete => continue,
                            Parsed::Head(h) => c.head = Some(h),
                            Parsed::Reject(status, why) => {
                                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                                let r = Response::text(status, format!("{why}\n"));
                                return self.answer(c, r.encode(false));
                            }
                        }
                    }
                    if let Some(h) = &c.head {
                        if c.buf.len() >= h.len + h.body_len {
                            return self.dispatch(c);
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Keep,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return Next::Close,
            }
        }
    }

    /// Hands a whole request to the workers.
    fn dispatch(&mut self, c: &mut Connection) -> Next {
        let Some(h) = c.head.take() else {
            return Next::Close;
        };
        let body = c.buf[h.len..h.len + h.body_len].to_vec();
        c.buf = Vec::new();
        let request = Request {
            method: h.method,
            path: h.path,
            query: h.query,
            headers: h.headers,
            body,
        };
        self.counters.served.fetch_add(1, Ordering::Relaxed);
        c.phase = Phase::Handling;
        c.deadline = None;
        if self.pool.jobs.send(Job { id: c.id, request }).is_err() {
            let r = Response::text(503, "the server is stopping\n");
            return self.answer(c, r.encode(false));
        }
        Next::Keep
    }

    /// Starts sending `out` on `c`.
    fn answer(&mut self, c: &mut Connection, out: Vec<u8>) -> Next {
        c.buf = Vec::new();
        c.out = out;
        c.sent = 0;
        c.phase = Phase::Writing;
        c.deadline = Some(Instant::now() + self.limits.request_timeout);
        write(c)
    }
}

fn write(c: &mut Connection) -> Next {
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
    let linger = Instant::now() + DRAIN_TIME;
    c.deadline = Some(c.deadline.map_or(linger, |d| d.min(linger)));
    drain(c)
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
