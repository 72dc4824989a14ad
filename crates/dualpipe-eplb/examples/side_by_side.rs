//! The improved policy and the deepseek policy side by side on the large shapes of the
//! benchmark's `scale` group: best of a few runs each, one table (input, improved, deepseek,
//! ratio, max/mean of both, a fingerprint of the improved plan to tell whether a change of the
//! search changed a plan).
//!
//! Times are CPU time of the process (all threads, `CLOCK_PROCESS_CPUTIME_ID`), so that a
//! loaded machine slows both policies alike instead of charging one with the time it waited
//! for a core; run with `RAYON_NUM_THREADS=1` to compare one core with one core (the deepseek
//! policy plans large inputs in parallel over layers).
//!
//! `cargo run --release -p dualpipe-eplb --example side_by_side [RUNS [NAME_PART [POLICY]]]`
//! (`POLICY` `improved` or `deepseek` runs only that one, e.g. under `perf stat`; `dump`
//! writes each input's loads as JSON, `NAME.json`, for the CLI; `previous` times the improved
//! policy's migration-aware path instead: a plan for other loads of the same shape is the
//! previous placement of both policies, so both also plan the moves from it.)

use std::time::Instant;

use dualpipe_eplb::improved::gpu_loads;
use dualpipe_eplb::{plan, Layout, LoadMatrix, Planner, Policy, PreviousPlacement};

#[path = "../benches/support/shapes.rs"]
mod shapes;

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    let only = std::env::args().nth(2).unwrap_or_default();
    let policy = std::env::args().nth(3).unwrap_or_default();
    println!(
        "| input | improved | deepseek | ratio | max/mean improved | max/mean deepseek | plan fingerprint |"
    );
    println!("|---|---|---|---|---|---|---|");
    'shapes: for shape in shapes::SCALE.iter().filter(|s| s.name.contains(&only)) {
        let w = shapes::loads(shape.layers, shape.experts, 42);
        let layout = Layout::of_loads(&w, shape.replicas, shape.groups, shape.nodes, shape.gpus);
        if policy == "dump" {
            let rows: Vec<&[f64]> = (0..w.rows()).map(|l| w.row(l)).collect();
            let text = serde_json::to_string(&rows).expect("numbers");
            std::fs::write(format!("{}.json", shape.name), text).expect("writable directory");
            continue;
        }
        // The previous placement, for `previous`: the improved plan of other loads.
        let previous = (policy == "previous").then(|| {
            let before = shapes::loads(shape.layers, shape.experts, 7);
            let out = plan(&before, &layout, &Planner::default(), None, 0).expect("valid shape");
            PreviousPlacement::from_rows(out.plan.phy2log_rows().expect("expert indices"))
        });
        let mut row = Vec::new();
        let mut fingerprint = 0;
        for planner in [Planner::default(), Planner::Reference(Policy::Auto)] {
            if !policy.is_empty() && policy != "previous" && planner.name() != policy {
                row.push((f64::NAN, f64::NAN));
                continue;
            }
            let mut best = f64::INFINITY;
            let mut quality = 0.0;
            for _ in 0..runs {
                let (start, cpu) = (Instant::now(), cpu_seconds());
                let out = match plan(&w, &layout, &planner, previous.as_ref(), 0) {
                    Ok(out) => out,
                    Err(e) => {
                        println!("| {} | refused: {e} |", shape.name);
                        continue 'shapes;
                    }
                };
                let took = match (cpu, cpu_seconds()) {
                    (Some(a), Some(b)) => b - a,
                    _ => start.elapsed().as_secs_f64(),
                };
                best = best.min(took);
                let rows = out.plan.phy2log_rows().expect("expert indices");
                quality = max_over_mean(&rows, &w, shape.gpus);
                if matches!(planner, Planner::Improved(_)) {
                    fingerprint = fnv(&rows);
                }
            }
            row.push((best, quality));
        }
        println!(
            "| {} | {:.4} s | {:.4} s | {:.1}x | {:.8} | {:.8} | {:016x} |",
            shape.name,
            row[0].0,
            row[1].0,
            row[0].0 / row[1].0,
            row[0].1,
            row[1].1,
            fingerprint
        );
    }
}

/// CPU time of this process so far, all threads.
fn cpu_seconds() -> Option<f64> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    (rc == 0).then_some(t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9)
}

/// Mean over layers of the hottest GPU's load over the mean GPU load.
fn max_over_mean(rows: &[Vec<usize>], w: &LoadMatrix, gpus: usize) -> f64 {
    let per_layer: Vec<f64> = rows
        .iter()
        .enumerate()
        .map(|(l, row)| {
            let loads = gpu_loads(row, w.row(l), gpus);
            let max = loads.iter().copied().fold(0.0, f64::max);
            let mean = loads.iter().sum::<f64>() / gpus as f64;
            if mean > 0.0 {
                max / mean
            } else {
                1.0
            }
        })
        .collect();
    per_layer.iter().sum::<f64>() / per_layer.len() as f64
}

/// FNV-1a over a placement.
fn fnv(rows: &[Vec<usize>]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &e in rows.iter().flatten() {
        for b in (e as u64).to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}
