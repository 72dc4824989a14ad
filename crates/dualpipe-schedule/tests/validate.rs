//! The validator on broken schedules: every message names the rank, the op and the rule.

use dualpipe_schedule::validate::Rule;
use dualpipe_schedule::{build, generate, lower, validate, Chunk, Op, Schedule, ScheduleKind};

fn lowered(kind: ScheduleKind, ranks: usize, micro_batches: usize) -> Schedule {
    lower(&generate(kind, ranks, micro_batches, 1).unwrap())
}

fn position(program: &[Op], op: Op) -> usize {
    program.iter().position(|o| *o == op).expect("op present")
}

fn c(stage: usize, mb: usize) -> Chunk {
    Chunk::new(0, stage, mb)
}

#[test]
fn generated_schedules_validate() {
    for kind in ScheduleKind::ALL {
        for (ranks, mbs) in [(1, 1), (2, 4), (4, 8), (3, 7), (8, 16)] {
            let Ok(s) = generate(kind, ranks, mbs, 1) else {
                continue;
            };
            validate(&s).unwrap_or_else(|e| panic!("{kind} {ranks}x{mbs} compute-only: {e}"));
            validate(&lower(&s)).unwrap_or_else(|e| panic!("{kind} {ranks}x{mbs} lowered: {e}"));
        }
    }
}

#[test]
fn dropped_forward_is_missing() {
    let mut s = lowered(ScheduleKind::OneFOneB, 3, 4);
    let i = position(&s.programs[1], Op::F(c(1, 2)));
    s.programs[1].remove(i);
    let err = validate(&s).unwrap_err();
    assert_eq!(err.rank, 1, "{err}");
    assert_eq!(err.rule, Rule::Missing, "{err}");
    let text = err.to_string();
    assert!(text.starts_with("rank 1: "), "{text}");
    assert!(
        text.contains("forward") && text.contains("completeness"),
        "{text}"
    );
}

#[test]
fn dropped_backward_is_missing() {
    let mut s = generate(ScheduleKind::OneFOneB, 3, 4, 1).unwrap();
    let i = position(&s.programs[2], Op::B(c(2, 3)));
    s.programs[2].remove(i);
    let err = validate(&s).unwrap_err();
    assert_eq!((err.rank, err.rule), (2, Rule::Missing), "{err}");
    assert!(err.to_string().contains("(dir 0, stage 2, mb 3)"), "{err}");
}

#[test]
fn duplicate_forward_is_named() {
    let mut s = generate(ScheduleKind::GPipe, 2, 2, 1).unwrap();
    s.programs[0].insert(1, Op::F(c(0, 0)));
    s.programs[0].remove(2);
    let err = validate(&s).unwrap_err();
    assert_eq!(
        (err.rank, err.op_index, err.rule),
        (0, Some(1), Rule::Duplicate),
        "{err}"
    );
    assert!(
        err.to_string().contains("op 1 `F (dir 0, stage 0, mb 0)`"),
        "{err}"
    );
}

#[test]
fn swapped_pair_on_one_rank_breaks_dependency() {
    // A rank's backward before its own forward.
    let mut s = generate(ScheduleKind::GPipe, 2, 2, 1).unwrap();
    let f = position(&s.programs[1], Op::F(c(1, 1)));
    let b = position(&s.programs[1], Op::B(c(1, 1)));
    s.programs[1].swap(f, b);
    let err = validate(&s).unwrap_err();
    assert_eq!((err.rank, err.rule), (1, Rule::Dependency), "{err}");
    assert_eq!(err.op_index, Some(f), "{err}");
    assert!(err.to_string().contains("own forward"), "{err}");
}

#[test]
fn swapped_forwards_across_ranks_deadlock() {
    // Rank 1 runs micro-batch 1 before 0 and its backward of 0 before ... : the swap of two
    // backwards on the last rank leaves rank 0 waiting in the order it expects; no deadlock, but
    // swapping a forward and a backward of different micro-batches on both ranks makes a cycle.
    let mut s = generate(ScheduleKind::OneFOneB, 2, 2, 1).unwrap();
    // Rank 0: F0 F1 B0 B1  ->  F0 B0 F1 B1: waits for the gradient of mb 0 before sending mb 1.
    // Rank 1: F0 B0 F1 B1  ->  F1 ... needs F1 of rank 0 first. Make rank 1 run F1 before F0.
    assert_eq!(
        s.programs[0],
        vec![
            Op::F(c(0, 0)),
            Op::F(c(0, 1)),
            Op::B(c(0, 0)),
            Op::B(c(0, 1))
        ]
    );
    s.programs[0] = vec![
        Op::F(c(0, 0)),
        Op::B(c(0, 0)),
        Op::F(c(0, 1)),
        Op::B(c(0, 1)),
    ];
    s.programs[1] = vec![
        Op::F(c(1, 1)),
        Op::B(c(1, 1)),
        Op::F(c(1, 0)),
        Op::B(c(1, 0)),
    ];
    let err = validate(&s).unwrap_err();
    assert_eq!(err.rule, Rule::Deadlock, "{err}");
    assert_eq!(err.rank, 0, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("rank 0 at op 1 `B (dir 0, stage 0, mb 0)`"),
        "{text}"
    );
    assert!(
        text.contains("rank 1 at op 0 `F (dir 0, stage 1, mb 1)`"),
        "{text}"
    );
    // The same cycle, lowered, is still caught.
    let err = validate(&lower(&s)).unwrap_err();
    assert_eq!(err.rule, Rule::Deadlock, "{err}");
    assert!(err.to_string().contains("rank 1"), "{err}");
}

#[test]
fn missing_receive_is_unmatched() {
    let mut s = lowered(ScheduleKind::OneFOneB, 3, 4);
    let recv = Op::RecvF {
        chunk: c(2, 1),
        peer: 1,
    };
    let i = position(&s.programs[2], recv);
    s.programs[2].remove(i);
    let err = validate(&s).unwrap_err();
    assert_eq!((err.rank, err.rule), (1, Rule::Unmatched), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("SEND_F (dir 0, stage 1, mb 1) peer 2"),
        "{text}"
    );
    assert!(text.contains("rank 2 has no matching RECV_F"), "{text}");
}

#[test]
fn missing_send_is_unmatched_at_the_receiver() {
    let mut s = lowered(ScheduleKind::OneFOneB, 3, 4);
    let send = Op::SendB {
        chunk: c(2, 0),
        peer: 1,
    };
    let i = position(&s.programs[2], send);
    s.programs[2].remove(i);
    let err = validate(&s).unwrap_err();
    assert_eq!((err.rank, err.rule), (1, Rule::Unmatched), "{err}");
    assert!(err.to_string().contains("RECV_B"), "{err}");
}

#[test]
fn missing_both_messages() {
    let mut s = lowered(ScheduleKind::GPipe, 2, 2);
    s.programs[0].retain(|op| {
        *op != Op::SendF {
            chunk: c(0, 1),
            peer: 1,
        }
    });
    s.programs[1].retain(|op| {
        *op != Op::RecvF {
            chunk: c(1, 1),
            peer: 0,
        }
    });
    let err = validate(&s).unwrap_err();
    assert_eq!((err.rank, err.rule), (1, Rule::MissingMessage), "{err}");
    assert!(
        err.to_string().contains("`F (dir 0, stage 1, mb 1)`"),
        "{err}"
    );
}

#[test]
fn receive_after_its_consumer() {
    let mut s = lowered(ScheduleKind::GPipe, 2, 2);
    let recv = Op::RecvF {
        chunk: c(1, 0),
        peer: 0,
    };
    let i = position(&s.programs[1], recv);
    let op = s.programs[1].remove(i);
    s.programs[1].insert(i + 1, op);
    let err = validate(&s).unwrap_err();
    assert_eq!((err.rank, err.rule), (1, Rule::CommOrder), "{err}");
}

#[test]
fn wrong_peer_and_local_message() {
    let mut s = lowered(ScheduleKind::GPipe, 3, 2);
    for op in &mut s.programs[0] {
        if let Op::SendF { peer, .. } = op {
            *peer = 2;
        }
    }
    let err = validate(&s).unwrap_err();
    assert_eq!((err.rank, err.rule), (0, Rule::Peer), "{err}");
    assert!(err.to_string().contains("rank 1"), "{err}");

    // DualPipeV-like local exchange: interleaved on one rank has no messages.
    let mut s = generate(ScheduleKind::GPipe, 1, 2, 1).unwrap();
    s.programs[0].insert(
        1,
        Op::SendF {
            chunk: c(0, 0),
            peer: 0,
        },
    );
    let err = validate(&s).unwrap_err();
    assert_eq!(err.rule, Rule::Peer, "{err}");
}

#[test]
fn wrong_rank_and_out_of_range() {
    let mut s = generate(ScheduleKind::GPipe, 2, 2, 1).unwrap();
    s.programs[0][0] = Op::F(c(1, 0));
    let err = validate(&s).unwrap_err();
    assert_eq!(
        (err.rank, err.op_index, err.rule),
        (0, Some(0), Rule::Placement),
        "{err}"
    );
    s.programs[0][0] = Op::F(c(0, 9));
    let err = validate(&s).unwrap_err();
    assert_eq!(err.rule, Rule::ChunkRange, "{err}");
}

#[test]
fn weight_gradient_rules() {
    let mut s = generate(ScheduleKind::GPipe, 1, 2, 1).unwrap();
    // B -> I without W.
    s.programs[0][2] = Op::I(c(0, 0));
    let err = validate(&s).unwrap_err();
    assert_eq!(
        (err.rule, err.op_index),
        (Rule::WeightGradient, Some(2)),
        "{err}"
    );
    // W before its I.
    s.programs[0].insert(0, Op::W(c(0, 0)));
    let err = validate(&s).unwrap_err();
    assert_eq!(
        (err.rule, err.op_index),
        (Rule::WeightGradient, Some(0)),
        "{err}"
    );
    // W after a full B.
    let mut s = generate(ScheduleKind::GPipe, 1, 2, 1).unwrap();
    s.programs[0].push(Op::W(c(0, 1)));
    let err = validate(&s).unwrap_err();
    assert_eq!(
        (err.rule, err.op_index),
        (Rule::WeightGradient, Some(4)),
        "{err}"
    );
}

#[test]
fn wait_on_a_receive_that_needs_this_rank_deadlocks() {
    // Rank 0 posts the receive of mb 0's gradient and waits for it before sending mb 0's
    // activations: a WAIT-induced cycle.
    let mut s = lowered(ScheduleKind::GPipe, 2, 1);
    s.programs[0] = vec![
        Op::RecvB {
            chunk: c(0, 0),
            peer: 1,
        },
        Op::Wait,
        Op::F(c(0, 0)),
        Op::SendF {
            chunk: c(0, 0),
            peer: 1,
        },
        Op::B(c(0, 0)),
    ];
    let err = validate(&s).unwrap_err();
    assert_eq!(
        (err.rank, err.rule, err.op_index),
        (0, Rule::Deadlock, Some(1)),
        "{err}"
    );
}

#[test]
fn build_is_generate_lower_validate() {
    let s = build(ScheduleKind::OneFOneB, 4, 8, 1).unwrap();
    assert!(s.is_lowered());
    assert_eq!(
        s,
        lower(&generate(ScheduleKind::OneFOneB, 4, 8, 1).unwrap())
    );
    // Lowering is idempotent.
    assert_eq!(lower(&s), s);
}

#[test]
fn shape_errors() {
    let mut s = generate(ScheduleKind::GPipe, 2, 2, 1).unwrap();
    s.programs.pop();
    assert_eq!(validate(&s).unwrap_err().rule, Rule::Shape);
    let mut s = generate(ScheduleKind::GPipe, 2, 2, 1).unwrap();
    s.micro_batches = 1_000_000_000_000;
    let err = validate(&s).unwrap_err();
    assert_eq!(err.rule, Rule::Missing, "{err}");
}

#[test]
fn dualpipe_dropped_overlapped_pair_is_missing() {
    let Ok(mut s) = generate(ScheduleKind::DualPipe, 4, 8, 1) else {
        return; // the DualPipe generator is not there yet
    };
    let i = s.programs[2]
        .iter()
        .position(|op| matches!(op, Op::FB { .. }))
        .expect("an FB");
    s.programs[2].remove(i);
    let err = validate(&s).unwrap_err();
    assert_eq!((err.rank, err.rule), (2, Rule::Missing), "{err}");
}

#[test]
fn dualpipe_send_moved_to_the_end_deadlocks() {
    let Ok(s) = generate(ScheduleKind::DualPipe, 4, 8, 1) else {
        return;
    };
    let mut s = lower(&s);
    let send = Op::SendF {
        chunk: Chunk::new(0, 0, 0),
        peer: 1,
    };
    let i = position(&s.programs[0], send);
    let op = s.programs[0].remove(i);
    s.programs[0].push(op);
    let err = validate(&s).unwrap_err();
    assert_eq!(err.rule, Rule::Deadlock, "{err}");
    let text = err.to_string();
    assert_eq!(err.rank, 0, "{text}");
    assert!(
        text.contains("rank 1 at op 1 `F (dir 0, stage 1, mb 0)` waits for the activations of (dir 0, stage 0, mb 0) from rank 0"),
        "{text}"
    );
}
