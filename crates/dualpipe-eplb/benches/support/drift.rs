//! The "drift" benchmark: Zipf-like expert loads that drift by a multiplicative random walk,
//! rebalanced at every interval by the reference policy from scratch and by the improved,
//! migration-aware planner; reproducible from a seed.
//!
//!
//! A benchmark harness, not library API: `benches/drift.rs` and `tests/planner_drift.rs`
//! include this file with `#[path]`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use dualpipe_eplb::improved::{balancedness, rebalance_improved, PlannerOptions};
use dualpipe_eplb::moves::move_plan;
use dualpipe_eplb::{rebalance_experts, LoadMatrix};
use dualpipe_eplb::{EplbError, Layout};

/// Shape and randomness of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DriftConfig {
    /// MoE layers.
    pub layers: usize,
    /// Logical experts per layer.
    pub experts: usize,
    /// Physical experts (replicas) per layer.
    pub replicas: usize,
    /// Expert groups.
    pub groups: usize,
    /// Nodes.
    pub nodes: usize,
    /// GPUs.
    pub gpus: usize,
    /// Rebalance intervals after the initial placement.
    pub intervals: usize,
    /// How the initial loads are drawn.
    pub distribution: Distribution,
    /// Standard deviation of the log-load step per interval (each expert's weight is multiplied
    /// by `exp(sigma * N(0, 1))`).
    pub drift_sigma: f64,
    /// Tokens routed per layer and interval (the loads of a layer sum to this).
    pub tokens_per_layer: f64,
    /// Bytes of one expert's weights (for the bytes moved).
    pub expert_bytes: u64,
    /// Seed of the random walk.
    pub seed: u64,
}

impl Default for DriftConfig {
    /// 256 experts in 8 groups, 58 layers, 288 replicas on 32 GPUs in 4 nodes, 100 intervals;
    /// an expert of DeepSeek-V3's size (3 x 7168 x 2048 weights in FP8).
    fn default() -> Self {
        DriftConfig {
            layers: 58,
            experts: 256,
            replicas: 288,
            groups: 8,
            nodes: 4,
            gpus: 32,
            intervals: 100,
            distribution: Distribution::Zipf(0.8),
            drift_sigma: 0.1,
            tokens_per_layer: 1.0e6,
            expert_bytes: 3 * 7168 * 2048,
            seed: 0,
        }
    }
}

impl DriftConfig {
    /// The cluster layout.
    pub fn layout(&self) -> Layout {
        Layout {
            experts: self.experts,
            replicas: self.replicas,
            groups: self.groups,
            nodes: self.nodes,
            gpus: self.gpus,
        }
    }
}

/// How the initial loads are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Distribution {
    /// Zipf with this exponent: the expert of rank `k` (a random order per layer) gets weight
    /// `1 / k^s`.
    Zipf(f64),
    /// Independent Pareto draws with this shape `alpha` (scale 1): heavier tails for smaller
    /// `alpha`.
    Pareto(f64),
}

/// The load generator: call [`DriftLoads::next_interval`] for each interval's loads.
#[derive(Clone, Debug)]
pub struct DriftLoads {
    config: DriftConfig,
    rng: ChaCha8Rng,
    weight: Vec<Vec<f64>>,
}

impl DriftLoads {
    /// Draws the initial Zipf-like weights (a random rank order per layer).
    pub fn new(config: &DriftConfig) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let weight = (0..config.layers)
            .map(|_| match config.distribution {
                Distribution::Zipf(s) => {
                    let mut rank: Vec<usize> = (0..config.experts).collect();
                    for i in (1..rank.len()).rev() {
                        let j = rng.random_range(0..=i);
                        rank.swap(i, j);
                    }
                    rank.iter()
                        .map(|&k| 1.0 / ((k + 1) as f64).powf(s))
                        .collect()
                }
                Distribution::Pareto(alpha) => (0..config.experts)
                    .map(|_| (1.0 - rng.random::<f64>()).powf(-1.0 / alpha))
                    .collect(),
            })
            .collect();
        DriftLoads {
            config: *config,
            rng,
            weight,
        }
    }

    /// The loads of the current interval (`[layers][experts]`, each layer summing to
    /// `tokens_per_layer`), then one step of the random walk.
    pub fn next_interval(&mut self) -> Vec<Vec<f64>> {
        let loads = self
            .weight
            .iter()
            .map(|row| {
                let total: f64 = row.iter().sum();
                row.iter()
                    .map(|w| w / total * self.config.tokens_per_layer)
                    .collect()
            })
            .collect();
        let sigma = self.config.drift_sigma;
        for row in &mut self.weight {
            for w in row.iter_mut() {
                *w *= (sigma * standard_normal(&mut self.rng)).exp();
            }
        }
        loads
    }
}

/// A standard normal draw (Box-Muller).
fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A policy under test.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arm {
    /// The reference policy from scratch at every interval.
    Reference,
    /// The improved policy from scratch at every interval (no previous placement).
    ImprovedFresh(PlannerOptions),
    /// The improved policy given the previous interval's placement.
    Improved(PlannerOptions),
}

impl Arm {
    /// A short name for tables.
    pub fn name(&self) -> String {
        match self {
            Arm::Reference => "reference, from scratch".into(),
            Arm::ImprovedFresh(_) => "improved, from scratch".into(),
            Arm::Improved(o) => {
                let mut s = format!("improved, migration-aware (tolerance {}", o.tolerance);
                if let Some(x) = o.min_imbalance {
                    s += &format!(", min-imbalance {x}");
                }
                s + ")"
            }
        }
    }
}

/// What one arm did over all intervals.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ArmReport {
    /// The arm's name.
    pub name: String,
    /// Replicas moved over all intervals and layers.
    pub moved: usize,
    /// Of those, transfers between nodes.
    pub inter_node: usize,
    /// Bytes moved.
    pub bytes: u64,
    /// Transfer rounds over all intervals.
    pub rounds: usize,
    /// Mean over intervals and layers of mean GPU load / max GPU load.
    pub mean_balancedness: f64,
    /// The worst (smallest) balancedness of any interval and layer.
    pub worst_balancedness: f64,
    /// (interval, layer) pairs where some GPU holds two replicas of one expert.
    pub duplicate_layers: usize,
    /// Replicas beyond the first of an expert on a GPU, summed.
    pub duplicate_replicas: usize,
    /// (interval, layer) pairs evaluated.
    pub samples: usize,
}

/// Runs every arm over the same drifting loads. The initial placement (interval 0) is planned
/// from scratch and not counted; each of the `intervals` following rebalances is.
pub fn run_drift(config: &DriftConfig, arms: &[Arm]) -> Result<Vec<ArmReport>, EplbError> {
    let layout = config.layout();
    layout.validate(&LoadMatrix::filled(1, layout.experts, 0.0))?;
    let mut loads = DriftLoads::new(config);
    let mut prev: Vec<Option<Vec<Vec<usize>>>> = vec![None; arms.len()];
    let mut reports: Vec<ArmReport> = arms
        .iter()
        .map(|a| ArmReport {
            name: a.name(),
            moved: 0,
            inter_node: 0,
            bytes: 0,
            rounds: 0,
            mean_balancedness: 0.0,
            worst_balancedness: 1.0,
            duplicate_layers: 0,
            duplicate_replicas: 0,
            samples: 0,
        })
        .collect();
    for interval in 0..=config.intervals {
        let load = loads.next_interval();
        for (i, arm) in arms.iter().enumerate() {
            let plan = plan_arm(arm, &load, &layout, prev[i].as_deref())?;
            if interval > 0 {
                let r = &mut reports[i];
                let old = prev[i].as_ref().expect("placed at interval 0");
                let moves = move_plan(old, &plan, layout.gpus, layout.nodes, config.expert_bytes);
                r.moved += moves.moves.len();
                r.inter_node += moves.inter_node();
                r.bytes = r.bytes.saturating_add(moves.total_bytes());
                r.rounds += moves.rounds.len();
                for (row, l) in plan.iter().zip(&load) {
                    let b = balancedness(row, l, layout.gpus);
                    r.mean_balancedness += b;
                    r.worst_balancedness = r.worst_balancedness.min(b);
                    let d = duplicates(row, &layout);
                    r.duplicate_layers += usize::from(d > 0);
                    r.duplicate_replicas += d;
                    r.samples += 1;
                }
            }
            prev[i] = Some(plan);
        }
    }
    for r in &mut reports {
        r.mean_balancedness /= r.samples.max(1) as f64;
    }
    Ok(reports)
}

fn plan_arm(
    arm: &Arm,
    load: &[Vec<f64>],
    layout: &Layout,
    prev: Option<&[Vec<usize>]>,
) -> Result<Vec<Vec<usize>>, EplbError> {
    match arm {
        Arm::Reference => {
            let matrix = LoadMatrix::from_rows(load.to_vec())?;
            let plan = rebalance_experts(
                &matrix,
                layout.replicas,
                layout.groups,
                layout.nodes,
                layout.gpus,
            )?;
            Ok(plan
                .phy2log
                .iter_rows()
                .map(|row| row.iter().map(|&e| e as usize).collect())
                .collect())
        }
        Arm::ImprovedFresh(o) => Ok(rebalance_improved(load, layout, None, o)?.phy2log()),
        Arm::Improved(o) => Ok(rebalance_improved(load, layout, prev, o)?.phy2log()),
    }
}

/// Avoidable duplicates in one layer: replicas of an expert on one GPU beyond
/// `ceil(replicas of the expert / GPUs of its domain)` (the domain is a node under the
/// hierarchical policy, all GPUs under the global one). Zero means duplicate-free.
pub fn duplicates(phy2log: &[usize], layout: &Layout) -> usize {
    let gpus = layout.gpus;
    let slots = phy2log.len() / gpus.max(1);
    let domain = if layout.hierarchical() {
        layout.gpus_per_node()
    } else {
        gpus
    };
    let mut count = vec![0usize; layout.experts];
    for &e in phy2log {
        count[e] += 1;
    }
    (0..gpus)
        .map(|g| {
            let mut here = phy2log[g * slots..(g + 1) * slots].to_vec();
            here.sort_unstable();
            here.chunk_by(|a, b| a == b)
                .map(|run| {
                    run.len()
                        .saturating_sub(count[run[0]].div_ceil(domain).max(1))
                })
                .sum::<usize>()
        })
        .sum()
}

/// The reports as a Markdown table.
pub fn table(reports: &[ArmReport]) -> String {
    let mut s = String::from(
        "| policy | replicas moved | vs reference | GB moved | inter-node | rounds | mean balancedness | worst | layers with duplicates |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let base = reports.first().map_or(0, |r| r.moved).max(1) as f64;
    for r in reports {
        s += &format!(
            "| {} | {} | {:+.1}% | {:.1} | {} | {} | {:.4} | {:.4} | {} of {} |\n",
            r.name,
            r.moved,
            (r.moved as f64 / base - 1.0) * 100.0,
            r.bytes as f64 / 1e9,
            r.inter_node,
            r.rounds,
            r.mean_balancedness,
            r.worst_balancedness,
            r.duplicate_layers,
            r.samples
        );
    }
    s
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn loads_are_reproducible_and_normalised() {
        let config = DriftConfig {
            layers: 3,
            intervals: 2,
            ..DriftConfig::default()
        };
        let mut a = DriftLoads::new(&config);
        let mut b = DriftLoads::new(&config);
        for _ in 0..3 {
            let (la, lb) = (a.next_interval(), b.next_interval());
            assert_eq!(la, lb);
            for row in &la {
                let total: f64 = row.iter().sum();
                assert!((total - config.tokens_per_layer).abs() < 1e-6 * total);
            }
        }
        let mut c = DriftLoads::new(&DriftConfig { seed: 1, ..config });
        assert_ne!(c.next_interval(), DriftLoads::new(&config).next_interval());
    }

    #[test]
    fn the_walk_moves_loads() {
        let config = DriftConfig {
            layers: 1,
            ..DriftConfig::default()
        };
        let mut g = DriftLoads::new(&config);
        let first = g.next_interval();
        let second = g.next_interval();
        assert_ne!(first, second);
    }

    #[test]
    fn duplicates_are_counted_per_gpu() {
        let layout = Layout {
            experts: 3,
            replicas: 4,
            groups: 1,
            nodes: 1,
            gpus: 2,
        };
        assert_eq!(duplicates(&[0, 0, 1, 2], &layout), 1);
        assert_eq!(duplicates(&[0, 1, 0, 2], &layout), 0);
        // Three replicas on two GPUs: two on one GPU is unavoidable.
        let layout = Layout {
            experts: 2,
            replicas: 4,
            groups: 1,
            nodes: 1,
            gpus: 2,
        };
        assert_eq!(duplicates(&[0, 0, 0, 1], &layout), 0);
    }
}
