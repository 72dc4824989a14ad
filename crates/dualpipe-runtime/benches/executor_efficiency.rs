//! Executor efficiency: the measured step time of DualPipe (8 ranks, 20 micro-batches) on
//! sleeping stages against the simulator's prediction for the same costs.
//!
//! `cargo bench -p dualpipe-runtime --bench executor_efficiency` prints, per configuration,
//! the median measured makespan over several steps, the simulated makespan for the nominal
//! costs, and the simulated makespan for the per-op durations actually measured (which
//! separates the executor's own overhead from the OS's sleep overshoot). Goal: measured within
//! 3% of the simulation. Run without `--bench` (as `cargo test --benches` does), it runs one
//! short step as a smoke test.

use std::time::Duration;

use dualpipe_runtime::{run_step, ExecOptions, SleepCosts, SleepStage};
use dualpipe_schedule::{build, Op, ScheduleKind};
use dualpipe_sim::{metrics, simulate, CostModel, Timeline};

/// Mean measured duration of each op kind: (F, B, W, FB), in seconds; NaN if none ran.
fn measured_costs(timeline: &Timeline) -> [f64; 4] {
    let mut sums = [0.0; 4];
    let mut counts = [0usize; 4];
    for i in timeline.compute.iter().flatten() {
        let slot = match i.op {
            Op::F(_) => 0,
            Op::B(_) => 1,
            Op::W(_) => 2,
            Op::FB { .. } => 3,
            _ => continue,
        };
        sums[slot] += i.end - i.start;
        counts[slot] += 1;
    }
    let mut out = [f64::NAN; 4];
    for k in 0..4 {
        if counts[k] > 0 {
            out[k] = sums[k] / counts[k] as f64;
        }
    }
    out
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (kind, ranks, micro_batches) = (ScheduleKind::DualPipe, 8, 20);
    let schedule = build(kind, ranks, micro_batches, 1).expect("DualPipe 8 x 20 builds");
    let configs: &[(f64, f64, f64, f64)] = if full {
        &[(10.0, 20.0, 10.0, 25.0), (4.0, 8.0, 4.0, 10.0)]
    } else {
        &[(1.0, 2.0, 1.0, 2.5)]
    };
    let steps = if full { 7 } else { 1 };
    println!(
        "DualPipe, {ranks} ranks, {micro_batches} micro-batches, sleeping stages, median of {steps} steps"
    );
    println!(
        "{:>22} {:>12} {:>12} {:>8} {:>14} {:>8} {:>9} {:>9}",
        "F/B/W/FB (ms)",
        "measured s",
        "simulated s",
        "diff",
        "sim(measured)",
        "diff",
        "bubble m",
        "bubble s"
    );
    for &(f, b, w, fb) in configs {
        let costs = SleepCosts::from_millis(f, b, w, fb);
        let mut makespans = Vec::new();
        let mut last = None;
        for _ in 0..steps {
            let mut ranks = SleepStage::ranks_for(&schedule, costs);
            let outcome = run_step(&schedule, &mut ranks, &ExecOptions::default())
                .expect("sleeping stages cannot fail");
            makespans.push(outcome.timeline.makespan());
            last = Some(outcome.timeline);
        }
        let measured = median(makespans);
        let timeline = last.expect("at least one step");
        let nominal = CostModel::uniform(f / 1e3, b / 1e3, w / 1e3, fb / 1e3);
        let predicted = simulate(&schedule, &nominal).expect("simulates");
        let [mf, mb, mw, mfb] = measured_costs(&timeline);
        let fb_cost = if mfb.is_nan() { fb / 1e3 } else { mfb };
        let b_cost = if mb.is_nan() { mf.max(0.0) * b / f } else { mb };
        let actual = CostModel::uniform(mf, b_cost, mw, fb_cost);
        let predicted_actual = simulate(&schedule, &actual).expect("simulates");
        let diff = |a: f64, p: f64| format!("{:+.2}%", 100.0 * (a - p) / p);
        println!(
            "{:>22} {:>12.4} {:>12.4} {:>8} {:>14.4} {:>8} {:>9.4} {:>9.4}",
            format!("{f}/{b}/{w}/{fb}"),
            measured,
            predicted.makespan(),
            diff(measured, predicted.makespan()),
            predicted_actual.makespan(),
            diff(measured, predicted_actual.makespan()),
            metrics(&timeline, &schedule.placement).bubble_ratio,
            metrics(&predicted, &schedule.placement).bubble_ratio,
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
