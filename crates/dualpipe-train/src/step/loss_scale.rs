//! Dynamic loss scaling for f16 mixed precision.
//!
//! f16's smallest normal value is 6.1e-5, so small gradients held in f16 (the saved output
//! gradients, the GEMMs' operands) would round to zero. The loss gradient is multiplied by a
//! scale `S` before the backward and every parameter gradient divided by `S` before the
//! optimizer; a step whose gradients overflowed (an infinite or NaN global norm) is skipped,
//! its optimizer step not taken, and `S` halved; after [`GROWTH_INTERVAL`] steps in a row
//! without overflow `S` doubles. The defaults are PyTorch's `GradScaler`'s.

use serde::{Deserialize, Serialize};

/// The scale of the first step (2¹⁶).
pub const INITIAL_SCALE: f64 = 65536.0;
/// Steps in a row without overflow after which the scale doubles.
pub const GROWTH_INTERVAL: u64 = 2000;
/// The smallest scale (an overflow at scale 1 keeps it at 1).
pub const MIN_SCALE: f64 = 1.0;

/// The loss scale and its history, saved in checkpoints so a resumed run scales as the
/// uninterrupted one.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScale {
    /// The scale the next step multiplies the loss gradient by.
    pub scale: f64,
    /// Steps since the last overflow or growth.
    pub good_steps: u64,
    /// Steps skipped so far because their gradients overflowed.
    pub skipped_steps: u64,
}

impl Default for LossScale {
    fn default() -> Self {
        LossScale {
            scale: INITIAL_SCALE,
            good_steps: 0,
            skipped_steps: 0,
        }
    }
}

impl LossScale {
    /// Records a step whose scaled gradients had global norm `norm`; returns whether its
    /// optimizer step is taken (the norm is finite). An overflow halves the scale; the
    /// [`GROWTH_INTERVAL`]-th good step in a row doubles it.
    pub fn update(&mut self, norm: f64) -> bool {
        if !norm.is_finite() {
            self.scale = (self.scale / 2.0).max(MIN_SCALE);
            self.good_steps = 0;
            self.skipped_steps += 1;
            return false;
        }
        self.good_steps += 1;
        if self.good_steps == GROWTH_INTERVAL {
            self.scale *= 2.0;
            self.good_steps = 0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_halves_and_skips_then_growth_doubles() {
        let mut s = LossScale::default();
        assert!(!s.update(f64::INFINITY));
        assert!(!s.update(f64::NAN));
        assert_eq!((s.scale, s.skipped_steps), (INITIAL_SCALE / 4.0, 2));
        for _ in 0..GROWTH_INTERVAL - 1 {
            assert!(s.update(1.0));
        }
        assert_eq!(s.scale, INITIAL_SCALE / 4.0);
        assert!(s.update(1.0));
        assert_eq!((s.scale, s.good_steps), (INITIAL_SCALE / 2.0, 0));
    }

    #[test]
    fn the_scale_stays_at_least_one() {
        let mut s = LossScale {
            scale: 1.0,
            ..LossScale::default()
        };
        assert!(!s.update(f64::INFINITY));
        assert_eq!(s.scale, MIN_SCALE);
    }
}
