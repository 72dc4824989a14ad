//! What every executor shares: a rank's stages ([`RankStages`]), the options, the outcome of
//! a step, and how error messages name an op.

use std::collections::BTreeMap;
use std::time::Duration;

use dualpipe_schedule::Timeline;
use dualpipe_schedule::{Op, StagePlacement};

use super::cpu::RankTimes;

/// The stages one rank runs, keyed by (`dir`, `stage`).
///
/// DualPipe puts two stages on every rank ((0, r) and (1, ranks-1-r)), DualPipeV two stages of
/// one direction, interleaved 1F1B `virtual_stages` stages; the other schedules one. Build the
/// whole set from a placement with [`build_ranks`] or [`try_build_ranks`].
#[derive(Debug)]
pub struct RankStages<S> {
    stages: BTreeMap<(usize, usize), S>,
}

impl<S> Default for RankStages<S> {
    fn default() -> Self {
        RankStages {
            stages: BTreeMap::new(),
        }
    }
}

impl<S> RankStages<S> {
    /// No stages yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the stage for (`dir`, `stage`); returns the one it replaces, if any.
    pub fn insert(&mut self, dir: usize, stage: usize, value: S) -> Option<S> {
        self.stages.insert((dir, stage), value)
    }

    /// The stage for (`dir`, `stage`).
    pub fn get(&self, dir: usize, stage: usize) -> Option<&S> {
        self.stages.get(&(dir, stage))
    }

    /// The stage for (`dir`, `stage`), mutably.
    pub fn get_mut(&mut self, dir: usize, stage: usize) -> Option<&mut S> {
        self.stages.get_mut(&(dir, stage))
    }

    /// Two different stages of this rank at once (for an `FB` whose halves belong to two
    /// stages). `None` if either is missing or both keys are the same.
    pub fn get_pair_mut(
        &mut self,
        a: (usize, usize),
        b: (usize, usize),
    ) -> Option<(&mut S, &mut S)> {
        if a == b {
            return None;
        }
        let (mut first, mut second) = (None, None);
        for (key, stage) in self.stages.iter_mut() {
            if *key == a {
                first = Some(stage);
            } else if *key == b {
                second = Some(stage);
            }
        }
        Some((first?, second?))
    }

    /// The stages in (`dir`, `stage`) order.
    pub fn iter(&self) -> impl Iterator<Item = ((usize, usize), &S)> {
        self.stages.iter().map(|(k, v)| (*k, v))
    }

    /// The stages in (`dir`, `stage`) order, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = ((usize, usize), &mut S)> {
        self.stages.iter_mut().map(|(k, v)| (*k, v))
    }

    /// Number of stages on this rank.
    pub fn len(&self) -> usize {
        self.stages.len()
    }

    /// Whether this rank holds no stage.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }
}

/// Builds every rank's stages from a placement: `make(rank, dir, stage)` is called once per
/// (dir, stage), ranks in order and each rank's stages in (dir, stage) order.
pub fn build_ranks<S>(
    placement: &StagePlacement,
    mut make: impl FnMut(usize, usize, usize) -> S,
) -> Vec<RankStages<S>> {
    let built: Result<_, std::convert::Infallible> =
        try_build_ranks(placement, |rank, dir, stage| Ok(make(rank, dir, stage)));
    match built {
        Ok(ranks) => ranks,
        Err(never) => match never {},
    }
}

/// Like [`build_ranks`], for a `make` that can fail; stops at the first error.
pub fn try_build_ranks<S, E>(
    placement: &StagePlacement,
    mut make: impl FnMut(usize, usize, usize) -> Result<S, E>,
) -> Result<Vec<RankStages<S>>, E> {
    (0..placement.ranks)
        .map(|rank| {
            let mut stages = RankStages::new();
            for (dir, stage) in placement.stages_of(rank) {
                stages.insert(dir, stage, make(rank, dir, stage)?);
            }
            Ok(stages)
        })
        .collect()
}

/// How the executor runs a step.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecOptions {
    /// How long a compute op waits for an input message before the step fails with
    /// [`RuntimeError::Timeout`](crate::RuntimeError::Timeout). Default 60 s.
    pub recv_timeout: Duration,
    /// How often a rank blocked on a receive wakes to check whether another rank failed
    /// (failures also wake it at once through an abort message). Default 50 ms.
    pub poll_interval: Duration,
    /// For tests and demonstrations of imbalance: `Some((rank, factor))` makes that rank's
    /// compute `factor` times slower: after each compute op it sleeps `factor - 1` times the
    /// CPU time the op used (its wall time where no thread CPU clock exists). `None`: no
    /// slowdown.
    pub slow_rank: Option<(usize, f64)>,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            recv_timeout: Duration::from_secs(60),
            poll_interval: Duration::from_millis(50),
            slow_rank: None,
        }
    }
}

impl ExecOptions {
    /// These options with another receive timeout.
    pub fn with_recv_timeout(mut self, timeout: Duration) -> Self {
        self.recv_timeout = timeout;
        self
    }

    /// These options with rank `rank`'s compute made `factor` times slower (see
    /// [`ExecOptions::slow_rank`]).
    pub fn with_slow_rank(mut self, rank: usize, factor: f64) -> Self {
        self.slow_rank = Some((rank, factor));
        self
    }
}

/// The loss of one micro-batch, reported by the last stage of its direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MicroBatchLoss {
    /// Direction of the pipeline the micro-batch flowed along.
    pub dir: usize,
    /// Index within the direction.
    pub mb: usize,
    /// Index in the whole step (`dir * micro_batches_per_dir + mb`).
    pub global_mb: usize,
    /// The loss the last stage returned.
    pub loss: f64,
}

/// What one step produced.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutcome {
    /// One loss per micro-batch, ordered by `global_mb`.
    pub losses: Vec<MicroBatchLoss>,
    /// What ran where and when: compute intervals per rank (seconds from the common step
    /// start), every message, and each rank's time blocked on receives (`comm_wait`).
    pub timeline: Timeline,
    /// Wall-clock seconds from the step start until every rank had finished.
    pub wall_seconds: f64,
    /// Where each rank's time went: CPU, waiting for a message, waiting for a core.
    pub rank_times: RankTimes,
}

impl StepOutcome {
    /// The mean of the micro-batch losses (NaN when there are none).
    pub fn mean_loss(&self) -> f64 {
        if self.losses.is_empty() {
            return f64::NAN;
        }
        self.losses.iter().map(|l| l.loss).sum::<f64>() / self.losses.len() as f64
    }
}

/// The op as error messages name it: `F (dir 0, stage 2, mb 3)`, `SEND_B (dir 1, ...) to rank 2`.
pub(crate) fn describe(op: &Op) -> String {
    match *op {
        Op::FB { f, b } => format!("FB (forward {f}, backward {b})"),
        Op::Wait => "WAIT".into(),
        Op::SendF { chunk, peer } | Op::SendB { chunk, peer } => {
            format!("{} {chunk} to rank {peer}", op.kind())
        }
        Op::RecvF { chunk, peer } | Op::RecvB { chunk, peer } => {
            format!("{} {chunk} from rank {peer}", op.kind())
        }
        Op::F(c) | Op::B(c) | Op::I(c) | Op::W(c) => format!("{} {c}", op.kind()),
    }
}
