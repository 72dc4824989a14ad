//! The picture of a run: devices (rows) over time (columns), each hold coloured by its job.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::sim::simulate::Outcome;

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
    let (start, end) = outcome.held_span();
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
    // Holds narrower than a pixel are drawn a pixel per device: the job whose hold there was
    // the longest (the picture's size is then bounded by the devices and the width, not by
    // the trace: a million jobs drew 490 MB before).
    let mut cells: BTreeMap<(usize, usize), (usize, f64)> = BTreeMap::new();
    let mut wide = String::new();
    for s in &outcome.segments {
        let held = s.end_s - s.start_s;
        if held / span * WIDTH < 1.0 {
            let middle = ((s.start_s + s.end_s) / 2.0 - start) / span * WIDTH;
            let column = (middle.max(0.0) as usize).min(WIDTH as usize - 1);
            for &d in &s.devices {
                let cell = cells.entry((d, column)).or_insert((s.job, held));
                if held > cell.1 {
                    *cell = (s.job, held);
                }
            }
            continue;
        }
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
                wide,
                r#"<rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{}"><title>{}</title></rect>"#,
                x(s.start_s),
                TOP + devs[i] as f64 * row,
                x(s.end_s) - x(s.start_s),
                (k - i) as f64 * row,
                colour(s.job),
                escape(&outcome.jobs[s.job].job)
            );
            i = k;
        }
    }
    // The pixels, a run of one job's neighbouring pixels on a device as one rectangle; the
    // wide holds over them.
    let mut cells = cells.into_iter().peekable();
    while let Some(((d, column), (job, _))) = cells.next() {
        let mut end = column + 1;
        while let Some(&((d2, c2), (j2, _))) = cells.peek() {
            if (d2, c2, j2) != (d, end, job) {
                break;
            }
            end += 1;
            cells.next();
        }
        let _ = writeln!(
            out,
            r#"<rect x="{}" y="{:.2}" width="{}" height="{:.2}" fill="{}"><title>{}</title></rect>"#,
            LEFT + column as f64,
            TOP + d as f64 * row,
            end - column,
            row,
            colour(job),
            escape(&outcome.jobs[job].job)
        );
    }
    out.push_str(&wide);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::metrics::Metrics;
    use crate::sim::simulate::JobOutcome;
    use crate::sim::state::Segment;

    fn outcome(segments: Vec<Segment>, jobs: usize) -> Outcome {
        let job = |j: usize| JobOutcome {
            job: format!("j{j}"),
            arrival_s: 0.0,
            start_s: 0.0,
            finish_s: 0.0,
            overhead_s: 0.0,
            migrations: 0,
            resizes: 0,
        };
        Outcome {
            metrics: Metrics {
                jobs,
                devices: 4,
                offered_load: 0.5,
                utilization: 0.5,
                window_utilization: 0.5,
                useful_utilization: 0.5,
                mean_jct_s: 1.0,
                p95_jct_s: 1.0,
                mean_queue_s: 0.0,
                mean_queue_length: 0.0,
                fragmentation: 0.0,
                migrations: 0,
                resizes: 0,
                migration_overhead: 0.0,
                max_job_overhead: 0.0,
                makespan_s: 1000.0,
                makespan_bound_s: 1000.0,
                bound_share: 1.0,
                waiting_fragmentation: 0.0,
                middle_mean_queue_s: 0.0,
            },
            segments,
            jobs: (0..jobs).map(job).collect(),
        }
    }

    fn hold(job: usize, devices: &[usize], start_s: f64, end_s: f64) -> Segment {
        Segment {
            job,
            devices: devices.to_vec(),
            start_s,
            end_s,
        }
    }

    #[test]
    fn narrow_holds_are_drawn_a_pixel_per_device() {
        // Job 0 holds devices 0-2 for the whole run (one rectangle); 20,000 holds of 0.05 s
        // share device 3 (1,000 s over 1,200 pixels: 24 holds per pixel).
        let mut segments = vec![hold(0, &[0, 1, 2], 0.0, 1000.0)];
        for i in 0..20_000 {
            let t = i as f64 * 0.05;
            segments.push(hold(
                1 + i % 7,
                &[3],
                t,
                t + if i % 24 == 5 { 0.05 } else { 0.04 },
            ));
        }
        let svg = render_svg(&outcome(segments, 8), 4, "t");
        let rects = svg.matches("<rect").count();
        // Background, drawing area, job 0, and at most one rectangle per pixel of device 3.
        assert!(rects <= 3 + 1200, "{rects} rectangles");
        assert!(rects > 3 + 100, "{rects} rectangles");
        assert!(svg.contains(r#"width="1200.00" height="480.00" fill="hsl(0.0,65%,45%)""#));
        // A pixel shows its longest hold: the 0.05 s one of every 24 (i = 5, 29, ...).
        let first_pixel = svg
            .lines()
            .find(|l| l.contains(r#"x="70" y="520.00""#))
            .unwrap();
        assert!(first_pixel.contains("<title>j6</title>"), "{first_pixel}");
    }

    #[test]
    fn neighbouring_pixels_of_one_job_are_one_rectangle() {
        // 1,200 narrow holds of one job side by side: one rectangle across the width.
        let segments = (0..1200)
            .map(|i| hold(0, &[1], i as f64, i as f64 + 0.5))
            .chain([hold(1, &[0], 0.0, 1200.0)])
            .collect();
        let svg = render_svg(&outcome(segments, 2), 4, "t");
        assert_eq!(svg.matches("<title>j0</title>").count(), 1, "{svg}");
        assert!(svg.contains(r#"<rect x="70" y="200.00" width="1200" height="160.00""#));
    }
}
