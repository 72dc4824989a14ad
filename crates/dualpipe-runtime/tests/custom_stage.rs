//! The "write your own stage" example of docs/runtime.md, kept compiling and correct here.

use std::collections::HashMap;

use dualpipe_runtime::{
    build_ranks, run_step, sum_stage_copies, ExecOptions, ForwardInput, ForwardOutput, Stage,
    StageError,
};
use dualpipe_schedule::{build, Chunk, ScheduleKind};

/// y = w * x on a vector; the last stage's loss is sum(y^2) / 2.
struct Scale {
    w: f64,
    grad_w: f64,
    last: bool,
    saved: HashMap<Chunk, Vec<f64>>,   // inputs, kept from F until W
    pending: HashMap<Chunk, Vec<f64>>, // output gradients, kept from I until W
}

impl Stage for Scale {
    type Tensor = Vec<f64>;

    fn forward(
        &mut self,
        chunk: Chunk,
        input: ForwardInput<Vec<f64>>,
    ) -> Result<ForwardOutput<Vec<f64>>, StageError> {
        let x = match input {
            ForwardInput::MicroBatch { global_mb } => vec![1.0 + global_mb as f64; 4],
            ForwardInput::Activation(x) => x,
        };
        let y: Vec<f64> = x.iter().map(|v| self.w * v).collect();
        self.saved.insert(chunk, x);
        Ok(if self.last {
            ForwardOutput::Loss(y.iter().map(|v| v * v).sum::<f64>() / 2.0)
        } else {
            ForwardOutput::Activation(y)
        })
    }

    fn backward_input(
        &mut self,
        chunk: Chunk,
        grad_output: Option<Vec<f64>>,
    ) -> Result<Option<Vec<f64>>, StageError> {
        let x = self
            .saved
            .get(&chunk)
            .ok_or(StageError("backward before forward".into()))?;
        // At the last stage dL/dy = y = w x.
        let dy = grad_output.unwrap_or_else(|| x.iter().map(|v| self.w * v).collect());
        let dx = dy.iter().map(|g| self.w * g).collect();
        self.pending.insert(chunk, dy);
        Ok((chunk.stage > 0).then_some(dx))
    }

    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), StageError> {
        let dy = self
            .pending
            .remove(&chunk)
            .ok_or(StageError("W before I".into()))?;
        let x = self
            .saved
            .remove(&chunk)
            .ok_or(StageError("W before F".into()))?;
        self.grad_w += dy.iter().zip(&x).map(|(g, v)| g * v).sum::<f64>();
        Ok(())
    }

    fn gradients(&self) -> Vec<Vec<f64>> {
        vec![vec![self.grad_w]]
    }

    fn add_gradients(&mut self, other: &[Vec<f64>]) -> Result<(), StageError> {
        self.grad_w += other[0][0];
        Ok(())
    }
}

#[test]
fn custom_stage_trains_under_dualpipe() {
    let schedule = build(ScheduleKind::DualPipe, 4, 8, 1).expect("DualPipe 4 x 8 builds");
    let last = schedule.placement.stages() - 1;
    let mut ranks = build_ranks(&schedule.placement, |_rank, _dir, stage| Scale {
        w: 0.5,
        grad_w: 0.0,
        last: stage == last,
        saved: HashMap::new(),
        pending: HashMap::new(),
    });
    let outcome = run_step(&schedule, &mut ranks, &ExecOptions::default()).expect("step runs");
    sum_stage_copies(&schedule.placement, &mut ranks).expect("copies sum");

    // Four stages of w = 0.5: y = x / 16, loss = 4 (x / 16)^2 / 2 for x = 1 + mb.
    for l in &outcome.losses {
        let x = 1.0 + l.global_mb as f64;
        assert!((l.loss - 2.0 * (x / 16.0).powi(2)).abs() < 1e-12);
    }
    // dL/dw is the same for every stage (each contributes one factor w): 2 loss / w per mb.
    let total: f64 = outcome.losses.iter().map(|l| 2.0 * l.loss / 0.5).sum();
    for (_, stage) in ranks.iter().flat_map(|r| r.iter()) {
        assert!(
            (stage.grad_w - total).abs() < 1e-9,
            "{} vs {total}",
            stage.grad_w
        );
    }
}
