//! After file-descriptor exhaustion (`accept` fails with `EMFILE`) the metrics listener
//! backs off, says so once, and serves again when descriptors are free (loopback only).
//! Its own test binary: it lowers this process's descriptor limit.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dualpipe_metrics::{MetricsServer, ServerLimits, TrainingMetrics};

fn nofile() -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid pointer for getrlimit to fill.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim
}

fn set_nofile(lim: libc::rlimit) {
    // SAFETY: a valid rlimit for setrlimit to read.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

#[test]
fn the_listener_survives_descriptor_exhaustion_and_says_so() {
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = Arc::clone(&lines);
    let server = MetricsServer::start_with(
        "127.0.0.1:0",
        TrainingMetrics::new(1),
        ServerLimits::default(),
        Box::new(move |line: &str| sink.lock().unwrap().push(line.to_string())),
    )
    .unwrap();
    let addr = server.addr();
    let saved = nofile();
    set_nofile(libc::rlimit {
        rlim_cur: open_fds() + 64,
        rlim_max: saved.rlim_max,
    });
    // Take every descriptor left, then give one back for the client's socket.
    let mut hog = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        hog.push(f);
    }
    assert!(!hog.is_empty());
    hog.pop();
    let mut client = TcpStream::connect(addr).unwrap();
    client
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let t = Instant::now();
    while server.stats().accept_errors == 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Backing off, not spinning: a handful of failed accepts over half a second.
    std::thread::sleep(Duration::from_millis(500));
    let errors = server.stats().accept_errors;
    assert!((1..=20).contains(&errors), "{errors} failed accepts");
    drop(hog);
    set_nofile(saved);
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut response = String::new();
    client.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let stats = server.stats();
    assert!(!stats.stopped, "{stats:?}");
    let lines = lines.lock().unwrap().clone();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].contains("cannot accept connections") && lines[0].contains("Too many open files"),
        "{lines:?}"
    );
    assert!(lines[1].contains("accepts connections again"), "{lines:?}");
    // And it keeps serving new clients.
    let mut again = TcpStream::connect(addr).unwrap();
    again.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut response = String::new();
    again.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}
