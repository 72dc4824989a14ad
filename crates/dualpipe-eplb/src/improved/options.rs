//! The improved policy's knobs, [`PlannerOptions`].

use crate::EplbError;

/// Knobs of the improved policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlannerOptions {
    /// With a previous placement: how much hotter than a fresh plan the hottest GPU of a layer
    /// may be, as a fraction (0.0 = no worse than a fresh plan of this policy).
    pub tolerance: f64,
    /// With a previous placement: leave a layer untouched while its hottest GPU carries at most
    /// this multiple of the mean GPU load (hysteresis). `None` re-plans every layer.
    pub min_imbalance: Option<f64>,
    /// Steps of the improvement pass per domain.
    pub search_steps: usize,
    /// With a previous placement: the most replicas of a domain that the re-plan from the
    /// previous placement may move, as a fraction of the domain's slots; past it the fresh plan
    /// (relabelled) is used.
    pub max_move_fraction: f64,
    /// Packing ties: a GPU that held the expert before wins when its load is within this
    /// fraction of the mean GPU load of the least-loaded candidate.
    pub near_equal: f64,
}

impl Default for PlannerOptions {
    fn default() -> Self {
        PlannerOptions {
            tolerance: 0.0,
            min_imbalance: None,
            search_steps: 256,
            max_move_fraction: 0.5,
            near_equal: 0.02,
        }
    }
}

impl PlannerOptions {
    /// Checks that every option is in range.
    pub fn check(&self) -> Result<(), EplbError> {
        let bad = |m: String| Err(EplbError::Option(m));
        if !(self.tolerance.is_finite() && self.tolerance >= 0.0) {
            return bad(format!(
                "tolerance {} must be a finite number >= 0",
                self.tolerance
            ));
        }
        if let Some(x) = self.min_imbalance {
            if !(x.is_finite() && x >= 1.0) {
                return bad(format!(
                    "min-imbalance {x} must be a finite number >= 1 (max / mean)"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.max_move_fraction) {
            return bad(format!(
                "max-move-fraction {} must be in [0, 1]",
                self.max_move_fraction
            ));
        }
        if !(self.near_equal.is_finite() && self.near_equal >= 0.0) {
            return bad(format!(
                "near-equal {} must be a finite number >= 0",
                self.near_equal
            ));
        }
        Ok(())
    }
}
