//! Error feedback: the long-run average of compressed gradients converges to the true one
//! only with it; its state survives a checkpoint.

mod support;

use dualpipe_dp::{
    BucketLayout, ChannelTransport, Compression, DpError, ErrorFeedbackState, ExchangeConfig,
    GradExchange,
};
use support::{run_with, value, Net};

/// Gradients with a persistent structure (magnitudes spread over two orders within every
/// chunk, as real gradients are) plus a little per-step noise.
fn structured(layout: &BucketLayout, step: u64, worker: usize, bucket: usize) -> Vec<f64> {
    (0..layout.len(bucket))
        .map(|i| {
            let base = [0.01, -0.1, 1.0, 0.3, -2.0, 0.05, 0.7, -0.02][(i + worker * 3) % 8];
            base * (1.0 + bucket as f64) + 0.05 * value(3, step, worker, i)
        })
        .collect()
}

/// Max over values of |long-run average of the exchange's results - true average|, relative
/// to the largest true average.
fn long_run_error(compression: Compression, error_feedback: bool, steps: u64) -> f64 {
    let layout = BucketLayout::from_bucket_lens(&[96, 40]);
    let cfg = ExchangeConfig {
        compression,
        error_feedback,
        chunk_values: 16,
        ..ExchangeConfig::default()
    };
    let d = 3;
    let runs = run_with::<f64>(Net::Channels, d, &cfg, &layout, steps, structured).unwrap();
    let mut worst = 0.0f64;
    let mut scale = 0.0f64;
    for b in 0..layout.buckets() {
        for i in 0..layout.len(b) {
            let mut truth = 0.0;
            let mut got = 0.0;
            for step in 0..steps {
                let exact: f64 = (0..d)
                    .map(|w| structured(&layout, step, w, b)[i])
                    .sum::<f64>()
                    / d as f64;
                truth += exact / steps as f64;
                got += runs[0].results[step as usize][b][i] / steps as f64;
            }
            worst = worst.max((got - truth).abs());
            scale = scale.max(truth.abs());
        }
    }
    worst / scale
}

#[test]
fn one_bit_with_error_feedback_converges_to_the_true_average_and_without_it_does_not() {
    let with = long_run_error(Compression::OneBit, true, 400);
    let without = long_run_error(Compression::OneBit, false, 400);
    println!("1bit long-run error: {with:.5} with error feedback, {without:.5} without");
    // With feedback the error of the average is (residual) / steps: it shrinks with steps.
    // (Measured: 0.133, 0.069, 0.030, 0.019, 0.0088, 0.0035 after 50, 100, 200, 400, 800,
    // 1600 steps: about 1 / steps.)
    assert!(with < 0.03, "with error feedback: {with}");
    assert!(without > 0.2, "without error feedback: {without}");
    let shorter = long_run_error(Compression::OneBit, true, 100);
    assert!(
        2.0 * with < shorter,
        "{with} after 400 steps vs {shorter} after 100"
    );
    // int8 is nearly exact either way, and feedback still helps.
    let int8 = long_run_error(Compression::Int8, true, 100);
    assert!(int8 < 1e-3, "int8 {int8}");
}

fn pair(
    config: &ExchangeConfig,
    layout: &BucketLayout,
) -> Vec<GradExchange<f64, ChannelTransport>> {
    ChannelTransport::group(2)
        .into_iter()
        .map(|t| GradExchange::new(config.clone(), layout.clone(), 0, t).unwrap())
        .collect()
}

/// One step of both workers driven from one thread.
fn step_both(
    exs: &mut [GradExchange<f64, ChannelTransport>],
    layout: &BucketLayout,
    step: u64,
) -> Result<Vec<Vec<f64>>, DpError> {
    for ex in exs.iter_mut() {
        ex.begin_step(step)?;
    }
    for b in 0..layout.buckets() {
        for (w, ex) in exs.iter_mut().enumerate() {
            ex.start_bucket(b, &structured(layout, step, w, b))?;
        }
    }
    for ex in exs.iter_mut() {
        ex.finish()?;
    }
    Ok(exs
        .iter()
        .map(|ex| {
            (0..layout.buckets())
                .flat_map(|b| ex.averaged(b).to_vec())
                .collect()
        })
        .collect())
}

#[test]
fn a_resumed_exchange_with_the_saved_state_continues_bit_identically() {
    let layout = BucketLayout::from_bucket_lens(&[50, 21]);
    let cfg = ExchangeConfig {
        compression: Compression::OneBit,
        chunk_values: 8,
        ..ExchangeConfig::default()
    };
    let mut straight = pair(&cfg, &layout);
    let mut all = Vec::new();
    for step in 0..6 {
        all.push(step_both(&mut straight, &layout, step).unwrap());
    }
    let mut first = pair(&cfg, &layout);
    for step in 0..3 {
        assert_eq!(
            step_both(&mut first, &layout, step).unwrap(),
            all[step as usize]
        );
    }
    let saved: Vec<ErrorFeedbackState<f64>> =
        first.iter().map(|ex| ex.error_feedback().clone()).collect();
    assert!(saved[0].worker[0].iter().any(|&e| e != 0.0));
    assert_eq!(
        saved[1].server[1].len(),
        10,
        "worker 1 owns 10 of the 21 values"
    );
    let mut resumed = pair(&cfg, &layout);
    for (ex, state) in resumed.iter_mut().zip(saved.clone()) {
        ex.set_error_feedback(state).unwrap();
    }
    for step in 3..6 {
        assert_eq!(
            step_both(&mut resumed, &layout, step).unwrap(),
            all[step as usize]
        );
    }
    // Without the state the continuation differs.
    let mut fresh = pair(&cfg, &layout);
    assert_ne!(step_both(&mut fresh, &layout, 3).unwrap(), all[3]);
    // A state of another shape is refused with its reason.
    let mut wrong = saved[0].clone();
    wrong.worker[1] = vec![0.0; 3];
    let err = resumed[0].set_error_feedback(wrong).unwrap_err();
    assert!(err.to_string().contains("bucket 1"), "{err}");
    let err = resumed[0]
        .set_error_feedback(ErrorFeedbackState::empty(5))
        .unwrap_err();
    assert!(err.to_string().contains("5 worker"), "{err}");
}
