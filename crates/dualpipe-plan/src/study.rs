//! The planning studies of docs/planning.md, computed from the simulator so they can be
//! regenerated (`cargo run --release -p dualpipe-plan --example plan_study -- DIR`):
//!
//! - heterogeneous: four devices of speed 1 and four of speed 0.5; the even partition in
//!   topology order against the planned partition and placement;
//! - cross-datacenter: sixteen devices, eight in each of two datacenters 200 ms apart, at 10
//!   and 100 Gbit/s; DualPipe and 1F1B with the pipeline split across the datacenters, and
//!   data parallelism across them (an eight-stage pipeline in each, half the micro-batches
//!   each, then a 1-bit compressed gradient exchange), as the micro-batch count grows.
//!   Efficiency is throughput against the same scheme in one datacenter (the wide-area link
//!   replaced by the inter-node link).

use std::fmt::Write;

use dualpipe_schedule::ScheduleKind;
use dualpipe_sim::svg::{self, SvgOptions};
use dualpipe_sim::topology::{Datacenter, Device, Link, Links, Node, Topology};

use crate::error::PlanError;
use crate::plan::{evaluate, Evaluated, PlanOptions};
use crate::profile::{LayerCost, Profile};

/// One file the study writes: a name and its contents.
pub type StudyFile = (String, String);

/// Link classes of the studies' datacenters; `wan` is the inter-datacenter link.
fn links(wan: Link) -> Links {
    Links {
        intra_node: Link {
            latency: 5e-6,
            bandwidth: 150e9,
        },
        inter_node: Link {
            latency: 2e-5,
            bandwidth: 25e9,
        },
        inter_datacenter: wan,
    }
}

fn node(name: &str, speeds: &[f64]) -> Node {
    Node {
        name: name.into(),
        devices: speeds
            .iter()
            .enumerate()
            .map(|(i, &speed)| Device {
                name: format!("gpu{i}"),
                speed,
                memory: 80e9,
            })
            .collect(),
    }
}

/// The studies' model: 32 layers of 4 ms F, I and W each, 0.5 GB of activations and 1.5 GB
/// of parameter state per layer, 32 MiB between stages.
pub fn study_profile() -> Profile {
    Profile::uniform(
        32,
        LayerCost {
            f: 0.004,
            i: 0.004,
            w: 0.004,
            activation_bytes: 0.5e9,
            parameter_bytes: 1.5e9,
            w_bytes: None,
            recompute: None,
        },
        32 << 20,
    )
}

/// Eight devices, four of speed 1 and four of speed 0.5, two nodes, one datacenter.
pub fn hetero_topology() -> Topology {
    Topology {
        links: links(Link {
            latency: 0.2,
            bandwidth: 1.25e9,
        }),
        datacenters: vec![Datacenter {
            name: "dc0".into(),
            nodes: vec![node("fast", &[1.0; 4]), node("slow", &[0.5; 4])],
        }],
    }
}

/// `datacenters` datacenters of two nodes of four devices (`nodes_per_dc` nodes each).
pub fn datacenters(datacenters: usize, nodes_per_dc: usize, wan: Link) -> Topology {
    Topology {
        links: links(wan),
        datacenters: (0..datacenters)
            .map(|d| Datacenter {
                name: format!("dc{d}"),
                nodes: (0..nodes_per_dc)
                    .map(|n| node(&format!("n{n}"), &[1.0; 4]))
                    .collect(),
            })
            .collect(),
    }
}

fn even_options(kind: ScheduleKind) -> PlanOptions {
    PlanOptions {
        kinds: vec![kind],
        even: true,
        ..PlanOptions::default()
    }
}

fn planned_options(kind: ScheduleKind) -> PlanOptions {
    PlanOptions {
        kinds: vec![kind],
        ..PlanOptions::default()
    }
}

fn picture(e: &Evaluated, title: String) -> String {
    let m = dualpipe_sim::metrics(&e.timeline, &e.schedule.placement);
    let sizes: Vec<String> = e
        .plan
        .stages
        .iter()
        .map(|s| (s.end_layer - s.first_layer).to_string())
        .collect();
    svg::render_svg(
        &e.timeline,
        &SvgOptions {
            title: Some(title),
            caption: vec![
                svg::caption(&m),
                format!("layers per stage: {}", sizes.join(" ")),
            ],
        },
    )
}

/// The heterogeneous study: a markdown table and two pictures (DualPipe even and planned).
pub fn heterogeneous() -> Result<(String, Vec<StudyFile>), PlanError> {
    let topology = hetero_topology();
    let profile = study_profile();
    let mut md = String::new();
    md.push_str("| schedule | micro-batches | even step (s) | planned step (s) | speed-up | planned layers per stage |\n");
    md.push_str("|---|---:|---:|---:|---:|---|\n");
    let mut files = Vec::new();
    for kind in [
        ScheduleKind::OneFOneB,
        ScheduleKind::DualPipe,
        ScheduleKind::DualPipeV,
    ] {
        for n in [16, 32] {
            let even = evaluate(&topology, &profile, kind, n, &even_options(kind))?;
            let planned = evaluate(&topology, &profile, kind, n, &planned_options(kind))?;
            let sizes: Vec<String> = planned
                .plan
                .stages
                .iter()
                .map(|s| (s.end_layer - s.first_layer).to_string())
                .collect();
            let _ = writeln!(
                md,
                "| {kind} | {n} | {:.3} | {:.3} | {:.2}x | {} |",
                even.plan.step_time,
                planned.plan.step_time,
                even.plan.step_time / planned.plan.step_time,
                sizes.join(" ")
            );
            if kind == ScheduleKind::DualPipe && n == 16 {
                files.push((
                    "planning-hetero-even.svg".into(),
                    picture(
                        &even,
                        "DualPipe · 4 fast + 4 slow devices · even partition".into(),
                    ),
                ));
                files.push((
                    "planning-hetero-planned.svg".into(),
                    picture(
                        &planned,
                        "DualPipe · 4 fast + 4 slow devices · planned partition".into(),
                    ),
                ));
            }
        }
    }
    Ok((md, files))
}

/// One row of the cross-datacenter study.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossRow {
    /// Inter-datacenter bandwidth, Gbit/s.
    pub gbit: f64,
    /// Micro-batches per step (over the whole job).
    pub micro_batches: usize,
    /// DualPipe split across the datacenters: efficiency.
    pub dualpipe: f64,
    /// 1F1B split across the datacenters: efficiency.
    pub one_f_one_b: f64,
    /// Data parallelism across the datacenters (DualPipe inside each), 1-bit compressed.
    pub data_parallel: f64,
}

/// Seconds of a 1-bit compressed gradient exchange between two datacenters over `link`:
/// every rank's gradients (a quarter of its parameter bytes: fp32 gradients of a 16-byte
/// mixed-precision Adam state) shrink 32-fold, all of one datacenter's ranks share the link,
/// and the exchange does not overlap the step (a conservative bound).
pub fn one_bit_exchange(profile: &Profile, link: &Link) -> f64 {
    let gradient_bytes: f64 = profile.layers.iter().map(|l| l.parameter_bytes / 4.0).sum();
    link.latency + gradient_bytes / 32.0 / link.bandwidth
}

fn step(
    topology: &Topology,
    profile: &Profile,
    kind: ScheduleKind,
    n: usize,
) -> Result<f64, PlanError> {
    Ok(evaluate(topology, profile, kind, n, &even_options(kind))?
        .plan
        .step_time)
}

/// The cross-datacenter study's rows, for each bandwidth and micro-batch count.
pub fn cross_datacenter(micro_batches: &[usize]) -> Result<Vec<CrossRow>, PlanError> {
    let profile = study_profile();
    let mut rows = Vec::new();
    for gbit in [10.0, 100.0] {
        let wan = Link {
            latency: 0.2,
            bandwidth: gbit * 1e9 / 8.0,
        };
        let lan = links(wan).inter_node;
        let split = datacenters(2, 2, wan);
        let local = datacenters(2, 2, lan);
        let half = datacenters(1, 2, wan);
        for &n in micro_batches {
            let eff = |kind| -> Result<f64, PlanError> {
                Ok(step(&local, &profile, kind, n)? / step(&split, &profile, kind, n)?)
            };
            let pipeline = step(&half, &profile, ScheduleKind::DualPipe, n / 2)?;
            let dp_far = pipeline + one_bit_exchange(&profile, &wan);
            let dp_near = pipeline + one_bit_exchange(&profile, &lan);
            rows.push(CrossRow {
                gbit,
                micro_batches: n,
                dualpipe: eff(ScheduleKind::DualPipe)?,
                one_f_one_b: eff(ScheduleKind::OneFOneB)?,
                data_parallel: dp_near / dp_far,
            });
        }
    }
    Ok(rows)
}

/// The cross-datacenter rows as a markdown table.
pub fn cross_table(rows: &[CrossRow]) -> String {
    let mut md = String::new();
    md.push_str("| Gbit/s | micro-batches | DualPipe split | 1F1B split | DP + 1-bit |\n");
    md.push_str("|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0}% | {:.0}% | {:.0}% |",
            r.gbit,
            r.micro_batches,
            100.0 * r.dualpipe,
            100.0 * r.one_f_one_b,
            100.0 * r.data_parallel
        );
    }
    md
}

/// A line chart of efficiency against micro-batches (log scale), one line per scheme and
/// bandwidth, with the 75% line.
pub fn cross_chart(rows: &[CrossRow]) -> String {
    let (w, h, left, top, bottom) = (760.0, 420.0, 60.0, 40.0, 60.0);
    let plot_w = w - left - 200.0;
    let plot_h = h - top - bottom;
    let max_n = rows
        .iter()
        .map(|r| r.micro_batches)
        .max()
        .unwrap_or(1)
        .max(2) as f64;
    let min_n = rows
        .iter()
        .map(|r| r.micro_batches)
        .min()
        .unwrap_or(1)
        .max(1) as f64;
    let span = (max_n / min_n).ln().max(1e-9);
    let x = |n: usize| left + plot_w * ((n as f64 / min_n).ln() / span);
    let y = |e: f64| top + plot_h * (1.0 - e.clamp(0.0, 1.0));
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(out, r##"<rect width="{w}" height="{h}" fill="#FFFFFF"/>"##);
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="24" font-size="16" font-weight="bold">Efficiency across two datacenters 200 ms apart</text>"#
    );
    for e in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let stroke = if e == 0.75 { "#CC0000" } else { "#DDDDDD" };
        let _ = writeln!(
            out,
            r#"<line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{stroke}"/><text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{:.0}%</text>"#,
            y(e),
            left + plot_w,
            y(e),
            left - 6.0,
            y(e) + 4.0,
            100.0 * e
        );
    }
    let mut ns: Vec<usize> = rows.iter().map(|r| r.micro_batches).collect();
    ns.sort_unstable();
    ns.dedup();
    for &n in &ns {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{n}</text>"#,
            x(n),
            top + plot_h + 18.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle">micro-batches per step</text>"#,
        left + plot_w / 2.0,
        top + plot_h + 40.0
    );
    type Series = (&'static str, &'static str, fn(&CrossRow) -> f64);
    let series: [Series; 3] = [
        ("DualPipe split", "#1F77B4", |r| r.dualpipe),
        ("1F1B split", "#FF7F0E", |r| r.one_f_one_b),
        ("DP + 1-bit", "#2CA02C", |r| r.data_parallel),
    ];
    let mut legend_y = top + 10.0;
    for gbit in [10.0, 100.0] {
        for (name, colour, value) in series {
            let points: Vec<String> = rows
                .iter()
                .filter(|r| r.gbit == gbit)
                .map(|r| format!("{:.1},{:.1}", x(r.micro_batches), y(value(r))))
                .collect();
            let dash = if gbit == 10.0 {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            let _ = writeln!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"#,
                points.join(" ")
            );
            let lx = left + plot_w + 16.0;
            let _ = writeln!(
                out,
                r#"<line x1="{lx}" y1="{legend_y}" x2="{:.1}" y2="{legend_y}" stroke="{colour}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}" font-size="12">{name}, {gbit} Gbit/s</text>"#,
                lx + 24.0,
                lx + 30.0,
                legend_y + 4.0
            );
            legend_y += 20.0;
        }
    }
    out.push_str("</svg>\n");
    out
}

/// Every study: the markdown section and the pictures.
pub fn run_all() -> Result<(String, Vec<StudyFile>), PlanError> {
    let (hetero, mut files) = heterogeneous()?;
    let rows = cross_datacenter(&[16, 32, 64, 128, 256, 512])?;
    files.push(("planning-cross-dc.svg".into(), cross_chart(&rows)));
    let mut md = String::new();
    md.push_str("## Heterogeneous devices (4 x speed 1, 4 x speed 0.5)\n\n");
    md.push_str(&hetero);
    md.push_str("\n## Two datacenters 200 ms apart\n\n");
    md.push_str(&cross_table(&rows));
    files.push(("planning-study.md".into(), md.clone()));
    Ok((md, files))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_all_gives_the_tables_and_every_picture() {
        let (md, files) = run_all().unwrap();
        assert!(md.contains("Two datacenters 200 ms apart"), "{md}");
        // 2 bandwidths x 6 micro-batch counts.
        assert_eq!(md.matches("\n| 10 |").count(), 6, "{md}");
        let names: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
        for name in [
            "planning-study.md",
            "planning-cross-dc.svg",
            "planning-hetero-even.svg",
            "planning-hetero-planned.svg",
        ] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
        assert!(files.iter().all(|(_, text)| !text.is_empty()));
    }

    #[test]
    fn the_planned_partition_beats_the_even_one_on_mixed_speeds() {
        let topology = hetero_topology();
        let profile = study_profile();
        for kind in [ScheduleKind::OneFOneB, ScheduleKind::DualPipe] {
            let even = evaluate(&topology, &profile, kind, 16, &even_options(kind)).unwrap();
            let planned = evaluate(&topology, &profile, kind, 16, &planned_options(kind)).unwrap();
            assert!(
                planned.plan.step_time < 0.9 * even.plan.step_time,
                "{kind}: planned {} vs even {}",
                planned.plan.step_time,
                even.plan.step_time
            );
        }
    }

    #[test]
    fn cross_datacenter_efficiencies_are_shares_and_data_parallelism_gains_with_micro_batches() {
        let rows = cross_datacenter(&[16, 64]).unwrap();
        assert_eq!(rows.len(), 4);
        for r in &rows {
            for e in [r.dualpipe, r.one_f_one_b, r.data_parallel] {
                assert!(e > 0.0 && e <= 1.0 + 1e-12, "{r:?}");
            }
        }
        assert!(rows[1].data_parallel > rows[0].data_parallel);
        assert!(rows[2].data_parallel > rows[0].data_parallel);
        let chart = cross_chart(&rows);
        assert_eq!(chart.matches("<polyline").count(), 6);
    }
}
