//! Every failure ends the step on every rank with one clear error, quickly.

mod common;

use std::time::{Duration, Instant};

use common::{affine_ranks, bidirectional, faulty_ranks, golden, gpipe, one_f_one_b_split, Fault};
use dualpipe_runtime::{run_step, ExecOptions, RuntimeError};
use dualpipe_schedule::{Chunk, Op, OpKind};

/// A bound far above any healthy run, to catch hangs (not a performance goal).
const NO_HANG: Duration = Duration::from_secs(10);

#[test]
fn stage_error_names_rank_op_and_cause() {
    let schedule = gpipe(4, 4);
    let mut ranks = faulty_ranks(&schedule, (OpKind::F, Chunk::new(0, 2, 3)), Fault::Error);
    let began = Instant::now();
    let err = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap_err();
    assert!(began.elapsed() < NO_HANG);
    assert_eq!(
        err.to_string(),
        "rank 2: F (dir 0, stage 2, mb 3) failed: injected failure"
    );
    assert!(matches!(err, RuntimeError::StageFailed { rank: 2, .. }));
}

#[test]
fn stage_panic_is_caught() {
    let schedule = one_f_one_b_split(4, 8);
    let mut ranks = faulty_ranks(&schedule, (OpKind::I, Chunk::new(0, 1, 2)), Fault::Panic);
    let began = Instant::now();
    let err = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap_err();
    assert!(began.elapsed() < NO_HANG);
    assert_eq!(
        err.to_string(),
        "rank 1: I (dir 0, stage 1, mb 2) panicked: injected panic"
    );
}

#[test]
fn panic_inside_a_full_backward_names_the_b() {
    let schedule = bidirectional(4, 8);
    // Stage 0 of direction 1 is on rank 3.
    let mut ranks = faulty_ranks(&schedule, (OpKind::I, Chunk::new(1, 0, 1)), Fault::Panic);
    let err = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rank 3: B (dir 1, stage 0, mb 1) panicked: injected panic"
    );
}

#[test]
fn failure_inside_an_overlapped_pair_names_the_fb() {
    let schedule = golden("dualpipe-pp4-mb8");
    let fb = schedule.programs[0]
        .iter()
        .find_map(|op| match *op {
            Op::FB { f, b } => Some((f, b)),
            _ => None,
        })
        .expect("rank 0 runs an FB");
    let mut ranks = faulty_ranks(&schedule, (OpKind::F, fb.0), Fault::Error);
    let err = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "rank 0: FB (forward {}, backward {}) failed: injected failure",
            fb.0, fb.1
        )
    );
}

#[test]
fn a_failing_rank_wakes_ranks_that_wait_with_a_long_timeout() {
    // Every other rank is blocked on a receive with the default 60 s timeout when the last
    // stage fails; the abort must wake them at once.
    let schedule = bidirectional(4, 8);
    let mut ranks = faulty_ranks(&schedule, (OpKind::F, Chunk::new(0, 3, 0)), Fault::Error);
    let began = Instant::now();
    let err = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap_err();
    assert!(began.elapsed() < NO_HANG, "took {:?}", began.elapsed());
    assert!(
        matches!(err, RuntimeError::StageFailed { rank: 3, .. }),
        "{err}"
    );
}

#[test]
fn a_message_that_never_comes_times_out() {
    let mut schedule = gpipe(2, 2);
    // Rank 0 forgets micro-batch 1 (and, so that only rank 1 waits, every backward): rank 1
    // waits for the activations of micro-batch 1 forever.
    schedule.programs[0].retain(|op| match *op {
        Op::F(c) | Op::SendF { chunk: c, .. } => c.mb != 1,
        _ => false,
    });
    let mut ranks = affine_ranks(&schedule);
    let options = ExecOptions::default().with_recv_timeout(Duration::from_millis(100));
    let began = Instant::now();
    let err = run_step(&schedule, &mut ranks, &options).unwrap_err();
    assert!(began.elapsed() < NO_HANG);
    assert!(
        err.to_string().starts_with(
            "rank 1: timed out after 100ms waiting for RECV_F (dir 0, stage 1, mb 1) from rank 0"
        ),
        "{err}"
    );
}

#[test]
fn a_slow_peer_trips_the_timeout_of_its_neighbour() {
    let schedule = gpipe(2, 2);
    let mut ranks = faulty_ranks(
        &schedule,
        (OpKind::F, Chunk::new(0, 0, 0)),
        Fault::Sleep(Duration::from_millis(300)),
    );
    let options = ExecOptions::default().with_recv_timeout(Duration::from_millis(50));
    let err = run_step(&schedule, &mut ranks, &options).unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::Timeout {
                rank: 1,
                peer: 0,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_schedule_that_was_not_lowered_is_refused() {
    let mut schedule = bidirectional(2, 4);
    for program in &mut schedule.programs {
        program.retain(Op::is_compute);
    }
    let mut ranks = affine_ranks(&schedule);
    let err = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap_err();
    assert!(matches!(err, RuntimeError::Setup(_)), "{err}");
    assert!(
        err.to_string().contains("lower the schedule first"),
        "{err}"
    );
}

#[test]
fn wrong_number_of_ranks_is_refused() {
    let schedule = gpipe(3, 2);
    let mut ranks = affine_ranks(&gpipe(2, 2));
    let err = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap_err();
    assert!(err.to_string().contains("stages were given for 2"), "{err}");
}

#[test]
fn a_peer_that_contradicts_the_placement_is_refused() {
    let mut schedule = gpipe(3, 2);
    for op in &mut schedule.programs[0] {
        if let Op::SendF { peer, .. } = op {
            *peer = 2;
        }
    }
    let mut ranks = affine_ranks(&schedule);
    let err = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap_err();
    assert!(
        err.to_string().starts_with("invalid setup: rank 0: SEND_F"),
        "{err}"
    );
}

#[test]
fn a_loss_from_a_middle_stage_is_a_protocol_error() {
    let schedule = gpipe(3, 2);
    let mut ranks = affine_ranks(&schedule);
    ranks[1].get_mut(0, 1).unwrap().last = true;
    let err = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("rank 1: F (dir 0, stage 1, mb 0): the stage returned a loss"),
        "{err}"
    );
}

#[test]
fn misordered_local_handover_is_reported_not_awaited() {
    let mut schedule = common::v_shape(2, 2);
    // On rank 1, move the first forward of the upper stage (3? no: stage 2) before the lower.
    let program = &mut schedule.programs[1];
    let up = program
        .iter()
        .position(|op| *op == Op::F(Chunk::new(0, 2, 0)))
        .unwrap();
    let f = program.remove(up);
    program.insert(0, f);
    let mut ranks = affine_ranks(&schedule);
    let began = Instant::now();
    let err = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap_err();
    assert!(began.elapsed() < NO_HANG);
    assert!(err.to_string().contains("has not run yet"), "{err}");
}
