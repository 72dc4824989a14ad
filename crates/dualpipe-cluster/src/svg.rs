//! The picture of a run: devices (rows) over time (columns), each hold coloured by its job.

use std::fmt::Write;

use crate::simulate::Outcome;

/// Width of the drawing area, in pixels.
const WIDTH: f64 = 1200.0;
/// Height of the drawing area, in pixels (at least one pixel per device).
const HEIGHT: f64 = 640.0;
/// Margins: left (device labels), top (title), bottom (time axis and caption).
const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

/// A stable colour for job `j` (hue by the golden angle).
fn colour(j: usize) -> String {
    let hue = (j as f64 * 137.508) % 360.0;
    let light = 45 + (j % 3) * 10;
    format!("hsl({hue:.1},65%,{light}%)")
}

/// Draws `outcome` on `devices` devices, with `title` and a caption of its metrics.
pub fn render_svg(outcome: &Outcome, devices: usize, title: &str) -> String {
    let end = outcome
        .segments
        .iter()
        .map(|s| s.end_s)
        .fold(0.0f64, f64::max);
    let start = outcome
        .segments
        .iter()
        .map(|s| s.start_s)
        .fold(end, f64::min);
    let span = (end - start).max(1e-9);
    let row = (HEIGHT / devices as f64).max(1.0);
    let height = row * devices as f64;
    let x = |t: f64| LEFT + (t - start) / span * WIDTH;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{:.0}" height="{:.0}" font-family="sans-serif" font-size="12">"#,
        LEFT + WIDTH + 20.0,
        TOP + height + BOTTOM
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="24" font-size="15">{}</text>"#,
        escape(title)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{WIDTH}" height="{height:.1}" fill="#eee"/>"##
    );
    for s in &outcome.segments {
        let mut devs = s.devices.clone();
        devs.sort_unstable();
        // One rectangle per run of consecutive devices.
        let mut i = 0;
        while i < devs.len() {
            let mut k = i + 1;
            while k < devs.len() && devs[k] == devs[k - 1] + 1 {
                k += 1;
            }
            let _ = writeln!(
                out,
                r#"<rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{}"><title>{}</title></rect>"#,
                x(s.start_s),
                TOP + devs[i] as f64 * row,
                (x(s.end_s) - x(s.start_s)).max(0.3),
                (k - i) as f64 * row,
                colour(s.job),
                escape(&outcome.jobs[s.job].job)
            );
            i = k;
        }
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="end">device 0</text>"#,
        LEFT - 6.0,
        TOP + 10.0
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
        LEFT - 6.0,
        TOP + height,
        devices - 1
    );
    for tick in 0..=4 {
        let t = start + span * tick as f64 / 4.0;
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{:.1} h</text>"#,
            x(t),
            TOP + height + 16.0,
            (t - start) / 3600.0
        );
    }
    let m = &outcome.metrics;
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{:.1}">utilisation {:.1}% · mean JCT {:.2} h · p95 JCT {:.2} h · fragmentation {:.1}% · migrations {} · resizes {} · move overhead {:.2}%</text>"#,
        TOP + height + 40.0,
        100.0 * m.utilization,
        m.mean_jct_s / 3600.0,
        m.p95_jct_s / 3600.0,
        100.0 * m.fragmentation,
        m.migrations,
        m.resizes,
        100.0 * m.migration_overhead
    );
    out.push_str("</svg>\n");
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
