//! The exchange on a library's own all-reduce ([`NativeExchange`]), over an in-process group
//! of threads that sums in member order ([`ThreadSum`]; MPI's is tested by
//! `scripts/mpi_test.sh` and `scripts/dp_mpi_test.sh`): the same
//! means as the point-to-point exchange (bit for bit with two members), every member
//! identical, DualPipe's `2 D` members divided by `D`, and the refusals.

mod support;

use std::time::Duration;

use dualpipe_dp::{
    BucketExchange, BucketLayout, Compression, DpError, ErrorFeedbackState, ExchangeConfig,
    NativeExchange, Reduce, ThreadSum,
};
use support::{grads, run, Net};

fn layout() -> BucketLayout {
    BucketLayout::new(&[100, 7, 300, 1, 250, 3, 64, 0, 129], 1024, 4).unwrap()
}

/// `steps` steps of a group of `d` on threads: each member's buckets (member `w`'s gradients
/// are `grads(.., w, ..)`), in reverse bucket order, finished; per member, per step, the
/// averaged buckets.
fn native_run(d: usize, config: &ExchangeConfig, steps: u64) -> Vec<Vec<Vec<Vec<f64>>>> {
    let layout = layout();
    std::thread::scope(|scope| {
        let handles: Vec<_> = ThreadSum::<f64>::group(d)
            .into_iter()
            .enumerate()
            .map(|(w, g)| {
                let (layout, config) = (layout.clone(), config.clone());
                scope.spawn(move || {
                    let mut ex = NativeExchange::new(config, layout.clone(), 0, Box::new(g))?;
                    let mut out = Vec::new();
                    for step in 0..steps {
                        ex.begin_step(step)?;
                        for b in (0..layout.buckets()).rev() {
                            ex.start_bucket(b, &grads::<f64>(&layout, step, w, b))?;
                            ex.progress()?;
                        }
                        ex.finish()?;
                        out.push(
                            (0..layout.buckets())
                                .map(|b| ex.averaged(b).to_vec())
                                .collect(),
                        );
                    }
                    Ok::<_, DpError>(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    })
}

#[test]
fn two_members_give_the_point_to_point_means_bit_for_bit_and_more_agree_to_rounding() {
    let config = ExchangeConfig::default();
    for d in 1..=4 {
        let ours = run::<f64>(Net::Channels, d, &config, &layout(), 3).unwrap();
        let native = native_run(d, &config, 3);
        for (w, got) in native.iter().enumerate() {
            for step in 0..3 {
                let want = &ours[w].results[step];
                if d <= 2 {
                    assert_eq!(&got[step], want, "D {d}, member {w}, step {step}");
                }
                for (g, o) in got[step].iter().flatten().zip(want.iter().flatten()) {
                    assert!(
                        (g - o).abs() <= 1e-12 * o.abs().max(1e-300),
                        "D {d}: {g} vs {o}"
                    );
                }
                // Every member ends with the same bits.
                assert_eq!(got[step], native[0][step], "D {d}, member {w}, step {step}");
            }
        }
    }
}

#[test]
fn dualpipe_copies_as_members_divided_by_the_replicas_equal_the_summed_copies_exchange() {
    // 2 replicas x 2 copies: members (replica, copy) in that order, divided by D = 2, against
    // the point-to-point exchange of each replica's copies summed first.
    let layout = layout();
    let config = ExchangeConfig {
        reduce: Reduce::Divide(2),
        ..ExchangeConfig::default()
    };
    let native = native_run(4, &config, 2);
    for (step, buckets) in native[0].iter().enumerate() {
        for (b, got) in buckets.iter().enumerate() {
            let g = |w| grads::<f64>(&layout, step as u64, w, b);
            let (c00, c01, c10, c11) = (g(0), g(1), g(2), g(3));
            for (i, v) in got.iter().enumerate() {
                let want = ((c00[i] + c01[i]) + (c10[i] + c11[i])) / 2.0;
                assert!((v - want).abs() <= 1e-12 * want.abs().max(1e-300));
            }
        }
    }
    for member in &native {
        assert_eq!(member, &native[0]);
    }
}

#[test]
fn refusals_name_the_problem() {
    let lossy = ExchangeConfig {
        compression: Compression::Int8,
        ..ExchangeConfig::default()
    };
    let mut g = ThreadSum::<f32>::group(2).into_iter();
    let err = NativeExchange::new(lossy, layout(), 0, Box::new(g.next().unwrap())).unwrap_err();
    assert!(
        err.to_string().contains("uncompressed gradients only"),
        "{err}"
    );

    let quick = ExchangeConfig {
        timeout: Duration::from_millis(50),
        ..ExchangeConfig::default()
    };
    let one = BucketLayout::from_bucket_lens(&[4, 2]);
    let mut ex = NativeExchange::<f32>::new(quick, one, 3, Box::new(g.next().unwrap())).unwrap();
    assert!(matches!(
        ex.start_bucket(0, &[0.0; 4]),
        Err(DpError::NoStep(_))
    ));
    ex.begin_step(5).unwrap();
    assert!(matches!(
        ex.start_bucket(0, &[0.0; 3]),
        Err(DpError::BucketLength { .. })
    ));
    assert!(matches!(
        ex.start_bucket(2, &[]),
        Err(DpError::NoSuchBucket { .. })
    ));
    ex.start_bucket(0, &[1.0; 4]).unwrap();
    assert!(matches!(ex.finish(), Err(DpError::NotStarted { .. })));
    assert!(matches!(
        ex.start_bucket(0, &[1.0; 4]),
        Err(DpError::StartedTwice { .. })
    ));
    ex.start_bucket(1, &[1.0; 2]).unwrap();
    // The other member never starts its sums: the wait ends, naming the bucket.
    let err = ex.finish().unwrap_err().to_string();
    assert!(
        err.contains("thread-sum's sum of bucket 0 of stage 3, step 5"),
        "{err}"
    );
    assert!(matches!(ex.begin_step(6), Err(DpError::Unfinished { .. })));

    let mut solo = ThreadSum::<f32>::group(1).into_iter();
    let mut ex = NativeExchange::<f32>::new(
        ExchangeConfig::default(),
        BucketLayout::from_bucket_lens(&[2]),
        0,
        Box::new(solo.next().unwrap()),
    )
    .unwrap();
    let kept = ErrorFeedbackState {
        worker: vec![vec![0.5, 0.0]],
        server: vec![Vec::new()],
    };
    assert!(ex.set_error_feedback(kept).is_err());
    ex.set_error_feedback(ErrorFeedbackState::empty(1)).unwrap();
    let mut values = [3.0, -1.0];
    ex.all_reduce(1, &mut values).unwrap();
    assert_eq!(values, [3.0, -1.0]);
    assert!(matches!(
        ex.begin_step(1),
        Err(DpError::StepNotLater { .. })
    ));
}
