//! The report's pictures, drawn by hand: three panels over the steps (loss and validation
//! loss; throughput; bubble ratio, simulated bubble and core contention), each with its axes,
//! tick labels and a legend.

use std::fmt::Write;

use super::RunReport;

const WIDTH: f64 = 860.0;
const PANEL: f64 = 220.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 56.0;
const GAP: f64 = 50.0;
/// At most this many points per line (longer runs are thinned evenly).
const MAX_POINTS: usize = 1200;

struct Series<'a> {
    name: &'a str,
    colour: &'a str,
    /// (step, value); values that are not finite are left out.
    points: Vec<(f64, f64)>,
    dashed: bool,
}

struct Panel<'a> {
    title: &'a str,
    unit: &'a str,
    series: Vec<Series<'a>>,
    /// A fixed y range (ratios: 0-1), else the data's.
    range: Option<(f64, f64)>,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e4 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.2e}")
    }
}

fn thin(points: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    if points.len() <= MAX_POINTS {
        return points;
    }
    let every = points.len().div_ceil(MAX_POINTS);
    let last = points.len() - 1;
    points
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % every == 0 || *i == last)
        .map(|(_, p)| p)
        .collect()
}

pub(super) fn render(report: &RunReport, title: &str) -> String {
    let r = &report.records;
    let series = |name, colour, dashed, value: &dyn Fn(&crate::StepRecord) -> Option<f64>| Series {
        name,
        colour,
        dashed,
        points: thin(
            r.iter()
                .filter_map(|s| {
                    value(s)
                        .filter(|v| v.is_finite())
                        .map(|v| (s.step as f64, v))
                })
                .collect(),
        ),
    };
    let panels = [
        Panel {
            title: "loss",
            unit: "",
            series: vec![
                series("training loss", "#1f77b4", false, &|s| Some(s.loss)),
                series("validation loss", "#d62728", false, &|s| s.validation_loss),
            ],
            range: None,
        },
        Panel {
            title: "throughput",
            unit: "tokens/s",
            series: vec![series("tokens/s", "#2ca02c", false, &|s| {
                Some(s.tokens_per_second)
            })],
            range: None,
        },
        Panel {
            title: "pipeline time",
            unit: "ratio",
            series: vec![
                series("bubble (measured)", "#ff7f0e", false, &|s| {
                    Some(s.bubble_ratio)
                }),
                series("bubble (simulated)", "#7f7f7f", true, &|s| {
                    s.bubble_ratio_simulated
                }),
                series("core contention", "#9467bd", false, &|s| {
                    Some(s.core_wait_ratio)
                }),
            ],
            range: Some((0.0, 1.0)),
        },
    ];
    let first = r.first().map_or(1.0, |s| s.step as f64);
    let last = r.last().map_or(1.0, |s| s.step as f64).max(first + 1.0);
    let height = TOP + panels.len() as f64 * (PANEL + GAP);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="24" font-size="15" font-weight="bold">{}</text>"#,
        escape(title)
    );
    for (i, panel) in panels.iter().enumerate() {
        let y0 = TOP + i as f64 * (PANEL + GAP);
        draw_panel(&mut out, panel, y0, (first, last));
    }
    out.push_str("</svg>\n");
    out
}

fn draw_panel(out: &mut String, panel: &Panel<'_>, y0: f64, (x_min, x_max): (f64, f64)) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let values = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1));
    let (mut lo, mut hi) = panel.range.unwrap_or_else(|| {
        values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        })
    });
    if !lo.is_finite() || !hi.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if hi - lo < 1e-12 {
        (lo, hi) = (lo - 0.5 * lo.abs().max(1e-3), hi + 0.5 * hi.abs().max(1e-3));
    }
    let x = |step: f64| LEFT + (step - x_min) / (x_max - x_min) * plot_w;
    let y = |v: f64| y0 + PANEL - (v - lo) / (hi - lo) * PANEL;
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{y0}" width="{plot_w}" height="{PANEL}" fill="none" stroke="#444"/>"##
    );
    let label = if panel.unit.is_empty() {
        panel.title.to_string()
    } else {
        format!("{} ({})", panel.title, panel.unit)
    };
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{}" font-weight="bold">{}</text>"#,
        y0 - 6.0,
        escape(&label)
    );
    for k in 0..=4 {
        let v = lo + (hi - lo) * k as f64 / 4.0;
        let yy = y(v);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            yy + 4.0,
            tick(v)
        );
    }
    for k in 0..=4 {
        let step = x_min + (x_max - x_min) * k as f64 / 4.0;
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x(step),
            y0 + PANEL + 16.0,
            step.round()
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">step</text>"#,
        LEFT + plot_w / 2.0,
        y0 + PANEL + 32.0
    );
    for (i, s) in panel.series.iter().enumerate() {
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        if !s.points.is_empty() {
            let mut d = String::new();
            for (step, v) in &s.points {
                let _ = write!(d, "{:.1},{:.1} ", x(*step), y(v.clamp(lo, hi)));
            }
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{}" stroke-width="1.5"{dash} points="{}"/>"#,
                s.colour,
                d.trim_end()
            );
        }
        let ly = y0 + 14.0 + i as f64 * 18.0;
        let lx = LEFT + plot_w + 12.0;
        let name = if s.points.is_empty() {
            format!("{} (none)", s.name)
        } else {
            s.name.to_string()
        };
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 20.0,
            s.colour,
            lx + 26.0,
            ly + 4.0,
            escape(&name)
        );
    }
}
