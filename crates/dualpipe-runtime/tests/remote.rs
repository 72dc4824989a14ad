//! One rank per "process": each rank runs on its own thread with its own stages and an
//! [`Endpoint`] over the in-memory [`ChannelLink`], exactly as MPI processes do over
//! `MpiLink`. The losses and summed gradients must equal the local executor's bit for bit,
//! and a failure must stop every rank naming the failed one.

mod common;

use std::time::{Duration, Instant};

use common::{
    affine_ranks, bidirectional, faulty_ranks, golden, gpipe, one_f_one_b_split, v_shape,
    AffineStage, Fault, Faulty,
};
use dualpipe_runtime::transport::endpoint::ChannelLink;
use dualpipe_runtime::transport::wire::{WireData, WireError};
use dualpipe_runtime::{
    barrier, run_rank_step, run_step, sum_stage_copies, sum_stage_copies_remote, Endpoint,
    ExecOptions, RankStages, RuntimeError, Stage, StepOutcome, WireStage,
};
use dualpipe_schedule::{Chunk, OpKind, Schedule};

/// A bound far above any healthy run, to catch hangs (not a performance goal).
const NO_HANG: Duration = Duration::from_secs(20);

fn f64_to_wire(x: f64) -> Result<WireData, WireError> {
    Ok(WireData::from_f64s(&[x]))
}

fn f64_from_wire(data: WireData) -> Result<f64, WireError> {
    match data.to_f64s()?.as_slice() {
        [x] => Ok(*x),
        other => Err(WireError(format!(
            "expected one value, got {}",
            other.len()
        ))),
    }
}

impl WireStage for AffineStage {
    fn tensor_to_wire(tensor: f64) -> Result<WireData, WireError> {
        f64_to_wire(tensor)
    }
    fn tensor_from_wire(data: WireData) -> Result<f64, WireError> {
        f64_from_wire(data)
    }
}

impl WireStage for Faulty {
    fn tensor_to_wire(tensor: f64) -> Result<WireData, WireError> {
        f64_to_wire(tensor)
    }
    fn tensor_from_wire(data: WireData) -> Result<f64, WireError> {
        f64_from_wire(data)
    }
}

/// Runs `steps` steps (pipeline, then the copies' gradient sum) with one thread per rank,
/// each owning only its stages; returns every rank's outcomes and its stages.
#[allow(clippy::type_complexity)]
fn run_remote<S: WireStage + 'static>(
    schedule: &Schedule,
    ranks: Vec<RankStages<S>>,
    steps: u64,
    options: &ExecOptions,
) -> Vec<(Result<Vec<StepOutcome>, RuntimeError>, RankStages<S>)> {
    let links = ChannelLink::world(ranks.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .into_iter()
            .zip(links)
            .map(|(mut stages, link)| {
                scope.spawn(move || {
                    let mut endpoint = Endpoint::new(link);
                    let mut outcomes = Vec::new();
                    let result = (|| {
                        for step in 0..steps {
                            let outcome =
                                run_rank_step(schedule, &mut stages, &mut endpoint, step, options)?;
                            sum_stage_copies_remote(
                                &schedule.placement,
                                &mut stages,
                                &mut endpoint,
                                step,
                                options.recv_timeout,
                            )?;
                            outcomes.push(outcome);
                        }
                        barrier(&mut endpoint, steps, options.recv_timeout)?;
                        Ok(outcomes)
                    })();
                    (result, stages)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn gradients(ranks: &[RankStages<AffineStage>]) -> Vec<((usize, usize), f64, f64)> {
    ranks
        .iter()
        .flat_map(|r| r.iter().map(|(k, s)| (k, s.grad_a, s.grad_b)))
        .collect()
}

#[test]
fn remote_steps_equal_local_steps_bit_for_bit() {
    let schedules = [
        ("gpipe", gpipe(4, 8)),
        ("1f1b split", one_f_one_b_split(4, 8)),
        ("bidirectional", bidirectional(4, 8)),
        ("v shape", v_shape(4, 8)),
        ("dualpipe golden", golden("dualpipe-pp4-mb8")),
        ("dualpipev golden", golden("dualpipev-pp4-mb8")),
    ];
    let options = ExecOptions::default();
    for (name, schedule) in schedules {
        let mut local = affine_ranks(&schedule);
        let mut local_losses = Vec::new();
        for _ in 0..2 {
            let outcome = run_step(&schedule, &mut local, &options).unwrap();
            sum_stage_copies(&schedule.placement, &mut local).unwrap();
            local_losses.push(outcome.losses);
        }
        let results = run_remote(&schedule, affine_ranks(&schedule), 2, &options);
        let mut remote = Vec::new();
        for (rank, (result, stages)) in results.into_iter().enumerate() {
            let outcomes = result.unwrap_or_else(|e| panic!("{name}: rank {rank}: {e}"));
            assert_eq!(outcomes.len(), 2);
            for (step, outcome) in outcomes.iter().enumerate() {
                // Every rank returns every loss, identical to the local run's.
                assert_eq!(
                    outcome.losses, local_losses[step],
                    "{name}: rank {rank}, step {step}"
                );
                assert_eq!(outcome.timeline.ranks(), schedule.ranks);
                assert!(
                    outcome.timeline.compute.iter().all(|c| !c.is_empty()),
                    "{name}: every rank's timeline arrives"
                );
            }
            assert!(stages.iter().all(|(_, s)| s.drained()), "{name}");
            remote.push(stages);
        }
        assert_eq!(
            gradients(&remote),
            gradients(&local),
            "{name}: summed gradients"
        );
    }
}

fn expect_failure(
    schedule: &Schedule,
    at: (OpKind, Chunk),
    fault: Fault,
    failed: usize,
    own_error: &str,
) {
    // A long receive timeout: the ranks must stop because of the failure notice, not time out.
    let options = ExecOptions::default().with_recv_timeout(Duration::from_secs(120));
    let began = Instant::now();
    let results = run_remote(schedule, faulty_ranks(schedule, at, fault), 2, &options);
    assert!(began.elapsed() < NO_HANG, "took {:?}", began.elapsed());
    for (rank, (result, _)) in results.into_iter().enumerate() {
        let err = result
            .err()
            .unwrap_or_else(|| panic!("rank {rank} did not fail"));
        if rank == failed {
            assert_eq!(err.to_string(), own_error);
        } else {
            assert_eq!(
                err,
                RuntimeError::PeerFailed {
                    rank,
                    failed_rank: failed,
                    message: own_error.into()
                },
                "rank {rank}"
            );
            assert!(
                err.to_string().starts_with(&format!(
                    "rank {rank}: stopped because rank {failed} failed"
                )),
                "{err}"
            );
        }
    }
}

#[test]
fn a_stage_error_stops_every_rank_naming_the_failed_one() {
    expect_failure(
        &gpipe(4, 4),
        (OpKind::F, Chunk::new(0, 2, 3)),
        Fault::Error,
        2,
        "rank 2: F (dir 0, stage 2, mb 3) failed: injected failure",
    );
}

#[test]
fn a_panic_in_a_dualpipe_backward_stops_every_rank() {
    expect_failure(
        &bidirectional(4, 8),
        (OpKind::I, Chunk::new(1, 0, 1)),
        Fault::Panic,
        3,
        "rank 3: B (dir 1, stage 0, mb 1) panicked: injected panic",
    );
}

#[test]
fn a_world_of_the_wrong_size_is_refused_on_every_rank() {
    let schedule = gpipe(4, 4);
    let mut ranks = affine_ranks(&schedule);
    ranks.truncate(3);
    let options = ExecOptions::default().with_recv_timeout(Duration::from_secs(120));
    for (result, _) in run_remote(&schedule, ranks, 1, &options) {
        let err = result.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("the transport connects 3 processes") || text.contains("stopped because"),
            "{text}"
        );
    }
}

#[test]
fn a_missing_stage_is_a_setup_error() {
    let schedule = gpipe(2, 2);
    let mut ranks = affine_ranks(&schedule);
    ranks[1] = RankStages::new();
    let options = ExecOptions::default().with_recv_timeout(Duration::from_secs(120));
    let results = run_remote(&schedule, ranks, 1, &options);
    let err = results[1].0.as_ref().unwrap_err();
    assert!(matches!(err, RuntimeError::Setup(_)), "{err}");
    assert!(matches!(
        results[0].0.as_ref().unwrap_err(),
        RuntimeError::PeerFailed { failed_rank: 1, .. }
    ));
    let _ = AffineStage::new(0, 1).gradients();
}
