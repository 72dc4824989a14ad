//! Contiguous layer partitions: which layers each pipeline stage holds.
//!
//! [`min_max`] is the dynamic program over contiguous partitions that minimises the slowest
//! stage's time (layers' `F + I + W` divided by the stage's device speed), keeping every stage
//! within its memory: `best[s][b]` is the smallest bottleneck of stages `0..=s` holding layers
//! `0..b`, and `best[s][b] = min over a of max(best[s-1][a], time(s, a..b))`. It runs in
//! `O(stages x layers^2)` with prefix sums at worst; the scan over `a` stops as soon as stage
//! `s` alone is slower than the best found, which for even layers makes it about
//! `layers^2 x ln(stages)`.

use serde::{Deserialize, Serialize};

use dualpipe_sim::{ChunkBytes, Recompute};

use crate::memory::LiveChunks;
use crate::profile::Profile;

/// What one stage may hold and how fast it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct StageSlot {
    /// Relative speed of the slowest device that runs the stage.
    pub speed: f64,
    /// Bytes the stage may use on each device that runs it.
    pub memory: f64,
    /// The micro-batches whose activations the stage keeps alive at once, before and after
    /// their input backward.
    pub live: LiveChunks,
}

/// A contiguous partition of the layers into stages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Partition {
    /// `bounds[s]..bounds[s + 1]` are stage `s`'s layers; `bounds[0] = 0`, the last is the
    /// number of layers.
    pub bounds: Vec<usize>,
}

impl Partition {
    /// Number of stages.
    pub fn stages(&self) -> usize {
        self.bounds.len().saturating_sub(1)
    }

    /// Layers of stage `s`.
    pub fn range(&self, s: usize) -> std::ops::Range<usize> {
        self.bounds[s]..self.bounds[s + 1]
    }

    /// Layers per stage.
    pub fn sizes(&self) -> Vec<usize> {
        self.bounds.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// The even partition: every stage gets `layers / stages` layers, the first
    /// `layers % stages` one more. `None` when there are fewer layers than stages.
    pub fn even(layers: usize, stages: usize) -> Option<Partition> {
        if stages == 0 || layers < stages {
            return None;
        }
        let mut bounds = vec![0];
        for s in 0..stages {
            let size = layers / stages + usize::from(s < layers % stages);
            bounds.push(bounds[s] + size);
        }
        Some(Partition { bounds })
    }

    /// The bottleneck of this partition on `slots`: the slowest stage's time (with the
    /// recomputation a stage needs to fit, see [`Partition::recompute`]), or `None` when a
    /// stage does not fit its memory even recomputing.
    pub fn bottleneck(&self, profile: &Profile, slots: &[StageSlot]) -> Option<f64> {
        let sums = Sums::new(profile);
        let mut worst: f64 = 0.0;
        for (s, slot) in slots.iter().enumerate() {
            let r = self.range(s);
            if !sums.fits(slot, r.start, r.end) {
                return None;
            }
            worst = worst.max(sums.time(slot, r.start, r.end));
        }
        Some(worst)
    }
}

/// Prefix sums of work, parameter and activation bytes, and per recomputation (selective,
/// full) of the bytes kept, the seconds rerun and the layers that do not offer it.
struct Sums {
    work: Vec<f64>,
    params: Vec<f64>,
    acts: Vec<f64>,
    /// Bytes kept between `I` and `W` ([`crate::LayerCost::backward_bytes`]).
    back: Vec<f64>,
    /// `[selective, full]`: (kept bytes, rerun seconds, layers without it).
    rerun: [(Vec<f64>, Vec<f64>, Vec<usize>); 2],
}

const RECOMPUTING: [Recompute; 2] = [Recompute::Selective, Recompute::Full];

impl Sums {
    fn new(profile: &Profile) -> Sums {
        let n = profile.layers.len();
        let (mut work, mut params, mut acts) = (
            Vec::with_capacity(n + 1),
            Vec::with_capacity(n + 1),
            Vec::with_capacity(n + 1),
        );
        let mut back = Vec::with_capacity(n + 1);
        work.push(0.0);
        params.push(0.0);
        acts.push(0.0);
        back.push(0.0);
        for (l, layer) in profile.layers.iter().enumerate() {
            work.push(work[l] + layer.work());
            params.push(params[l] + layer.parameter_bytes);
            acts.push(acts[l] + layer.activation_bytes);
            back.push(back[l] + layer.backward_bytes());
        }
        let rerun = RECOMPUTING.map(|mode| {
            let mut kept = vec![0.0];
            let mut secs = vec![0.0];
            let mut missing = vec![0usize];
            for (l, layer) in profile.layers.iter().enumerate() {
                let (k, t) = layer
                    .kept(mode, profile.message_bytes)
                    .unwrap_or((0.0, 0.0));
                kept.push(kept[l] + k);
                secs.push(secs[l] + t);
                missing.push(missing[l] + usize::from(layer.kept(mode, 0).is_none()));
            }
            (kept, secs, missing)
        });
        Sums {
            work,
            params,
            acts,
            back,
            rerun,
        }
    }

    /// The least recomputation (none, selective, full) with which layers `a..b` fit the
    /// slot's memory, and the forward seconds it reruns per micro-batch.
    fn choice(&self, slot: &StageSlot, a: usize, b: usize) -> Option<(Recompute, f64)> {
        let params = self.params[b] - self.params[a];
        let acts = self.acts[b] - self.acts[a];
        let backward = self.back[b] - self.back[a];
        let none = ChunkBytes {
            forward: acts,
            backward,
        };
        if params + slot.live.bytes(none, 0.0) <= slot.memory {
            return Some((Recompute::None, 0.0));
        }
        RECOMPUTING
            .into_iter()
            .zip(&self.rerun)
            .find_map(|(mode, (kept, secs, missing))| {
                let kept = kept[b] - kept[a];
                let per_chunk = ChunkBytes {
                    forward: kept,
                    backward,
                };
                (missing[b] == missing[a]
                    && params + slot.live.bytes(per_chunk, acts - kept) <= slot.memory)
                    .then_some((mode, secs[b] - secs[a]))
            })
    }

    fn time(&self, slot: &StageSlot, a: usize, b: usize) -> f64 {
        let rerun = self.choice(slot, a, b).map_or(0.0, |c| c.1);
        (self.work[b] - self.work[a] + rerun) / slot.speed
    }

    fn fits(&self, slot: &StageSlot, a: usize, b: usize) -> bool {
        self.choice(slot, a, b).is_some()
    }
}

impl Partition {
    /// What each stage recomputes on `slots`: the least recomputation with which it fits its
    /// memory (none when it fits without, or when nothing fits).
    pub fn recompute(&self, profile: &Profile, slots: &[StageSlot]) -> Vec<Recompute> {
        let sums = Sums::new(profile);
        slots
            .iter()
            .enumerate()
            .map(|(s, slot)| {
                let r = self.range(s);
                sums.choice(slot, r.start, r.end)
                    .map_or(Recompute::None, |c| c.0)
            })
            .collect()
    }
}

/// The partition of `profile`'s layers over `slots.len()` stages (every stage at least one
/// layer) whose slowest stage is fastest, within each stage's memory; with its bottleneck.
/// `None` when no partition fits (fewer layers than stages, or too little memory).
pub fn min_max(profile: &Profile, slots: &[StageSlot]) -> Option<(Partition, f64)> {
    let layers = profile.layers.len();
    let stages = slots.len();
    if stages == 0 || layers < stages {
        return None;
    }
    let sums = Sums::new(profile);
    // best[s][b]: bottleneck of stages 0..=s over layers 0..b; from[s][b]: stage s's start.
    let mut best = vec![vec![f64::INFINITY; layers + 1]; stages];
    let mut from = vec![vec![0usize; layers + 1]; stages];
    for (b, cell) in best[0].iter_mut().enumerate().skip(1) {
        if sums.fits(&slots[0], 0, b) {
            *cell = sums.time(&slots[0], 0, b);
        }
    }
    for s in 1..stages {
        for b in (s + 1)..=layers {
            // Stage s starting earlier (smaller a) only adds work and bytes to it, so the
            // scan from the right stops once the stage no longer fits or alone takes longer
            // than the best found: exactly the result of scanning every a, ties going to the
            // smallest a as before, in about layers / (s + 1) steps instead of layers.
            for a in (s..b).rev() {
                if !sums.fits(&slots[s], a, b) {
                    break;
                }
                let time = sums.time(&slots[s], a, b);
                if time > best[s][b] {
                    break;
                }
                let before = best[s - 1][a];
                if !before.is_finite() {
                    continue;
                }
                let value = before.max(time);
                if value <= best[s][b] && value.is_finite() {
                    best[s][b] = value;
                    from[s][b] = a;
                }
            }
        }
    }
    let bottleneck = best[stages - 1][layers];
    if !bottleneck.is_finite() {
        return None;
    }
    let mut bounds = vec![layers; stages + 1];
    for s in (1..stages).rev() {
        bounds[s] = from[s][bounds[s + 1]];
    }
    bounds[0] = 0;
    Some((Partition { bounds }, bottleneck))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::LayerCost;

    fn profile(work: &[f64], params: &[f64]) -> Profile {
        Profile {
            message_bytes: 0,
            layers: work
                .iter()
                .zip(params)
                .map(|(&w, &p)| LayerCost {
                    f: w,
                    i: 0.0,
                    w: 0.0,
                    activation_bytes: 1.0,
                    parameter_bytes: p,
                    w_bytes: None,
                    recompute: None,
                })
                .collect(),
        }
    }

    /// Every way to cut `layers` into `stages` non-empty contiguous parts.
    fn all_partitions(layers: usize, stages: usize) -> Vec<Partition> {
        fn rec(
            start: usize,
            left: usize,
            layers: usize,
            bounds: &mut Vec<usize>,
            out: &mut Vec<Partition>,
        ) {
            if left == 1 {
                bounds.push(layers);
                out.push(Partition {
                    bounds: bounds.clone(),
                });
                bounds.pop();
                return;
            }
            for end in (start + 1)..=(layers - left + 1) {
                bounds.push(end);
                rec(end, left - 1, layers, bounds, out);
                bounds.pop();
            }
        }
        let mut out = Vec::new();
        rec(0, stages, layers, &mut vec![0], &mut out);
        out
    }

    /// A small deterministic generator (no dependency for the tests).
    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 33) % 1000) as f64 / 100.0 + 0.01
    }

    #[test]
    fn dynamic_program_matches_brute_force() {
        let mut seed = 7;
        for case in 0..300 {
            let layers = 1 + case % 8;
            let stages = 1 + (case / 8) % 4;
            let work: Vec<f64> = (0..layers).map(|_| lcg(&mut seed)).collect();
            let params: Vec<f64> = (0..layers).map(|_| lcg(&mut seed)).collect();
            let p = profile(&work, &params);
            let slots: Vec<StageSlot> = (0..stages)
                .map(|_| StageSlot {
                    speed: 0.5 + lcg(&mut seed) / 5.0,
                    memory: 5.0 + 3.0 * lcg(&mut seed),
                    live: LiveChunks::uniform(1 + (lcg(&mut seed) as usize) % 3),
                })
                .collect();
            let brute = all_partitions(layers, stages.min(layers))
                .into_iter()
                .filter(|_| stages <= layers)
                .filter_map(|q| q.bottleneck(&p, &slots))
                .fold(f64::INFINITY, f64::min);
            match min_max(&p, &slots) {
                Some((part, value)) => {
                    assert!(
                        (value - brute).abs() <= 1e-9 * brute.max(1.0),
                        "case {case}: {value} vs {brute}"
                    );
                    let again = part.bottleneck(&p, &slots).expect("the plan fits");
                    assert!((again - value).abs() <= 1e-9 * value.max(1.0));
                    assert_eq!(part.sizes().iter().sum::<usize>(), layers);
                    assert!(part.sizes().iter().all(|&n| n > 0));
                }
                None => assert!(
                    brute.is_infinite(),
                    "case {case}: DP found nothing, brute force {brute}"
                ),
            }
        }
    }

    #[test]
    fn a_faster_device_gets_more_layers() {
        let p = profile(&[1.0; 12], &[0.0; 12]);
        let slot = |speed| StageSlot {
            speed,
            memory: 100.0,
            live: LiveChunks::uniform(1),
        };
        let (part, value) = min_max(&p, &[slot(1.0), slot(2.0), slot(1.0)]).unwrap();
        assert_eq!(part.sizes(), vec![3, 6, 3]);
        assert_eq!(value, 3.0);
        assert_eq!(Partition::even(10, 3).unwrap().sizes(), vec![4, 3, 3]);
    }

    /// The dynamic program with every `a` scanned (no early stop), as it was first written.
    fn min_max_full_scan(profile: &Profile, slots: &[StageSlot]) -> Option<Partition> {
        let (layers, stages) = (profile.layers.len(), slots.len());
        if stages == 0 || layers < stages {
            return None;
        }
        let sums = Sums::new(profile);
        let mut best = vec![vec![f64::INFINITY; layers + 1]; stages];
        let mut from = vec![vec![0usize; layers + 1]; stages];
        for (b, cell) in best[0].iter_mut().enumerate().skip(1) {
            if sums.fits(&slots[0], 0, b) {
                *cell = sums.time(&slots[0], 0, b);
            }
        }
        for s in 1..stages {
            for b in (s + 1)..=layers {
                for a in s..b {
                    let before = best[s - 1][a];
                    if !before.is_finite() || !sums.fits(&slots[s], a, b) {
                        continue;
                    }
                    let value = before.max(sums.time(&slots[s], a, b));
                    if value < best[s][b] {
                        best[s][b] = value;
                        from[s][b] = a;
                    }
                }
            }
        }
        if !best[stages - 1][layers].is_finite() {
            return None;
        }
        let mut bounds = vec![layers; stages + 1];
        for s in (1..stages).rev() {
            bounds[s] = from[s][bounds[s + 1]];
        }
        bounds[0] = 0;
        Some(Partition { bounds })
    }

    #[test]
    fn the_early_stop_gives_the_same_partition_as_the_full_scan() {
        let mut seed = 11;
        for case in 0..400 {
            let layers = 1 + case % 40;
            let stages = 1 + (case / 40) % 9;
            // Whole numbers make ties common, which the early stop must break as before.
            let work: Vec<f64> = (0..layers)
                .map(|_| (lcg(&mut seed) as u64 % 3) as f64)
                .collect();
            let params: Vec<f64> = (0..layers).map(|_| lcg(&mut seed)).collect();
            let p = profile(&work, &params);
            let slots: Vec<StageSlot> = (0..stages)
                .map(|_| StageSlot {
                    speed: 1.0 + (lcg(&mut seed) as u64 % 2) as f64,
                    memory: 10.0 + 8.0 * lcg(&mut seed),
                    live: LiveChunks::uniform(1 + (lcg(&mut seed) as usize) % 3),
                })
                .collect();
            assert_eq!(
                min_max(&p, &slots).map(|(q, _)| q),
                min_max_full_scan(&p, &slots),
                "case {case}"
            );
        }
    }

    #[test]
    fn a_stage_recomputes_only_when_it_would_not_fit_otherwise() {
        let layer = |recompute| LayerCost {
            f: 1.0,
            i: 1.0,
            w: 1.0,
            activation_bytes: 10.0,
            parameter_bytes: 0.0,
            w_bytes: None,
            recompute,
        };
        let cost = Some(crate::RecomputeCost {
            full_bytes: 1.0,
            selective_bytes: 4.0,
            selective_f: 0.5,
        });
        let p = Profile {
            message_bytes: 1,
            layers: vec![layer(cost); 4],
        };
        let slot = |memory| StageSlot {
            speed: 1.0,
            memory,
            live: LiveChunks::uniform(4),
        };
        let even = Partition::even(4, 2).unwrap();
        // Two layers x 4 in flight x 10 bytes = 80: fits without recomputing.
        assert_eq!(
            even.recompute(&p, &[slot(80.0), slot(80.0)]),
            vec![Recompute::None; 2]
        );
        assert_eq!(even.bottleneck(&p, &[slot(80.0), slot(80.0)]), Some(6.0));
        // Selective: 4 x 8 + (20 - 8) = 44; full: 4 x 2 + 18 = 26.
        let slots = [slot(44.0), slot(26.0)];
        assert_eq!(
            even.recompute(&p, &slots),
            vec![Recompute::Selective, Recompute::Full]
        );
        // The rerun forward is charged: selective 2 x 0.5, full 2 x 1.
        assert_eq!(even.bottleneck(&p, &slots), Some(8.0));
        assert_eq!(even.bottleneck(&p, &[slot(25.0), slot(80.0)]), None);
        // Without a layer's recomputation costs selective is not offered; full keeps the
        // message bytes.
        let plain = Profile {
            message_bytes: 1,
            layers: vec![layer(None); 4],
        };
        assert_eq!(
            even.recompute(&plain, &[slot(44.0), slot(26.0)]),
            vec![Recompute::Full, Recompute::Full]
        );
    }
}
