//! Scrapes a training run's metrics server with a plain TcpStream, as Prometheus would.

use dualpipe_schedule::ScheduleKind;
use dualpipe_train::{ModelSection, ScheduleSection};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use dualpipe_metrics::{MetricsServer, RunLog, RunObserver, TrainingMetrics};
use dualpipe_train::{DType, TrainConfig, Trainer};

fn get(addr: std::net::SocketAddr, path: &str, accept: Option<&str>) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

fn value(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{body}"))
}

fn config(steps: usize) -> TrainConfig {
    TrainConfig {
        model: ModelSection {
            hidden: 8,
            layers_per_stage: 1,
            dtype: DType::F64,
            ..TrainConfig::MLP.model
        },
        schedule: ScheduleSection::new(ScheduleKind::DualPipe, 2, 4, 4),
        steps,
        ..TrainConfig::MLP
    }
}

#[test]
fn a_scrape_during_training_sees_the_steps() {
    let config = config(5);
    let metrics = TrainingMetrics::new(config.schedule.ranks);
    let server = MetricsServer::start("127.0.0.1:0", metrics.clone()).unwrap();
    assert_ne!(server.addr().port(), 0);
    let addr = server.addr();
    let before = get(addr, "/metrics", None);
    assert!(before.starts_with("HTTP/1.1 200"), "{before}");
    assert!(
        before.contains("Content-Type: text/plain; version=0.0.4"),
        "{before}"
    );
    assert_eq!(value(&before, "dualpipe_steps_total"), 0.0);

    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("run.jsonl");
    let mut trainer = Trainer::new(config.clone()).unwrap();
    let mut observer = RunObserver::new(&config, trainer.schedule())
        .with_metrics(metrics.clone())
        .with_log(RunLog::create(&log_path).unwrap());
    let mut scraped_mid_run = None;
    trainer
        .run(|event| {
            let record = observer.observe(event).map_err(|e| e.to_string())?;
            if record.is_some_and(|r| r.step == 2) {
                scraped_mid_run = Some(get(addr, "/metrics", None));
            }
            Ok(())
        })
        .unwrap();
    let mid = scraped_mid_run.unwrap();
    assert_eq!(value(&mid, "dualpipe_steps_total"), 2.0);

    let text = get(addr, "/metrics", None);
    assert_eq!(value(&text, "dualpipe_steps_total"), 5.0);
    assert_eq!(value(&text, "dualpipe_tokens_total"), 5.0 * 16.0);
    for ratio in [
        "dualpipe_pipeline_bubble_ratio",
        "dualpipe_core_wait_ratio",
        "dualpipe_communication_overhead_ratio",
        "dualpipe_pipeline_bubble_ratio_simulated",
    ] {
        let v = value(&text, ratio);
        assert!((0.0..=1.0).contains(&v), "{ratio} = {v}");
    }
    assert!(value(&text, "dualpipe_loss").is_finite());
    assert!(value(&text, "dualpipe_rank_busy_seconds_total{rank=\"1\"}") > 0.0);
    assert!(text.contains("# TYPE dualpipe_steps_total counter"));
    // 5 steps x 4 micro-batches x 1 boundary: 20 activations of 4 x 8 f64s.
    assert_eq!(
        value(&text, "dualpipe_bytes_sent_total{kind=\"activation\"}"),
        20.0 * 4.0 * 8.0 * 8.0
    );

    let open = get(
        addr,
        "/metrics",
        Some("application/openmetrics-text; version=1.0.0"),
    );
    assert!(
        open.contains("Content-Type: application/openmetrics-text"),
        "{open}"
    );
    assert!(open.trim_end().ends_with("# EOF"));
    assert!(open.contains("# TYPE dualpipe_steps counter"));

    assert!(get(addr, "/nothing", None).starts_with("HTTP/1.1 404"));

    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(log.lines().count(), 5);
    let records = dualpipe_metrics::read_log(&log_path).unwrap();
    assert_eq!(records.last().unwrap().tokens_total, 80);
    assert_eq!(
        records.iter().map(|r| r.step).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    drop(server);
    assert!(TcpStream::connect(addr).is_err() || get_fails(addr));
}

/// After the server is dropped, a connection (if the OS still accepts one) gets no answer.
fn get_fails(addr: std::net::SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return true;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
    let mut buf = String::new();
    stream
        .read_to_string(&mut buf)
        .map_or(true, |_| buf.is_empty())
}

#[test]
fn hard_scraping_neither_stops_nor_fails_training() {
    let config = config(20);
    let metrics = TrainingMetrics::new(config.schedule.ranks);
    let server = MetricsServer::start("127.0.0.1:0", metrics.clone()).unwrap();
    let addr = server.addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut scrapes = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && scrapes < 5000 {
                assert!(get(addr, "/metrics", None).starts_with("HTTP/1.1 200"));
                scrapes += 1;
            }
            scrapes
        })
    };
    let mut trainer = Trainer::new(config.clone()).unwrap();
    let mut observer = RunObserver::new(&config, trainer.schedule()).with_metrics(metrics.clone());
    let summary = trainer
        .run(|event| observer.observe(event).map(drop).map_err(|e| e.to_string()))
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let scrapes = scraper.join().unwrap();
    assert!(scrapes > 0);
    assert_eq!(summary.steps, 20);
    assert_eq!(metrics.steps(), 20);
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let server = MetricsServer::start("127.0.0.1:0", TrainingMetrics::new(1)).unwrap();
    let taken = server.addr().to_string();
    let err = MetricsServer::start(&taken, TrainingMetrics::new(1)).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("cannot serve metrics on {taken}")),
        "{err}"
    );
}
