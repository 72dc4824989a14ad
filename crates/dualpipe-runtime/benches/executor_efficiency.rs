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
use dualpipe_schedule::{build, ScheduleKind};
use dualpipe_sim::{metrics, simulate, CostModel, OpTimes};

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
        let mut timelines = Vec::new();
        for _ in 0..steps {
            let mut ranks = SleepStage::ranks_for(&schedule, costs);
            let outcome = run_step(&schedule, &mut ranks, &ExecOptions::default())
                .expect("sleeping stages cannot fail");
            makespans.push(outcome.timeline.makespan());
            timelines.push(outcome.timeline);
        }
        let measured = median(makespans.clone());
        let median_step = makespans
            .iter()
            .position(|&m| m == measured)
            .expect("the median is one of the steps");
        let timeline = &timelines[median_step];
        let nominal = CostModel::uniform(f / 1e3, b / 1e3, w / 1e3, fb / 1e3);
        let predicted = simulate(&schedule, &nominal).expect("simulates");
        // The same simulation with the op durations the sleeps of the median step really
        // took (they overshoot by the OS's wake-up latency).
        let mut actual = nominal.clone();
        actual.compute = OpTimes::from_timelines([timeline])
            .stage_cost()
            .expect("forwards and backwards ran");
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
            metrics(timeline, &schedule.placement).bubble_ratio,
            metrics(&predicted, &schedule.placement).bubble_ratio,
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
