//! The configuration's settings of stage re-balancing ([`RebalanceSettings`]) and of the slow
//! rank that makes an imbalance ([`SlowRank`]); re-balancing itself is
//! [`crate::parallel::stages::rebalance`].

use serde::{Deserialize, Serialize};

use crate::config::{Field, Naming};
use crate::error::TrainError;

/// The default `--rebalance-threshold`: re-balance when the slowest rank's compute exceeds
/// the mean by more than 5%.
pub const DEFAULT_THRESHOLD: f64 = 0.05;
/// The default `--rebalance-window`: steps measured before each decision.
pub const DEFAULT_WINDOW: usize = 5;

/// One rank's compute made `factor` times slower (`--slow-rank R:F`): after each compute op
/// it sleeps `factor - 1` times the CPU time the op used.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowRank {
    /// The pipeline rank slowed down.
    pub rank: usize,
    /// How many times slower its compute is (at least 1).
    pub factor: f64,
}

impl SlowRank {
    /// Parses `R:F` (`1:2`: rank 1 twice as slow); an error says what is wrong.
    pub fn parse(text: &str) -> Result<SlowRank, String> {
        let bad = || format!("'{text}': give RANK:FACTOR, such as 1:2 (rank 1 twice as slow)");
        let (rank, factor) = text.split_once(':').ok_or_else(bad)?;
        let rank = rank.trim().parse::<usize>().map_err(|_| bad())?;
        let factor = factor.trim().parse::<f64>().map_err(|_| bad())?;
        Ok(SlowRank { rank, factor })
    }

    /// Checks the rank against `ranks` and the factor (finite, in `[1, 1000]`).
    pub fn check(&self, ranks: usize, name: &str) -> Result<(), TrainError> {
        if self.rank >= ranks {
            return Err(TrainError::Config(format!(
                "{name} {}:{}: rank {} does not exist in a run of {ranks} ranks; give a rank \
                 below {ranks}",
                self.rank, self.factor, self.rank
            )));
        }
        if !(self.factor.is_finite() && (1.0..=1000.0).contains(&self.factor)) {
            return Err(TrainError::Config(format!(
                "{name} {}:{}: the factor must be a number from 1 to 1000, such as 2",
                self.rank, self.factor
            )));
        }
        Ok(())
    }
}

/// When and how the stages re-balance (`--rebalance-stages`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RebalanceSettings {
    /// Re-balance when the slowest rank's compute exceeds the mean by more than this share
    /// (`--rebalance-threshold`, default [`DEFAULT_THRESHOLD`]).
    pub threshold: f64,
    /// Steps measured before each decision (`--rebalance-window`, default
    /// [`DEFAULT_WINDOW`]); the first step of the run and the first after a move are not
    /// measured (warm-up).
    pub window: usize,
}

impl Default for RebalanceSettings {
    fn default() -> Self {
        RebalanceSettings {
            threshold: DEFAULT_THRESHOLD,
            window: DEFAULT_WINDOW,
        }
    }
}

impl RebalanceSettings {
    /// Checks the threshold (finite, in `[0, 10]`) and the window (1 to 1000 steps).
    pub fn check(&self, naming: Naming) -> Result<(), TrainError> {
        if !(self.threshold.is_finite() && (0.0..=10.0).contains(&self.threshold)) {
            return Err(TrainError::Config(format!(
                "{} {}: give a share from 0 to 10, such as 0.05",
                Field::RebalanceThreshold.name(naming),
                self.threshold
            )));
        }
        if !(1..=1000).contains(&self.window) {
            return Err(TrainError::Config(format!(
                "{} {}: give 1 to 1000 steps, such as 5",
                Field::RebalanceWindow.name(naming),
                self.window
            )));
        }
        Ok(())
    }
}
