//! The executor computes what a sequential run computes, under every schedule shape.

mod common;

use common::{affine_ranks, bidirectional, golden, gpipe, one_f_one_b_split, sequential, v_shape};
use dualpipe_runtime::{run_step, sum_stage_copies, ExecOptions, SleepCosts, SleepStage};
use dualpipe_schedule::{build, Op, Schedule, ScheduleKind};
use proptest::prelude::*;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

/// Runs `schedule` on affine stages and checks losses, summed gradients and the timeline
/// against the sequential oracle.
fn check_against_oracle(schedule: &Schedule) {
    let mut ranks = affine_ranks(schedule);
    let outcome = run_step(schedule, &mut ranks, &ExecOptions::default())
        .unwrap_or_else(|e| panic!("{} failed: {e}", schedule.kind));
    sum_stage_copies(&schedule.placement, &mut ranks).unwrap();

    let (losses, grads) = sequential(schedule.placement.stages(), schedule.micro_batches);
    assert_eq!(outcome.losses.len(), schedule.micro_batches);
    for (i, l) in outcome.losses.iter().enumerate() {
        assert_eq!(l.global_mb, i);
        assert!(
            close(l.loss, losses[i]),
            "mb {i}: {} vs {}",
            l.loss,
            losses[i]
        );
    }
    for (rank, stages) in ranks.iter().enumerate() {
        for ((dir, stage), st) in stages.iter() {
            assert!(
                st.drained(),
                "rank {rank} (dir {dir}, stage {stage}) kept state"
            );
            let (ga, gb) = grads[stage];
            assert!(
                close(st.grad_a, ga) && close(st.grad_b, gb),
                "rank {rank} (dir {dir}, stage {stage}): ({}, {}) vs ({ga}, {gb})",
                st.grad_a,
                st.grad_b
            );
        }
    }

    let t = &outcome.timeline;
    assert_eq!(t.ranks(), schedule.ranks);
    for (rank, program) in schedule.programs.iter().enumerate() {
        let compute: Vec<Op> = program.iter().copied().filter(Op::is_compute).collect();
        let measured: Vec<Op> = t.compute[rank].iter().map(|i| i.op).collect();
        assert_eq!(
            measured, compute,
            "rank {rank} ran its compute ops out of order"
        );
        for pair in t.compute[rank].windows(2) {
            assert!(pair[0].start <= pair[0].end && pair[0].end <= pair[1].start);
        }
        assert!(t.comm_wait[rank] >= 0.0 && t.comm_wait[rank] <= outcome.wall_seconds);
    }
    let sends = schedule
        .programs
        .iter()
        .flatten()
        .filter(|op| matches!(op, Op::SendF { .. } | Op::SendB { .. }))
        .count();
    assert_eq!(t.messages.len(), sends);
    assert!(t.makespan() <= outcome.wall_seconds);
}

#[test]
fn gpipe_matches_sequential() {
    check_against_oracle(&gpipe(4, 6));
}

#[test]
fn split_backward_matches_sequential() {
    check_against_oracle(&one_f_one_b_split(4, 8));
}

#[test]
fn two_directions_sum_their_copies() {
    check_against_oracle(&bidirectional(4, 8));
}

#[test]
fn folded_pipeline_hands_over_locally() {
    let schedule = v_shape(3, 6);
    // The bottom of the V (stage 2 -> 3 on rank 2) exchanges no message.
    assert!(!schedule.programs[2]
        .iter()
        .any(|op| matches!(op, Op::SendF { peer: 2, .. } | Op::RecvF { peer: 2, .. })));
    check_against_oracle(&schedule);
}

#[test]
fn golden_dualpipe_programs_run() {
    for name in ["dualpipe-pp4-mb8", "dualpipe-pp4-mb20", "dualpipe-pp2-mb6"] {
        check_against_oracle(&golden(name));
    }
}

#[test]
fn golden_dualpipev_programs_run() {
    for name in ["dualpipev-pp4-mb8", "dualpipev-pp4-mb20"] {
        check_against_oracle(&golden(name));
    }
}

#[test]
fn built_schedules_run() {
    let mut ran = Vec::new();
    for kind in ScheduleKind::ALL {
        let (ranks, micro_batches) = (4, 8);
        // Generators land one by one; every kind that builds must run.
        let virtual_stages = if kind == ScheduleKind::Interleaved {
            2
        } else {
            1
        };
        if let Ok(schedule) = build(kind, ranks, micro_batches, virtual_stages) {
            check_against_oracle(&schedule);
            ran.push(kind);
        }
    }
    assert!(ran.contains(&ScheduleKind::OneFOneB), "ran only {ran:?}");
}

#[test]
fn steps_are_deterministic() {
    let schedule = golden("dualpipe-pp4-mb8");
    let run = || {
        let mut ranks = affine_ranks(&schedule);
        let out = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap();
        sum_stage_copies(&schedule.placement, &mut ranks).unwrap();
        let grads: Vec<(u64, u64)> = ranks
            .iter()
            .flat_map(|r| {
                r.iter()
                    .map(|(_, s)| (s.grad_a.to_bits(), s.grad_b.to_bits()))
            })
            .collect();
        let losses: Vec<u64> = out.losses.iter().map(|l| l.loss.to_bits()).collect();
        (losses, grads)
    };
    assert_eq!(run(), run());
}

#[test]
fn copies_hold_half_the_gradient_before_summing() {
    let schedule = bidirectional(2, 4);
    let mut ranks = affine_ranks(&schedule);
    run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap();
    let (_, grads) = sequential(2, 4);
    let stage0 = |ranks: &[dualpipe_runtime::RankStages<common::AffineStage>], dir, rank: usize| {
        ranks[rank].get(dir, 0).unwrap().grad_a
    };
    let (a, b) = (stage0(&ranks, 0, 0), stage0(&ranks, 1, 1));
    assert!(!close(a, grads[0].0) && close(a + b, grads[0].0));
    sum_stage_copies(&schedule.placement, &mut ranks).unwrap();
    assert_eq!(
        stage0(&ranks, 0, 0).to_bits(),
        stage0(&ranks, 1, 1).to_bits()
    );
}

#[test]
fn sleeping_stages_take_their_costs() {
    let schedule = gpipe(2, 2);
    let costs = SleepCosts::from_millis(2.0, 4.0, 1.0, 5.0);
    let mut ranks = SleepStage::ranks_for(&schedule, costs);
    let outcome = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap();
    for interval in outcome.timeline.compute.iter().flatten() {
        let want = match interval.op {
            Op::F(_) => 0.002,
            _ => 0.004,
        };
        assert!(interval.end - interval.start >= want, "{:?}", interval);
    }
    // Rank 1 cannot start before rank 0's first forward is done (compared on the timeline's
    // one clock, not as a duration: a rank thread started late would wait less), so it waits.
    let first = |rank: usize| &outcome.timeline.compute[rank][0];
    assert!(
        first(1).start >= first(0).end,
        "{:?} {:?}",
        first(0),
        first(1)
    );
    assert!(outcome.timeline.comm_wait[1] > 0.0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_built_schedule_matches_sequential(
        kind in proptest::sample::select(ScheduleKind::ALL.to_vec()),
        ranks in 1usize..6,
        micro_batches in 1usize..13,
    ) {
        let virtual_stages = if kind == ScheduleKind::Interleaved { 2 } else { 1 };
        // Configurations a generator rejects are its business; every one it accepts must run.
        if let Ok(schedule) = build(kind, ranks, micro_batches, virtual_stages) {
            check_against_oracle(&schedule);
        }
    }

    #[test]
    fn random_shapes_match_sequential(ranks in 1usize..5, half in 1usize..5, shape in 0usize..4) {
        let micro_batches = 2 * half;
        let schedule = match shape {
            0 => gpipe(ranks, micro_batches),
            1 => one_f_one_b_split(ranks, micro_batches),
            2 => bidirectional(ranks, micro_batches),
            _ => v_shape(ranks, micro_batches),
        };
        check_against_oracle(&schedule);
    }
}
