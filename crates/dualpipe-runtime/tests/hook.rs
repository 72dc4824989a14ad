//! The step hook: told once per stage per step, on the stage's rank, right after the op that
//! finished the stage's weight gradients (they are final then), and before the rank's
//! program ends for some stage of DualPipe (the exchange it starts overlaps the rest).

mod common;

use std::collections::HashMap;
use std::sync::Mutex;

use common::{affine_ranks, AffineStage};
use dualpipe_runtime::{last_weight_ops, run_step_with, ExecOptions, StageError, StepHook};
use dualpipe_schedule::{build, Op, ScheduleKind};

/// One `stage_done` call: rank, dir, stage, the ops the rank had finished, the gradients.
type Heard = (usize, usize, usize, usize, (f64, f64));

/// Every `stage_done` call; per rank, the ops finished.
#[derive(Default)]
struct Recorder {
    done: Mutex<Vec<Heard>>,
    ops: Mutex<HashMap<usize, usize>>,
}

impl StepHook<AffineStage> for Recorder {
    fn stage_done(
        &self,
        rank: usize,
        dir: usize,
        stage: usize,
        copy: &AffineStage,
    ) -> Result<(), StageError> {
        let ops = self.ops.lock().unwrap().get(&rank).copied().unwrap_or(0);
        self.done
            .lock()
            .unwrap()
            .push((rank, dir, stage, ops, (copy.grad_a, copy.grad_b)));
        Ok(())
    }

    fn between_ops(&self, rank: usize) -> Result<(), StageError> {
        *self.ops.lock().unwrap().entry(rank).or_default() += 1;
        Ok(())
    }
}

#[test]
fn the_hook_hears_each_stage_once_after_its_last_weight_op_with_final_gradients() {
    for kind in [
        ScheduleKind::DualPipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::Zb1p,
        ScheduleKind::DualPipeV,
    ] {
        let schedule = build(kind, 4, 8, kind.default_virtual_stages()).unwrap();
        let mut ranks = affine_ranks(&schedule);
        let hook = Recorder::default();
        run_step_with(&schedule, &mut ranks, &ExecOptions::default(), &hook).unwrap();
        let done = hook.done.into_inner().unwrap();
        let ops = hook.ops.into_inner().unwrap();
        let mut early = 0;
        for (rank, program) in schedule.programs.iter().enumerate() {
            assert_eq!(ops[&rank], program.len(), "{kind} rank {rank}: between_ops");
            let last = last_weight_ops(program);
            let held: Vec<(usize, usize)> = ranks[rank].iter().map(|(k, _)| k).collect();
            for &(dir, stage) in &held {
                let heard: Vec<_> = done
                    .iter()
                    .filter(|d| (d.0, d.1, d.2) == (rank, dir, stage))
                    .collect();
                assert_eq!(heard.len(), 1, "{kind} rank {rank} ({dir}, {stage})");
                let (.., finished, grads) = *heard[0];
                // Told right after op `at`: `at` ops had ended before it (between_ops runs
                // after stage_done for the same op).
                let at = last[&(dir, stage)];
                assert_eq!(finished, at, "{kind} rank {rank} ({dir}, {stage})");
                let touches = |op: &Op| match *op {
                    Op::W(c) | Op::B(c) | Op::FB { b: c, .. } => (c.dir, c.stage) == (dir, stage),
                    _ => false,
                };
                assert!(
                    touches(&program[at]),
                    "{kind}: op {at} is {:?}",
                    program[at]
                );
                assert!(!program[at + 1..].iter().any(touches), "{kind}: a later W");
                // The gradients were final: the same after the whole step.
                let copy = ranks[rank].get(dir, stage).unwrap();
                assert_eq!(grads, (copy.grad_a, copy.grad_b), "{kind} ({dir}, {stage})");
                let compute_left = program[at + 1..]
                    .iter()
                    .filter(|op| op.is_compute())
                    .count();
                early += usize::from(compute_left > 0);
            }
        }
        assert_eq!(
            done.len(),
            ranks.iter().map(|r| r.len()).sum::<usize>(),
            "{kind}"
        );
        if kind == ScheduleKind::DualPipe {
            // DualPipe finishes a rank's first stage while its second still computes.
            assert!(
                early > 0,
                "{kind}: no stage was done before its rank's last op"
            );
        }
    }
}
