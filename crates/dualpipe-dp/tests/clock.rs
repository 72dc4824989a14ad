//! The logical clock seen through the exchange: stale, duplicate, future and mismatched
//! messages are refused with a clear error; a missing peer times out; misuse is an error.

use std::time::Duration;

use dualpipe_dp::{
    BucketLayout, ChannelTransport, Compression, DpError, ExchangeConfig, GradExchange,
    GradTransport, MsgHeader, MsgKey, Part,
};

type Ex = GradExchange<f32, ChannelTransport>;

fn pair(compression: Compression) -> (Ex, Ex) {
    let layout = BucketLayout::from_bucket_lens(&[6, 4]);
    let cfg = ExchangeConfig {
        compression,
        timeout: Duration::from_millis(300),
        ..ExchangeConfig::default()
    };
    let mut t = ChannelTransport::group(2);
    let b = GradExchange::new(cfg.clone(), layout.clone(), 5, t.pop().unwrap()).unwrap();
    let a = GradExchange::new(cfg, layout, 5, t.pop().unwrap()).unwrap();
    (a, b)
}

fn step(a: &mut Ex, b: &mut Ex, step: u64) -> Result<(), DpError> {
    a.begin_step(step)?;
    b.begin_step(step)?;
    for bucket in 0..2 {
        let n = a.layout().len(bucket);
        a.start_bucket(bucket, &vec![1.0; n])?;
        b.start_bucket(bucket, &vec![3.0; n])?;
    }
    a.finish()?;
    b.finish()?;
    Ok(())
}

/// A well-formed scatter message to worker 1 from worker 0 (3 values of bucket 0).
fn scatter(step: u64, compression: Compression) -> (MsgHeader, Vec<u8>) {
    (
        MsgHeader {
            key: MsgKey {
                step,
                stage: 5,
                bucket: 0,
                part: Part::Scatter { shard: 1 },
            },
            compression,
            values: 3,
        },
        vec![0; 12],
    )
}

#[test]
fn a_healthy_pair_averages() {
    let (mut a, mut b) = pair(Compression::None);
    step(&mut a, &mut b, 0).unwrap();
    assert_eq!(a.averaged(0), &[2.0; 6]);
    assert_eq!(b.param(1), &[2.0; 4]);
    step(&mut a, &mut b, 1).unwrap();
    let s = a.last_step();
    // 3 + 2 values of each half cross from a: (3 + 2) * 2 * 4 bytes.
    assert_eq!((s.messages, s.grad_bytes_sent), (4, 40));
    assert_eq!(a.totals().grad_bytes_sent, 80);
}

#[test]
fn a_message_of_a_past_step_is_refused() {
    let (mut a, mut b) = pair(Compression::None);
    step(&mut a, &mut b, 0).unwrap();
    b.begin_step(1).unwrap();
    let (h, body) = scatter(0, Compression::None);
    b.transport().inject(0, h, body);
    let err = b.progress().unwrap_err();
    assert!(matches!(err, DpError::Stale { current: 1, .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("at step 0") && text.contains("stale"),
        "{text}"
    );
}

#[test]
fn a_duplicate_is_refused_before_and_after_the_original_is_used() {
    let (mut a, mut b) = pair(Compression::None);
    a.begin_step(0).unwrap();
    b.begin_step(0).unwrap();
    a.start_bucket(0, &[1.0; 6]).unwrap();
    let (h, body) = scatter(0, Compression::None);
    b.transport().inject(0, h, body);
    let err = b.progress().unwrap_err();
    assert!(matches!(err, DpError::Duplicate { from: 0, .. }), "{err:?}");
    assert!(err.to_string().contains("second copy"), "{err}");

    let (mut a, mut b) = pair(Compression::None);
    a.begin_step(0).unwrap();
    b.begin_step(0).unwrap();
    a.start_bucket(0, &[1.0; 6]).unwrap();
    b.start_bucket(0, &[1.0; 6]).unwrap(); // uses a's contribution
    let (h, body) = scatter(0, Compression::None);
    b.transport().inject(0, h, body);
    assert!(matches!(
        b.progress().unwrap_err(),
        DpError::Duplicate { .. }
    ));
}

#[test]
fn the_next_step_waits_but_a_later_one_is_refused() {
    let (mut a, mut b) = pair(Compression::None);
    a.begin_step(0).unwrap();
    b.begin_step(0).unwrap();
    // The next step's message waits in the buffer...
    let (h, body) = scatter(1, Compression::None);
    b.transport().inject(0, h, body);
    b.progress().unwrap();
    assert_eq!(b.early_arrivals(), 1);
    // ... and one two steps ahead is an error.
    let (h, body) = scatter(2, Compression::None);
    b.transport().inject(0, h, body);
    let err = b.progress().unwrap_err();
    assert!(
        matches!(err, DpError::FromTheFuture { current: 0, .. }),
        "{err:?}"
    );
}

#[test]
fn a_step_cannot_use_an_early_message_of_the_wrong_step() {
    // Worker 0's step-1 contribution arrives while worker 1 is in step 0: it must not be
    // taken for step 0's (worker 1 waits for the real one and times out without it).
    let (_a, mut b) = pair(Compression::None);
    b.begin_step(0).unwrap();
    let (h, body) = scatter(1, Compression::None);
    b.transport().inject(0, h, body);
    b.start_bucket(0, &[3.0; 6]).unwrap();
    b.start_bucket(1, &[3.0; 4]).unwrap();
    let err = b.finish().unwrap_err();
    assert!(matches!(err, DpError::TimedOut { .. }), "{err:?}");
    assert!(err.to_string().contains("at step 0 from worker 0"), "{err}");
}

#[test]
fn a_peer_with_another_compression_or_layout_is_named() {
    let (_a, mut b) = pair(Compression::None);
    b.begin_step(0).unwrap();
    b.start_bucket(0, &[3.0; 6]).unwrap();
    let (h, body) = scatter(0, Compression::Int8);
    b.transport().inject(0, h, body);
    let err = b.progress().unwrap_err();
    assert!(matches!(err, DpError::Mismatch { .. }), "{err:?}");
    assert!(err.to_string().contains("`gradient_compression`"), "{err}");

    let (_a, mut b) = pair(Compression::None);
    b.begin_step(0).unwrap();
    b.start_bucket(0, &[3.0; 6]).unwrap();
    let (h, _) = scatter(0, Compression::None);
    b.transport().inject(0, h, vec![0; 11]);
    let err = b.progress().unwrap_err();
    assert!(matches!(err, DpError::Decode { .. }), "{err:?}");
    assert!(err.to_string().contains("12 bytes, got 11"), "{err}");
}

#[test]
fn a_missing_peer_times_out_naming_what_is_missing() {
    let (_a, mut b) = pair(Compression::OneBit);
    b.begin_step(0).unwrap();
    b.start_bucket(0, &[3.0; 6]).unwrap();
    b.start_bucket(1, &[3.0; 4]).unwrap();
    let began = std::time::Instant::now();
    let err = b.finish().unwrap_err();
    assert!(began.elapsed() < Duration::from_secs(5));
    let text = err.to_string();
    assert!(
        text.contains("reduce-scatter contribution for shard 1 of bucket 0 of stage 5"),
        "{text}"
    );
}

#[test]
fn misuse_is_an_error() {
    let (mut a, _b) = pair(Compression::None);
    assert!(matches!(
        a.start_bucket(0, &[0.0; 6]),
        Err(DpError::NoStep(_))
    ));
    a.begin_step(3).unwrap();
    assert!(matches!(
        a.start_bucket(2, &[0.0; 6]),
        Err(DpError::NoSuchBucket {
            bucket: 2,
            buckets: 2
        })
    ));
    assert!(matches!(
        a.start_bucket(0, &[0.0; 5]),
        Err(DpError::BucketLength {
            expected: 6,
            got: 5,
            ..
        })
    ));
    a.start_bucket(0, &[0.0; 6]).unwrap();
    assert!(matches!(
        a.start_bucket(0, &[0.0; 6]),
        Err(DpError::StartedTwice { bucket: 0, step: 3 })
    ));
    let err = a.finish().unwrap_err();
    assert!(
        matches!(err, DpError::NotStarted { ref missing, .. } if missing == &[1]),
        "{err}"
    );
    assert!(matches!(
        a.begin_step(4),
        Err(DpError::Unfinished { step: 3, next: 4 })
    ));
    let err = GradExchange::<f32, _>::new(
        ExchangeConfig {
            bucket_bytes: 0,
            ..ExchangeConfig::default()
        },
        BucketLayout::from_bucket_lens(&[1]),
        0,
        ChannelTransport::group(1).pop().unwrap(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("`bucket_bytes`"), "{err}");
    let err = GradExchange::<f64, _>::new(
        ExchangeConfig::default(),
        BucketLayout::from_bucket_lens(&[usize::MAX / 4]),
        0,
        ChannelTransport::group(1).pop().unwrap(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("addressed"), "{err}");
}

#[test]
fn all_reduce_runs_a_whole_step_on_a_flat_slice() {
    let (mut a, mut b) = pair(Compression::None);
    let t = std::thread::spawn(move || {
        let mut g = vec![3.0f32; 10];
        b.all_reduce(0, &mut g).map(|_| g)
    });
    let mut g: Vec<f32> = (0..10).map(|i| i as f32).collect();
    a.all_reduce(0, &mut g).unwrap();
    let expected: Vec<f32> = (0..10).map(|i| (i as f32 + 3.0) / 2.0).collect();
    assert_eq!(g, expected);
    assert_eq!(t.join().unwrap().unwrap(), expected);
    assert!(a.all_reduce(1, &mut [0.0; 9]).is_err());
}

#[test]
fn a_group_of_one_returns_the_gradients_unchanged() {
    let t = ChannelTransport::group(1).pop().unwrap();
    let cfg = ExchangeConfig {
        compression: Compression::OneBit,
        ..ExchangeConfig::default()
    };
    let mut ex =
        GradExchange::<f64, _>::new(cfg, BucketLayout::from_bucket_lens(&[3]), 0, t).unwrap();
    ex.begin_step(0).unwrap();
    ex.start_bucket(0, &[0.1, -2.0, 1e-300]).unwrap();
    let s = ex.finish().unwrap();
    assert_eq!(ex.averaged(0), &[0.1, -2.0, 1e-300]);
    assert_eq!((s.messages, s.grad_bytes_sent), (0, 0));
    assert_eq!(ex.transport().stats().messages, 0);
}
