//! The shared server under hostile clients (loopback only): slow bodies, bad framing, idle
//! connections, slow handlers, and a shutdown that waits for none of them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dualpipe_http::{Limits, Request, Response, Server};

/// A server whose handler echoes the body's length, and sleeps 5 s on `/slow`.
fn server(limits: Limits) -> Server {
    let handler = Arc::new(|rq: &Request| {
        if rq.path == "/slow" {
            std::thread::sleep(Duration::from_secs(5));
        }
        Response::text(200, format!("{} {} bytes\n", rq.method, rq.body.len()))
    });
    Server::start(
        "127.0.0.1:0",
        "http-test",
        limits,
        handler,
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
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

fn get(addr: SocketAddr) -> String {
    exchange(addr, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
}

#[test]
fn a_slow_body_is_answered_408_and_blocks_nobody() {
    let server = server(Limits {
        request_timeout: Duration::from_millis(800),
        ..Limits::default()
    });
    let addr = server.addr();
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(b"POST /jobs HTTP/1.1\r\nContent-Length: 5000\r\n\r\n{\"args\": [")
        .unwrap();
    // Others are served while the body is late.
    assert!(get(addr).starts_with("HTTP/1.1 200"), "{}", get(addr));
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    let _ = slow.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(server.stats().timed_out, 1);
    // A whole body is taken.
    let whole = exchange(
        addr,
        b"POST /jobs HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert!(whole.ends_with("POST 5 bytes\n"), "{whole}");
}

#[test]
fn bad_framing_is_a_clear_status() {
    let server = server(Limits {
        max_body: 100,
        ..Limits::default()
    });
    let addr = server.addr();
    for (request, status) in [
        (
            &b"POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n{}"[..],
            "400",
        ),
        (b"POST / HTTP/1.1\r\nContent-Length: 5x\r\n\r\n", "400"),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "400",
        ),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n{}",
            "413",
        ),
        (b"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", "413"),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            "411",
        ),
        ("GET /jobs/\u{e9} HTTP/1.1\r\n\r\n".as_bytes(), "400"),
        (b"\x00\x01\x02garbage\r\n\r\n", "400"),
        (b"GET /x HTTP/2.0\r\n\r\n", "505"),
    ] {
        let answer = exchange(addr, request);
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{request:?}: {answer}"
        );
    }
    assert!(get(addr).starts_with("HTTP/1.1 200"));
}

#[test]
fn slow_handlers_run_off_the_loop_and_shutdown_waits_for_none() {
    let server = server(Limits {
        workers: 2,
        ..Limits::default()
    });
    let addr = server.addr();
    let slow = std::thread::spawn(move || exchange(addr, b"GET /slow HTTP/1.1\r\n\r\n"));
    std::thread::sleep(Duration::from_millis(200));
    // The other worker, and the loop, go on.
    let t = Instant::now();
    assert!(get(addr).starts_with("HTTP/1.1 200"));
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    // An idle client and a handler still running: dropping the server waits for neither.
    let mut idle = TcpStream::connect(addr).unwrap();
    idle.write_all(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n")
        .unwrap();
    let t = Instant::now();
    drop(server);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    drop(slow);
}

#[test]
fn idle_connections_beyond_the_cap_lock_nobody_out() {
    let server = server(Limits {
        max_connections: 16,
        eviction_grace: Duration::from_millis(50),
        request_timeout: Duration::from_secs(30),
        ..Limits::default()
    });
    let addr = server.addr();
    let idle: Vec<TcpStream> = (0..300)
        .filter_map(|_| {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
            s.write_all(b"GET /x HTTP/1.1\r\n").ok()?;
            Some(s)
        })
        .collect();
    assert!(idle.len() >= 100, "{}", idle.len());
    std::thread::sleep(Duration::from_millis(100));
    assert!(get(addr).starts_with("HTTP/1.1 200"));
    let stats = server.stats();
    assert!(stats.peak_open <= 16 && stats.evicted > 0, "{stats:?}");
}
