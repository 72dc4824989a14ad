//! The drift benchmark (see docs/eplb-planner.md): reference policy from scratch at every
//! interval against the improved, migration-aware planner, on loads drifting from a seed.
//!
//! `cargo bench -p dualpipe-eplb --bench drift` runs the full configuration (58 layers, 100
//! intervals); `-- --quick` runs 8 layers and 20 intervals. `--seed N`, `--layers N`,
//! `--tolerance T` (default: both 0 and 0.01), `--min-imbalance X`, `--steps N`,
//! `--intervals N`, `--zipf S`, `--pareto ALPHA`, `--nodes N`, `--groups N` and
//! `--sigma S` override the configuration.

use std::time::Instant;

#[path = "support/drift.rs"]
#[allow(dead_code)]
mod drift;
use drift::{run_drift, table, Arm, Distribution, DriftConfig};
use dualpipe_eplb::improved::PlannerOptions;

fn main() {
    let mut config = DriftConfig::default();
    let mut tolerance = None;
    let mut min_imbalance = None;
    let mut steps = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| -> f64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match a.as_str() {
            "--quick" => {
                config.layers = 8;
                config.intervals = 20;
            }
            "--seed" => config.seed = value("--seed") as u64,
            "--layers" => config.layers = value("--layers") as usize,
            "--intervals" => config.intervals = value("--intervals") as usize,
            "--zipf" => config.distribution = Distribution::Zipf(value("--zipf")),
            "--pareto" => config.distribution = Distribution::Pareto(value("--pareto")),
            "--nodes" => config.nodes = value("--nodes") as usize,
            "--groups" => config.groups = value("--groups") as usize,
            "--sigma" => config.drift_sigma = value("--sigma"),
            "--tolerance" => tolerance = Some(value("--tolerance")),
            "--steps" => steps = Some(value("--steps") as usize),
            "--min-imbalance" => min_imbalance = Some(value("--min-imbalance")),
            _ => {} // cargo bench passes --bench
        }
    }
    let mut base = PlannerOptions::default();
    if let Some(steps) = steps {
        base.search_steps = steps;
    }
    let mut arms = vec![Arm::Reference, Arm::ImprovedFresh(base)];
    // Without --tolerance: the CLI default (0.0) and 0.01.
    for tolerance in tolerance.map_or(vec![0.0, 0.01], |t| vec![t]) {
        arms.push(Arm::Improved(PlannerOptions {
            tolerance,
            min_imbalance,
            ..base
        }));
    }
    println!("drift benchmark: {config:?}");
    let start = Instant::now();
    let reports = run_drift(&config, &arms).expect("valid configuration");
    println!("{}", table(&reports));
    println!("({:.1} s for all arms)", start.elapsed().as_secs_f64());
}
