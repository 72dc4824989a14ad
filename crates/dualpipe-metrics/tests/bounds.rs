//! The metrics server stays bounded under hostile clients (loopback only): idle
//! connections by the thousand, endless headers, clients that never finish.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use dualpipe_metrics::{MetricsServer, ServerLimits, TrainingMetrics};

fn server(limits: ServerLimits) -> MetricsServer {
    MetricsServer::start_with(
        "127.0.0.1:0",
        TrainingMetrics::new(2),
        limits,
        Box::new(|line: &str| eprintln!("{line}")),
    )
    .unwrap()
}

fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request).unwrap();
    // Nothing more comes: a request that never completes is closed at once, not timed out.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

fn scrape(addr: SocketAddr) -> String {
    exchange(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
}

/// The threads of this process named like the server's.
fn server_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "dualpipe-metrics")
        .count()
}

/// Raises this process's soft descriptor limit to the hard one; returns the soft limit.
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid pointer to an rlimit for getrlimit/setrlimit to fill and read.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur
}

#[test]
fn thousands_of_idle_connections_hold_one_thread_and_a_bounded_count_and_scrapes_go_on() {
    let cap = 64;
    let server = server(ServerLimits {
        max_connections: cap,
        request_timeout: Duration::from_secs(30),
        eviction_grace: Duration::from_millis(100),
        ..ServerLimits::default()
    });
    let addr = server.addr();
    let wanted = 2000.min(raise_nofile().saturating_sub(300) as usize);
    assert!(wanted >= 500, "too few descriptors for the test");
    let started = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..wanted {
        // A full backlog makes connect wait; give up on that one rather than hang.
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
            continue;
        };
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n");
        idle.push(s);
        if started.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    assert!(idle.len() >= 500, "only {} connections opened", idle.len());
    let t = Instant::now();
    let response = scrape(addr);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("dualpipe_steps_total"));
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    let stats = server.stats();
    assert!(stats.peak_open <= cap, "{stats:?}");
    assert!(stats.evicted > 0, "{stats:?}");
    // One thread for the server, whatever the number of clients (the other three tests of
    // this file may run a server of their own at the same time).
    assert!(server_threads() <= 4, "{} server threads", server_threads());
    drop(idle);
}

#[test]
fn idle_connections_are_closed_at_the_request_timeout() {
    let server = server(ServerLimits {
        request_timeout: Duration::from_millis(500),
        ..ServerLimits::default()
    });
    let mut idle: Vec<TcpStream> = (0..10)
        .map(|_| {
            let mut s = TcpStream::connect(server.addr()).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(server.stats().open, 10);
    std::thread::sleep(Duration::from_millis(1300));
    let stats = server.stats();
    assert_eq!((stats.open, stats.timed_out), (0, 10), "{stats:?}");
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        // Closed by the server: end of stream (or a reset), not a timeout.
        match s.read_to_end(&mut buf) {
            Ok(_) => assert!(buf.is_empty()),
            Err(e) => assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
        }
    }
    assert!(scrape(server.addr()).starts_with("HTTP/1.1 200"));
}

#[test]
fn an_endless_header_is_cut_at_the_cap() {
    let server = server(ServerLimits::default());
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ")
        .unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0usize;
    // 64 MiB unless cut: the server stops reading and closes at its 16 KiB cap.
    while sent < 64 << 20 {
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    assert!(sent < 16 << 20, "{sent} bytes of header taken");
    let stats = server.stats();
    assert_eq!(stats.rejected, 1, "{stats:?}");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(server.stats().open, 0);
    // A reader sees 431 before the close.
    let mut big = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 20_000));
    big.extend_from_slice(b"\r\n\r\n");
    let response = exchange(server.addr(), &big);
    assert!(response.starts_with("HTTP/1.1 431"), "{response}");
    let long_line = [b"GET /".as_slice(), &[b'a'; 9000], b" HTTP/1.1\r\n\r\n"].concat();
    assert!(exchange(server.addr(), &long_line).starts_with("HTTP/1.1 414"));
}

#[test]
fn hostile_requests_get_a_clear_status_and_scrapes_go_on() {
    let server = server(ServerLimits::default());
    let addr = server.addr();
    for (request, status) in [
        (&b"GARBAGE\r\n\r\n"[..], "400"),
        (b"GET /metrics\r\n\r\n", "400"),
        (b"GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n", "505"),
        (b"get /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "405"),
        (
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
            "405",
        ),
        (b"GET /../../etc/passwd HTTP/1.1\r\n\r\n", "404"),
        (b"GET /metrics HTTP/1.1\nHost: x\n\n", "200"),
        (b"GET http://evil/metrics HTTP/1.1\r\n\r\n", "200"),
    ] {
        let response = exchange(addr, request);
        assert!(
            response.starts_with(&format!("HTTP/1.1 {status}")),
            "{request:?}: {response}"
        );
    }
    let head = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(
        head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"),
        "{head}"
    );
    // Pipelined requests: the first is answered, the connection closes cleanly.
    let pipelined = exchange(addr, &b"GET /metrics HTTP/1.1\r\n\r\n".repeat(200));
    assert_eq!(pipelined.matches("HTTP/1.1 200").count(), 1);
    let binary: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    let _ = exchange(addr, &binary);
    assert!(scrape(addr).starts_with("HTTP/1.1 200"));
    // Every connection is closed once its client has gone (the last one a moment later).
    let t = Instant::now();
    while server.stats().open > 0 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.stats().open, 0);
}
