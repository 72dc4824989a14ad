//! [`SleepStage`]: a stage that only sleeps, for benchmarks and tests of the executor, with its
//! wire codec (its tensor is `()`, which crosses as an empty tensor).

use std::time::{Duration, Instant};

use dualpipe_schedule::{Chunk, Schedule};

use crate::transport::wire::{WireData, WireError, WireTensor};
use crate::{build_ranks, ForwardInput, ForwardOutput, RankStages, Stage, StageError, WireStage};

/// How long each op of a [`SleepStage`] takes.
///
/// The same four numbers as the simulator's cost model: `backward` is a full backward `B`,
/// which splits into `I` (`backward - weight`) and `W` (`weight`); `forward_backward` is an
/// overlapped `FB` pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SleepCosts {
    /// Duration of `F`.
    pub forward: Duration,
    /// Duration of a full backward `B` (= `I` + `W`).
    pub backward: Duration,
    /// Duration of `W`, the weight-gradient part of `B`.
    pub weight: Duration,
    /// Duration of an overlapped `FB`.
    pub forward_backward: Duration,
}

impl SleepCosts {
    /// Costs from milliseconds: `F`, full `B`, `W`, `FB`.
    pub fn from_millis(forward: f64, backward: f64, weight: f64, forward_backward: f64) -> Self {
        let ms = |v: f64| Duration::from_secs_f64(v.max(0.0) / 1e3);
        SleepCosts {
            forward: ms(forward),
            backward: ms(backward),
            weight: ms(weight),
            forward_backward: ms(forward_backward),
        }
    }

    /// Duration of `I`: the full backward minus the weight gradient.
    pub fn backward_input(&self) -> Duration {
        self.backward.saturating_sub(self.weight)
    }
}

/// A stage that computes nothing and sleeps for a fixed time per op.
///
/// Sleeping does not use a core, so many ranks can run on a small machine and the measured
/// step time shows the schedule and the executor alone: compare it with the simulator's
/// prediction for the same [`SleepCosts`]. Its tensors are `()`; the last stage reports a
/// loss of `0.0`.
#[derive(Clone, Debug)]
pub struct SleepStage {
    costs: SleepCosts,
    last: bool,
}

impl SleepStage {
    /// A sleeping stage; `last` says whether it is the last stage of its direction (which
    /// must return a loss).
    pub fn new(costs: SleepCosts, last: bool) -> Self {
        SleepStage { costs, last }
    }

    /// Sleeping stages for every rank of `schedule`, all with the same costs.
    pub fn ranks_for(schedule: &Schedule, costs: SleepCosts) -> Vec<RankStages<SleepStage>> {
        let last = schedule.placement.stages().saturating_sub(1);
        build_ranks(&schedule.placement, |_, _, stage| {
            SleepStage::new(costs, stage == last)
        })
    }

    fn output(&self) -> ForwardOutput<()> {
        if self.last {
            ForwardOutput::Loss(0.0)
        } else {
            ForwardOutput::Activation(())
        }
    }
}

/// Sleeps for `duration`; one call, so the overshoot is the OS's wake-up latency only.
fn sleep_for(duration: Duration) {
    if duration.is_zero() {
        return;
    }
    let deadline = Instant::now() + duration;
    let mut now = Instant::now();
    // `sleep` may wake early on some platforms; top it up.
    while now < deadline {
        std::thread::sleep(deadline - now);
        now = Instant::now();
    }
}

impl Stage for SleepStage {
    type Tensor = ();

    fn forward(
        &mut self,
        _chunk: Chunk,
        _input: ForwardInput<()>,
    ) -> Result<ForwardOutput<()>, StageError> {
        sleep_for(self.costs.forward);
        Ok(self.output())
    }

    fn backward_input(
        &mut self,
        chunk: Chunk,
        _grad_output: Option<()>,
    ) -> Result<Option<()>, StageError> {
        sleep_for(self.costs.backward_input());
        Ok((chunk.stage > 0).then_some(()))
    }

    fn backward_weight(&mut self, _chunk: Chunk) -> Result<(), StageError> {
        sleep_for(self.costs.weight);
        Ok(())
    }

    fn forward_backward(
        &mut self,
        _f: Chunk,
        _input: ForwardInput<()>,
        b: Chunk,
        _grad_output: Option<()>,
    ) -> Result<(ForwardOutput<()>, Option<()>), StageError> {
        sleep_for(self.costs.forward_backward);
        Ok((self.output(), (b.stage > 0).then_some(())))
    }

    fn forward_backward_pair(
        &mut self,
        _f: Chunk,
        _input: ForwardInput<()>,
        _other: &mut Self,
        b: Chunk,
        _grad_output: Option<()>,
    ) -> Result<(ForwardOutput<()>, Option<()>), StageError> {
        sleep_for(self.costs.forward_backward);
        Ok((self.output(), (b.stage > 0).then_some(())))
    }
}

impl WireStage for SleepStage {
    fn tensor_to_wire(tensor: ()) -> Result<WireData, WireError> {
        WireTensor::into_wire(tensor)
    }

    fn tensor_from_wire(data: WireData) -> Result<(), WireError> {
        WireTensor::from_wire(data)
    }
}
