//! Optimizers, applied to each stage copy after the copies' gradients are summed, so the two
//! copies of a DualPipe stage take bit-identical steps.

use std::fmt;

use candle_core::Tensor;

use crate::error::NnError;
use crate::layers::kernels::{self, AdamWStep};
use crate::layers::Param;

/// Which optimizer, with its hyper-parameters (the learning rate is separate).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimizerKind {
    /// SGD with (PyTorch-style) momentum: `buf ← μ buf + g` (`buf = g` on the first step),
    /// `p ← p − lr buf`.
    Sgd {
        /// Momentum `μ` (0 for plain SGD).
        momentum: f64,
    },
    /// AdamW (Loshchilov & Hutter, PyTorch's formulation): with step count `t`,
    /// `p ← p (1 − lr λ)`, `m ← β₁ m + (1 − β₁) g`, `v ← β₂ v + (1 − β₂) g²`,
    /// `p ← p − lr (m / (1 − β₁ᵗ)) / (√(v / (1 − β₂ᵗ)) + ε)`.
    AdamW {
        /// β₁, the decay of the first moment.
        beta1: f64,
        /// β₂, the decay of the second moment.
        beta2: f64,
        /// ε, added to the denominator.
        eps: f64,
        /// λ, the decoupled weight decay.
        weight_decay: f64,
    },
}

impl OptimizerKind {
    /// Names accepted by [`OptimizerKind::from_name`].
    pub const NAMES: [&'static str; 2] = ["sgd", "adamw"];

    /// SGD with momentum 0.9.
    pub const fn sgd() -> Self {
        OptimizerKind::Sgd { momentum: 0.9 }
    }

    /// AdamW with β = (0.9, 0.999), ε = 1e-8, weight decay 0.01 (PyTorch's defaults).
    pub const fn adamw() -> Self {
        OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }

    /// `"sgd"` or `"adamw"`.
    pub fn name(&self) -> &'static str {
        match self {
            OptimizerKind::Sgd { .. } => "sgd",
            OptimizerKind::AdamW { .. } => "adamw",
        }
    }

    /// The optimizer with default hyper-parameters for a name (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "sgd" => Some(Self::sgd()),
            "adamw" => Some(Self::adamw()),
            _ => None,
        }
    }
}

impl fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the learning rate decays after the warm-up of an [`LrSchedule`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LrDecay {
    /// The peak learning rate until the last step.
    #[default]
    Constant,
    /// Half a cosine from the peak down to [`LrSchedule::min`] at [`LrSchedule::total`]
    /// (as nanoGPT and most GPT recipes do).
    Cosine,
}

impl LrDecay {
    /// Names accepted by [`LrDecay::from_name`].
    pub const NAMES: [&'static str; 2] = ["constant", "cosine"];

    /// `"constant"` or `"cosine"`.
    pub fn name(&self) -> &'static str {
        match self {
            LrDecay::Constant => "constant",
            LrDecay::Cosine => "cosine",
        }
    }

    /// The decay for a name (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "constant" => Some(LrDecay::Constant),
            "cosine" => Some(LrDecay::Cosine),
            _ => None,
        }
    }
}

/// The learning rate of every step of a run: a linear warm-up to the peak over `warmup`
/// steps, then [`LrDecay`]. A pure function of the step number, so a resumed run continues
/// the same curve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    /// The peak learning rate.
    pub peak: f64,
    /// Steps of linear warm-up: step `t ≤ warmup` (1-based) uses `peak · t / warmup`.
    pub warmup: u64,
    /// What follows the warm-up.
    pub decay: LrDecay,
    /// The cosine's floor, reached at step `total`.
    pub min: f64,
    /// The run's last step (the cosine's end).
    pub total: u64,
}

impl LrSchedule {
    /// The peak learning rate at every step.
    pub const fn constant(peak: f64) -> Self {
        LrSchedule {
            peak,
            warmup: 0,
            decay: LrDecay::Constant,
            min: peak,
            total: 0,
        }
    }

    /// The learning rate of step `step` (1-based; step 0 reads as step 1).
    pub fn at(&self, step: u64) -> f64 {
        let step = step.max(1);
        if step <= self.warmup {
            return self.peak * step as f64 / self.warmup as f64;
        }
        match self.decay {
            LrDecay::Constant => self.peak,
            LrDecay::Cosine => {
                let span = self.total.saturating_sub(self.warmup);
                let done = if span == 0 {
                    1.0
                } else {
                    ((step - self.warmup) as f64 / span as f64).min(1.0)
                };
                self.min
                    + (self.peak - self.min) * 0.5 * (1.0 + (std::f64::consts::PI * done).cos())
            }
        }
    }
}

/// One parameter's optimizer state (what a checkpoint saves beside the parameter).
#[derive(Clone, Debug)]
pub enum ParamState {
    /// SGD's momentum buffer.
    Sgd {
        /// The momentum buffer `buf` (same shape as the parameter).
        momentum: Tensor,
    },
    /// AdamW's moments.
    AdamW {
        /// The first moment `m`.
        m: Tensor,
        /// The second moment `v`.
        v: Tensor,
    },
}

impl ParamState {
    /// The state's tensors with their names (`"momentum"`, or `"m"` and `"v"`).
    pub fn tensors(&self) -> Vec<(&'static str, &Tensor)> {
        match self {
            ParamState::Sgd { momentum } => vec![("momentum", momentum)],
            ParamState::AdamW { m, v } => vec![("m", m), ("v", v)],
        }
    }

    /// The names [`ParamState::tensors`] gives for `kind`.
    pub fn names(kind: OptimizerKind) -> &'static [&'static str] {
        match kind {
            OptimizerKind::Sgd { .. } => &["momentum"],
            OptimizerKind::AdamW { .. } => &["m", "v"],
        }
    }
}

use ParamState as State;

/// An optimizer for one stage copy's parameters (always passed in the same order).
#[derive(Clone, Debug)]
pub struct Optimizer {
    kind: OptimizerKind,
    lr: LrSchedule,
    steps: u64,
    state: Vec<State>,
    /// 1-bit Adam: AdamW's second moment stops at this many steps ([`Optimizer::step`]).
    variance_frozen_from: Option<u64>,
    /// 1-bit Adam: exchange the momentum divided by Adam's (frozen) denominator.
    preconditioned: bool,
    /// 1-bit Adam: after the warm-up, every step whose 1-based number is a multiple of this
    /// updates the second moment again ([`Optimizer::with_variance_refresh`]); 0: never.
    refresh_every: u64,
    /// 1-bit Adam: only the multiples `refresh_every · 2^i` refresh
    /// ([`Optimizer::with_variance_refresh_doubling`]).
    refresh_doubling: bool,
}

impl Optimizer {
    /// An optimizer of `kind` with the constant learning rate `lr`.
    pub fn new(kind: OptimizerKind, lr: f64) -> Self {
        Self::scheduled(kind, LrSchedule::constant(lr))
    }

    /// An optimizer of `kind` whose learning rate follows `lr` over its steps.
    pub fn scheduled(kind: OptimizerKind, lr: LrSchedule) -> Self {
        Optimizer {
            kind,
            lr,
            steps: 0,
            state: Vec::new(),
            variance_frozen_from: None,
            preconditioned: false,
            refresh_every: 0,
            refresh_doubling: false,
        }
    }

    /// 1-bit Adam's two phases (Tang et al., 2021) for AdamW: the first `warmup` steps are
    /// AdamW's; from then on the second moment stays as it was after step `warmup`, and each
    /// step's "gradient" is the new first moment itself, the replicas' averaged momentum that
    /// [`Optimizer::fold_momentum`] started. Nothing changes for SGD, or with `warmup` 0 (a
    /// second moment needs at least one step).
    pub fn with_variance_frozen_from(mut self, warmup: u64) -> Self {
        self.variance_frozen_from = (warmup > 0).then_some(warmup);
        self
    }

    /// In 1-bit Adam's compression phase, whether [`Optimizer::fold_momentum`] divides the
    /// momentum by Adam's frozen denominator `√v̂ + ε` before it is exchanged (`true`), or
    /// gives the momentum itself, as Tang et al. do (`false`, the default). The two are the
    /// same update without compression (the denominator is frozen and equal on every
    /// replica); compressed, the preconditioned momentum's entries are all of the size of
    /// an Adam step, so one sign scale per chunk suits every entry, where the raw
    /// momentum's scale turns the sign of an entry with a small `v` into a step many times
    /// Adam's (docs/distributed.md, "Why 1-bit lost").
    pub fn with_preconditioned_momentum(mut self, preconditioned: bool) -> Self {
        self.preconditioned = preconditioned;
        self
    }

    /// In 1-bit Adam's compression phase, the second moment is refreshed on every step whose
    /// 1-based number `t` is a multiple of `every` (0: never, the variance stays frozen, as
    /// Tang et al.'s 1-bit Adam). A refresh step is a plain AdamW step on the exchanged
    /// gradient, except that the second moment is updated as AdamW's would be over the `Δ`
    /// steps since its last update, each with this step's gradient:
    /// `v ← β₂^Δ v + (1 − β₂^Δ) g²`, and is read with AdamW's bias correction of step `t`
    /// until the next refresh. So the frozen second moment follows the one AdamW would keep,
    /// sampled every `every` steps, instead of staying what it was after the warm-up.
    pub fn with_variance_refresh(mut self, every: u64) -> Self {
        self.refresh_every = every;
        self
    }

    /// With [`Optimizer::with_variance_refresh`]`(k)`, refresh only on the steps `k · 2^i`
    /// (`k`, `2k`, `4k`, ...: intervals that double, 0/1 Adam's idea) instead of every
    /// multiple of `k`.
    pub fn with_variance_refresh_doubling(mut self, doubling: bool) -> Self {
        self.refresh_doubling = doubling;
        self
    }

    /// The step from which the second moment stays frozen (`None`: never).
    pub fn variance_frozen_from(&self) -> Option<u64> {
        self.variance_frozen_from
    }

    /// Whether the step of 1-based number `t` refreshes the second moment (after the warm-up).
    fn is_refresh(&self, t: u64) -> bool {
        let k = self.refresh_every;
        k > 0
            && self.variance_frozen_from.is_some_and(|w| t > w)
            && t.is_multiple_of(k)
            && (!self.refresh_doubling || (t / k).is_power_of_two())
    }

    /// The 1-based number of the last step up to `t` that updated the second moment: `t`
    /// itself outside 1-bit Adam's compression phase, else the warm-up's last step or the
    /// last refresh.
    fn variance_step(&self, t: u64) -> u64 {
        match self.variance_frozen_from {
            Some(w) if t > w => {
                let k = self.refresh_every;
                let refreshed = if k == 0 || t < k {
                    0
                } else if self.refresh_doubling {
                    // The largest k · 2^i <= t.
                    k << (t / k).ilog2()
                } else {
                    t / k * k
                };
                refreshed.max(w)
            }
            _ => t,
        }
    }

    /// Whether the next [`Optimizer::step`] keeps the second moment frozen and takes the
    /// gradients as the new first moment (not on a refresh step).
    pub fn variance_frozen(&self) -> bool {
        matches!(self.kind, OptimizerKind::AdamW { .. })
            && !self.state.is_empty()
            && self.variance_frozen_from.is_some_and(|w| self.steps >= w)
            && !self.is_refresh(self.steps + 1)
    }

    /// In 1-bit Adam's compression phase ([`Optimizer::variance_frozen`]; a no-op otherwise),
    /// replaces each gradient `g` by this optimizer's next momentum `β₁ m + (1 − β₁) g`, the
    /// value 1-bit Adam exchanges between replicas instead of the gradient (divided by
    /// `√(v / (1 − β₂ʷ)) + ε`, `w` the warm-up, with
    /// [`Optimizer::with_preconditioned_momentum`]). The parameters
    /// marked in `plain` (by position, a missing entry is `false`) keep their gradient: they
    /// stay plain AdamW (see [`Optimizer::step_masked`]).
    pub fn fold_momentum(&self, params: &mut [&mut Param], plain: &[bool]) -> Result<(), NnError> {
        let OptimizerKind::AdamW {
            beta1, beta2, eps, ..
        } = self.kind
        else {
            return Ok(());
        };
        if !self.variance_frozen() {
            return Ok(());
        }
        let inv_bc2 = 1.0 / (1.0 - beta2.powi(self.variance_step(self.steps) as i32));
        for (i, (p, state)) in params.iter_mut().zip(&self.state).enumerate() {
            if plain.get(i).copied().unwrap_or(false) {
                continue;
            }
            if let State::AdamW { m, v } = state {
                let folded = m
                    .affine(beta1, 0.0)
                    .and_then(|m| m + p.grad.affine(1.0 - beta1, 0.0)?)
                    .and_then(|m| {
                        if self.preconditioned {
                            m / v.affine(inv_bc2, 0.0)?.sqrt()?.affine(1.0, eps)?
                        } else {
                            Ok(m)
                        }
                    });
                p.grad = folded.map_err(|e| NnError::tensor("1-bit Adam's momentum", e))?;
            }
        }
        Ok(())
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The optimizer and its hyper-parameters.
    pub fn kind(&self) -> OptimizerKind {
        self.kind
    }

    /// The per-parameter state, in the order of the parameters given to
    /// [`Optimizer::step`] (empty before the first step).
    pub fn state(&self) -> &[ParamState] {
        &self.state
    }

    /// Restores a saved state: `steps` steps taken and `state` per parameter (empty with
    /// `steps` 0). Refused when a state is of the other optimizer, or the count disagrees
    /// with `steps`.
    pub fn set_state(&mut self, steps: u64, state: Vec<ParamState>) -> Result<(), NnError> {
        if (steps == 0) != state.is_empty() {
            return Err(NnError::Stage(format!(
                "optimizer state of {} parameters after {steps} steps: a state is kept from \
                 the first step on",
                state.len()
            )));
        }
        let fits = state.iter().all(|s| {
            matches!(
                (s, self.kind),
                (ParamState::Sgd { .. }, OptimizerKind::Sgd { .. })
                    | (ParamState::AdamW { .. }, OptimizerKind::AdamW { .. })
            )
        });
        if !fits {
            return Err(NnError::Stage(format!(
                "the saved optimizer state is not {}'s",
                self.kind
            )));
        }
        self.steps = steps;
        self.state = state;
        Ok(())
    }

    /// Updates every parameter from its accumulated gradient (gradients are left as they are).
    pub fn step(&mut self, params: &mut [&mut Param]) -> Result<(), NnError> {
        self.step_masked(params, &[])
    }

    /// [`Optimizer::step`], where the parameters marked in `plain` (by position, a missing
    /// entry is `false`) stay plain AdamW in 1-bit Adam's compression phase: their second
    /// moment keeps moving and their gradient is their own, not a folded momentum (the
    /// sharded experts of an expert-parallel run, whose gradients are summed exactly among
    /// their holders instead of compressed). Outside that phase `plain` changes nothing.
    pub fn step_masked(
        &mut self,
        params: &mut [&mut Param],
        plain: &[bool],
    ) -> Result<(), NnError> {
        if self.steps > 0 && self.state.len() != params.len() {
            return Err(NnError::Stage(format!(
                "optimizer was set up for {} parameters and got {}",
                self.state.len(),
                params.len()
            )));
        }
        let frozen = self.variance_frozen();
        self.steps += 1;
        let first = self.state.is_empty();
        let lr = self.lr.at(self.steps);
        for (i, p) in params.iter_mut().enumerate() {
            match self.kind {
                OptimizerKind::Sgd { momentum } => {
                    let old = match self.state.get(i) {
                        Some(State::Sgd { momentum }) => Some(momentum),
                        _ => None,
                    };
                    let (value, buf) = kernels::sgd(&p.value, &p.grad, old, momentum, lr)?;
                    p.value = value;
                    if first {
                        self.state.push(State::Sgd { momentum: buf });
                    } else {
                        self.state[i] = State::Sgd { momentum: buf };
                    }
                }
                OptimizerKind::AdamW {
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                } => {
                    let plain_param = plain.get(i).copied().unwrap_or(false);
                    let frozen = frozen && !plain_param;
                    let t = self.steps as i32;
                    // The second moment's decay this step and the step its bias correction
                    // counts to.
                    let (t2, decay2) = if plain_param {
                        (t, beta2)
                    } else if frozen {
                        (self.variance_step(self.steps) as i32, beta2)
                    } else {
                        // A refresh stands for the steps since the second moment's last update.
                        let since = self.steps - self.variance_step(self.steps - 1);
                        (t, beta2.powi(since as i32))
                    };
                    let step = AdamWStep {
                        beta1,
                        beta2: decay2,
                        eps,
                        decay: 1.0 - lr * weight_decay,
                        inv_bc2: 1.0 / (1.0 - beta2.powi(t2)),
                        step_size: lr / (1.0 - beta1.powi(t)),
                        frozen_variance: frozen,
                        preconditioned: self.preconditioned,
                    };
                    let old = match self.state.get(i) {
                        Some(State::AdamW { m, v }) => Some((m, v)),
                        _ => None,
                    };
                    let (value, m, v) = kernels::adamw(&p.value, &p.grad, old, step)?;
                    p.value = value;
                    if first {
                        self.state.push(State::AdamW { m, v });
                    } else {
                        self.state[i] = State::AdamW { m, v };
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn param(v: f64, g: f64) -> Param {
        let mut p = Param::new(Tensor::new(&[v], &Device::Cpu).unwrap()).unwrap();
        p.grad = Tensor::new(&[g], &Device::Cpu).unwrap();
        p
    }

    fn value(p: &Param) -> f64 {
        p.value.to_vec1::<f64>().unwrap()[0]
    }

    #[test]
    fn the_schedule_warms_up_linearly_then_follows_half_a_cosine() {
        let s = LrSchedule {
            peak: 1.0,
            warmup: 4,
            decay: LrDecay::Cosine,
            min: 0.1,
            total: 14,
        };
        let at: Vec<f64> = [1, 2, 4, 9, 14, 20].iter().map(|&t| s.at(t)).collect();
        let want = [0.25, 0.5, 1.0, 0.55, 0.1, 0.1];
        for (got, want) in at.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{at:?}");
        }
        let c = LrSchedule {
            decay: LrDecay::Constant,
            ..s
        };
        assert_eq!((c.at(2), c.at(5), c.at(14)), (0.5, 1.0, 1.0));
        assert_eq!(LrSchedule::constant(0.3).at(0), 0.3);
    }

    #[test]
    fn a_scheduled_sgd_step_uses_the_step_s_rate() {
        let mut p = param(1.0, 1.0);
        let lr = LrSchedule {
            peak: 0.2,
            warmup: 2,
            decay: LrDecay::Constant,
            min: 0.2,
            total: 0,
        };
        let mut opt = Optimizer::scheduled(OptimizerKind::Sgd { momentum: 0.0 }, lr);
        opt.step(&mut [&mut p]).unwrap();
        assert!((value(&p) - 0.9).abs() < 1e-15);
        opt.step(&mut [&mut p]).unwrap();
        assert!((value(&p) - 0.7).abs() < 1e-15);
    }

    #[test]
    fn sgd_momentum_matches_hand_computation() {
        let mut p = param(1.0, 0.5);
        let mut opt = Optimizer::new(OptimizerKind::Sgd { momentum: 0.9 }, 0.1);
        opt.step(&mut [&mut p]).unwrap();
        assert!((value(&p) - (1.0 - 0.1 * 0.5)).abs() < 1e-15);
        opt.step(&mut [&mut p]).unwrap();
        // buf = 0.9 * 0.5 + 0.5 = 0.95
        assert!((value(&p) - (0.95 - 0.1 * 0.95)).abs() < 1e-15);
    }

    #[test]
    fn adamw_matches_hand_computation() {
        let (b1, b2, eps, wd, lr) = (0.9, 0.999, 1e-8, 0.01, 0.1);
        let mut p = param(1.0, 0.5);
        let kind = OptimizerKind::AdamW {
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay: wd,
        };
        let mut opt = Optimizer::new(kind, lr);
        let (mut x, mut m, mut v) = (1.0f64, 0.0f64, 0.0f64);
        for t in 1..=3 {
            let g = 0.5;
            opt.step(&mut [&mut p]).unwrap();
            x *= 1.0 - lr * wd;
            m = b1 * m + (1.0 - b1) * g;
            v = b2 * v + (1.0 - b2) * g * g;
            let mhat = m / (1.0 - b1.powi(t));
            let vhat = v / (1.0 - b2.powi(t));
            x -= lr * mhat / (vhat.sqrt() + eps);
            assert!(
                (value(&p) - x).abs() < 1e-14,
                "step {t}: {} vs {x}",
                value(&p)
            );
        }
    }

    #[test]
    fn one_bit_adam_freezes_the_variance_and_takes_the_momentum_after_the_warmup() {
        let (b1, b2, eps, wd, lr) = (0.9, 0.999, 1e-8, 0.01, 0.1);
        let kind = OptimizerKind::AdamW {
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay: wd,
        };
        // `q` is marked plain (a sharded expert): it stays AdamW throughout.
        let (mut p, mut q) = (param(1.0, 0.5), param(-1.0, 0.5));
        let mut opt = Optimizer::new(kind, lr).with_variance_frozen_from(2);
        let (mut x, mut m, mut v) = (1.0f64, 0.0f64, 0.0f64);
        let (mut y, mut mq, mut vq) = (-1.0f64, 0.0f64, 0.0f64);
        for (t, g) in [(1, 0.5), (2, -0.25), (3, 0.75), (4, 0.125)] {
            p.grad = Tensor::new(&[g], &Device::Cpu).unwrap();
            q.grad = Tensor::new(&[-g], &Device::Cpu).unwrap();
            assert_eq!(opt.variance_frozen(), t > 2, "step {t}");
            // The replicas would average the folded momentum here; one replica keeps it.
            let plain = [false, true];
            opt.fold_momentum(&mut [&mut p, &mut q], &plain).unwrap();
            let grad = q.grad.to_vec1::<f64>().unwrap()[0];
            assert_eq!(grad, -g, "step {t}: a plain gradient is not folded");
            opt.step_masked(&mut [&mut p, &mut q], &plain).unwrap();
            x *= 1.0 - lr * wd;
            m = b1 * m + (1.0 - b1) * g;
            if t <= 2 {
                v = b2 * v + (1.0 - b2) * g * g;
            }
            let mhat = m / (1.0 - b1.powi(t));
            let vhat = v / (1.0 - b2.powi(t.min(2)));
            x -= lr * mhat / (vhat.sqrt() + eps);
            assert!(
                (value(&p) - x).abs() < 1e-14,
                "step {t}: {} vs {x}",
                value(&p)
            );
            y *= 1.0 - lr * wd;
            mq = b1 * mq + (1.0 - b1) * -g;
            vq = b2 * vq + (1.0 - b2) * g * g;
            let mhat = mq / (1.0 - b1.powi(t));
            let vhat = vq / (1.0 - b2.powi(t));
            y -= lr * mhat / (vhat.sqrt() + eps);
            assert!(
                (value(&q) - y).abs() < 1e-14,
                "step {t}, plain: {} vs {y}",
                value(&q)
            );
        }
        let ParamState::AdamW { v: kept, .. } = &opt.state()[0] else {
            panic!("AdamW keeps m and v");
        };
        assert_eq!(kept.to_vec1::<f64>().unwrap()[0], v);
    }

    /// Warm-up 2, refresh every 5: steps 1-2 AdamW, 3-4 frozen (momentum taken), 5 a refresh
    /// (plain AdamW on the gradient, `v` moved by the 3 steps since step 2 with this
    /// gradient, `v ← β₂³ v + (1 − β₂³) g²`, bias correction of step 5), 6-7 frozen again and
    /// read with step 5's correction; by hand.
    #[test]
    fn one_bit_adam_refreshes_the_variance_as_adamw_over_the_steps_since_its_last_update() {
        let (b1, b2, eps, lr) = (0.9f64, 0.999f64, 1e-8, 0.1);
        let kind = OptimizerKind::AdamW {
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay: 0.0,
        };
        let mut opt = Optimizer::new(kind, lr)
            .with_variance_frozen_from(2)
            .with_variance_refresh(5);
        let grads = [0.5, -0.25, 0.75, 0.125, -0.5, 2.0, 0.25];
        let x = one_bit_adam_by_hand(&mut opt, (b1, b2, eps, lr), &grads, &[5], 1e-14);
        // Without the refresh the variance stays step 2's: steps 5-7 move differently.
        let mut frozen = Optimizer::new(kind, lr).with_variance_frozen_from(2);
        let mut q = param(1.0, 0.5);
        for g in grads {
            q.grad = Tensor::new(&[g], &Device::Cpu).unwrap();
            frozen.fold_momentum(&mut [&mut q], &[]).unwrap();
            frozen.step(&mut [&mut q]).unwrap();
        }
        assert!((value(&q) - x).abs() > 1e-6);
    }

    /// Warm-up 2, refreshes doubling from 4: steps 4, 8 and 16 refresh (not 12: a plain
    /// period of 4 would), each moving `v` by the steps since the last update, by hand.
    #[test]
    fn one_bit_adam_refreshes_on_doubling_steps_when_asked() {
        let (b1, b2, eps, lr) = (0.9f64, 0.99f64, 1e-8, 0.05);
        let kind = OptimizerKind::AdamW {
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay: 0.0,
        };
        let mut opt = Optimizer::new(kind, lr)
            .with_variance_frozen_from(2)
            .with_variance_refresh(4)
            .with_variance_refresh_doubling(true);
        let grads: Vec<f64> = (1..=18)
            .map(|t| (f64::from(t) * 0.9).sin() * f64::from(t))
            .collect();
        one_bit_adam_by_hand(&mut opt, (b1, b2, eps, lr), &grads, &[4, 8, 16], 1e-12);
    }

    /// Runs `opt` (1-bit Adam frozen from step 2) on one parameter (1.0) over `grads` and
    /// checks every step against AdamW by hand, whose variance moves on steps 1-2 and
    /// `refreshes` only, each by the steps since its last update; returns the last value.
    fn one_bit_adam_by_hand(
        opt: &mut Optimizer,
        (b1, b2, eps, lr): (f64, f64, f64, f64),
        grads: &[f64],
        refreshes: &[i32],
        tolerance: f64,
    ) -> f64 {
        let mut p = param(1.0, 0.5);
        let (mut x, mut m, mut v, mut last) = (1.0f64, 0.0f64, 0.0f64, 0i32);
        for (t, &g) in (1i32..).zip(grads) {
            let refresh = refreshes.contains(&t);
            assert_eq!(opt.variance_frozen(), t > 2 && !refresh, "step {t}");
            p.grad = Tensor::new(&[g], &Device::Cpu).unwrap();
            opt.fold_momentum(&mut [&mut p], &[]).unwrap();
            opt.step(&mut [&mut p]).unwrap();
            m = b1 * m + (1.0 - b1) * g;
            if t <= 2 || refresh {
                let keep = b2.powi(t - last);
                v = keep * v + (1.0 - keep) * g * g;
                last = t;
            }
            let vhat = v / (1.0 - b2.powi(last));
            x -= lr * (m / (1.0 - b1.powi(t))) / (vhat.sqrt() + eps);
            assert!(
                (value(&p) - x).abs() < tolerance,
                "step {t}: {} vs {x}",
                value(&p)
            );
        }
        x
    }

    #[test]
    fn the_preconditioned_momentum_is_the_momentum_over_adams_frozen_denominator() {
        let (b1, b2, eps, lr) = (0.9, 0.999, 1e-8, 0.1);
        let kind = OptimizerKind::AdamW {
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay: 0.01,
        };
        // The same gradients through both variants: without compression in between they
        // take the same steps (to rounding), and the preconditioned one exchanges
        // m / (√(v / (1 − β₂²)) + ε), every entry of the size of an Adam step.
        let mut raw = Optimizer::new(kind, lr).with_variance_frozen_from(2);
        let mut pre = Optimizer::new(kind, lr)
            .with_variance_frozen_from(2)
            .with_preconditioned_momentum(true);
        let (mut p, mut q) = (param(1.0, 0.0), param(1.0, 0.0));
        let (mut m, mut v) = (0.0f64, 0.0f64);
        for (t, g) in [(1, 0.5), (2, -0.25), (3, 0.75), (4, 0.125), (5, -1.5)] {
            for x in [&mut p, &mut q] {
                x.grad = Tensor::new(&[g], &Device::Cpu).unwrap();
            }
            raw.fold_momentum(&mut [&mut p], &[]).unwrap();
            pre.fold_momentum(&mut [&mut q], &[]).unwrap();
            m = b1 * m + (1.0 - b1) * g;
            if t <= 2 {
                v = b2 * v + (1.0 - b2) * g * g;
            }
            let sent = q.grad.to_vec1::<f64>().unwrap()[0];
            if t > 2 {
                let want = m / ((v / (1.0 - b2 * b2)).sqrt() + eps);
                assert!((sent - want).abs() < 1e-12, "step {t}: {sent} vs {want}");
                assert!(sent.abs() < 10.0, "step {t}: {sent} is not step-sized");
            } else {
                assert_eq!(sent, g, "step {t}: the warm-up folds nothing");
            }
            raw.step(&mut [&mut p]).unwrap();
            pre.step(&mut [&mut q]).unwrap();
            assert!(
                (value(&p) - value(&q)).abs() < 1e-12,
                "step {t}: {} vs {}",
                value(&p),
                value(&q)
            );
            let (State::AdamW { m: mp, .. }, State::AdamW { m: mq, .. }) =
                (&raw.state()[0], &pre.state()[0])
            else {
                panic!("AdamW keeps m and v");
            };
            let (mp, mq) = (
                mp.to_vec1::<f64>().unwrap()[0],
                mq.to_vec1::<f64>().unwrap()[0],
            );
            assert!((mp - m).abs() < 1e-12 && (mq - m).abs() < 1e-12, "step {t}");
        }
        assert_eq!(pre.variance_frozen_from(), Some(2));
    }

    #[test]
    fn without_a_warmup_or_under_sgd_nothing_is_frozen() {
        for (kind, warmup) in [(OptimizerKind::adamw(), 0), (OptimizerKind::sgd(), 1)] {
            let mut opt = Optimizer::new(kind, 0.1).with_variance_frozen_from(warmup);
            let mut p = param(1.0, 0.5);
            for _ in 0..3 {
                assert!(!opt.variance_frozen());
                opt.fold_momentum(&mut [&mut p], &[]).unwrap();
                assert_eq!(p.grad.to_vec1::<f64>().unwrap()[0], 0.5);
                opt.step(&mut [&mut p]).unwrap();
            }
        }
    }

    #[test]
    fn a_restored_state_continues_bit_identically() {
        for kind in [OptimizerKind::sgd(), OptimizerKind::adamw()] {
            let mut p = param(1.0, 0.5);
            let mut opt = Optimizer::new(kind, 0.1);
            opt.step(&mut [&mut p]).unwrap();
            opt.step(&mut [&mut p]).unwrap();
            let (steps, state) = (opt.steps(), opt.state().to_vec());
            let mut q = param(value(&p), 0.5);
            let mut restored = Optimizer::new(kind, 0.1);
            restored.set_state(steps, state).unwrap();
            opt.step(&mut [&mut p]).unwrap();
            restored.step(&mut [&mut q]).unwrap();
            assert_eq!(value(&p).to_bits(), value(&q).to_bits(), "{kind}");
            assert_eq!(
                ParamState::names(kind).len(),
                opt.state()[0].tensors().len()
            );
        }
        let adam = Optimizer::new(OptimizerKind::adamw(), 0.1);
        let mut sgd = Optimizer::new(OptimizerKind::sgd(), 0.1);
        let mut p = param(1.0, 0.5);
        let mut other = Optimizer::new(OptimizerKind::adamw(), 0.1);
        other.step(&mut [&mut p]).unwrap();
        assert!(sgd.set_state(1, other.state().to_vec()).is_err());
        assert!(sgd.set_state(1, Vec::new()).is_err());
        assert_eq!(adam.state().len(), 0);
    }

    #[test]
    fn names_round_trip() {
        for name in OptimizerKind::NAMES {
            assert_eq!(OptimizerKind::from_name(name).unwrap().name(), name);
        }
        assert!(OptimizerKind::from_name("lion").is_none());
    }
}
