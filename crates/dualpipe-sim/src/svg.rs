//! SVG pictures of a timeline in the style of the DualPipe README: one row per rank, time to
//! the right, cells coloured by op kind (and darker for the second direction), micro-batch
//! numbers in the cells, overlapped `F&B` pairs framed together, a legend and a caption.

use std::fmt::Write as _;

use dualpipe_schedule::{Chunk, Op, OpKind};

use crate::metrics::Metrics;
use dualpipe_schedule::timeline::Timeline;

/// Text around the picture.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SvgOptions {
    /// A title above the rows.
    pub title: Option<String>,
    /// Caption lines below the legend (e.g. from [`caption`]).
    pub caption: Vec<String>,
}

/// Which colour shade a chunk gets: 0 for direction 0 (or the first leg of a V, or an even
/// virtual stage), 1 for the other. `ranks` is the number of ranks of the timeline.
pub fn lane(chunk: Chunk, ranks: usize) -> usize {
    (chunk.dir + chunk.stage / ranks.max(1)) % 2
}

/// The fill colour of an op kind in a lane.
pub fn color(kind: OpKind, lane: usize) -> &'static str {
    let dark = lane % 2 == 1;
    match (kind, dark) {
        (OpKind::F, false) => "#F5A623",
        (OpKind::F, true) => "#B86E00",
        (OpKind::B, false) => "#7ED321",
        (OpKind::B, true) => "#3F7F10",
        (OpKind::I, false) => "#C3EE93",
        (OpKind::I, true) => "#7DA850",
        (OpKind::W, false) => "#7CC0F8",
        (OpKind::W, true) => "#2A6CB0",
        (_, false) => "#DDDDDD",
        (_, true) => "#888888",
    }
}

/// One caption line summarising a timeline's metrics.
pub fn caption(m: &Metrics) -> String {
    format!(
        "makespan {} · max bubble per rank {} · bubble ratio {:.1}% · peak activations per rank {} · parameter copies per rank {}",
        num(m.makespan),
        num(m.bubble_max),
        100.0 * m.bubble_ratio,
        m.peak_activations,
        m.parameter_copies_per_rank.iter().copied().max().unwrap_or(0),
    )
}

/// A number with at most three decimals and no trailing zeros.
pub(crate) fn num(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const LEFT: f64 = 78.0;
const ROW: f64 = 26.0;
const RIGHT: f64 = 20.0;

/// A step of "nice" length (1, 2 or 5 times a power of ten) for about `target` ticks.
fn tick_step(span: f64, target: f64) -> f64 {
    if span <= 0.0 {
        return 1.0;
    }
    let raw = span / target;
    let pow = 10f64.powf(raw.log10().floor());
    let m = raw / pow;
    let nice = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * pow
}

/// Draws a cell with a micro-batch number.
fn cell(out: &mut String, x: f64, y: f64, w: f64, fill: &str, label: usize, dark: bool) {
    let _ = write!(
        out,
        r##"<rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{fill}" stroke="#444" stroke-width="0.5"/>"##,
        x,
        y,
        w.max(0.0),
        ROW - 4.0
    );
    let text = label.to_string();
    let size = (w / (0.62 * text.len() as f64 + 0.3)).min(13.0);
    if size >= 6.0 {
        let fg = if dark { "#FFFFFF" } else { "#000000" };
        let _ = write!(
            out,
            r#"<text x="{:.2}" y="{:.2}" font-size="{:.1}" fill="{fg}" text-anchor="middle" dominant-baseline="central">{text}</text>"#,
            x + w / 2.0,
            y + (ROW - 4.0) / 2.0,
            size
        );
    }
    out.push('\n');
}

/// The shortest compute op of `timeline` that takes any time (infinite when none does): the
/// pictures scale time so that it stays readable.
pub(crate) fn shortest_op(timeline: &Timeline) -> f64 {
    timeline
        .compute
        .iter()
        .flatten()
        .map(|i| i.end - i.start)
        .filter(|d| *d > 0.0)
        .fold(f64::INFINITY, f64::min)
}

/// Where a timeline's picture puts things: the time scale and the heights of its parts.
struct Frame {
    /// Pixels per unit of time.
    scale: f64,
    /// The plot's width (the makespan's).
    plot_w: f64,
    width: f64,
    height: f64,
    /// The first row's top.
    top: f64,
    axis_y: f64,
    legend_y: f64,
    caption_y: f64,
}

impl Frame {
    /// The frame of `timeline` under `options`: a time scale that makes the shortest op about
    /// 22 pixels wide, within 640 to 3,200 pixels for the whole makespan.
    fn of(timeline: &Timeline, options: &SvgOptions) -> Frame {
        let makespan = timeline.makespan();
        let min_duration = shortest_op(timeline);
        let mut scale = if min_duration.is_finite() {
            22.0 / min_duration
        } else {
            20.0
        };
        if makespan > 0.0 {
            scale = scale.min(3200.0 / makespan).max(640.0 / makespan);
        }
        let plot_w = makespan * scale;
        let top = if options.title.is_some() { 34.0 } else { 10.0 };
        let axis_y = top + timeline.ranks() as f64 * ROW + 4.0;
        let legend_y = axis_y + 34.0;
        let caption_y = legend_y + 34.0;
        Frame {
            scale,
            plot_w,
            width: (LEFT + plot_w + RIGHT).max(760.0),
            height: caption_y + 18.0 * options.caption.len() as f64 + 8.0,
            top,
            axis_y,
            legend_y,
            caption_y,
        }
    }
}

/// Renders `timeline` as a standalone SVG document.
pub fn render_svg(timeline: &Timeline, options: &SvgOptions) -> String {
    let frame = Frame::of(timeline, options);
    let (width, height) = (frame.width, frame.height);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(
        out,
        r##"<rect x="0" y="0" width="{width:.0}" height="{height:.0}" fill="#FFFFFF"/>"##
    );
    if let Some(title) = &options.title {
        let _ = writeln!(
            out,
            r#"<text x="{LEFT}" y="22" font-size="16" font-weight="bold">{}</text>"#,
            escape(title)
        );
    }
    write_rows(&mut out, timeline.ranks(), &frame);
    write_cells(&mut out, timeline, &frame);
    write_axis(&mut out, timeline.makespan(), &frame);
    write_legend(&mut out, frame.legend_y);
    for (k, line) in options.caption.iter().enumerate() {
        let _ = writeln!(
            out,
            r##"<text x="{LEFT}" y="{:.2}" font-size="13" fill="#222222">{}</text>"##,
            frame.caption_y + 18.0 * k as f64,
            escape(line)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The rows: each rank's label and its empty (idle) background.
fn write_rows(out: &mut String, ranks: usize, frame: &Frame) {
    let (top, plot_w) = (frame.top, frame.plot_w);
    for r in 0..ranks {
        let y = top + r as f64 * ROW;
        let _ = writeln!(
            out,
            r##"<text x="{:.0}" y="{:.2}" font-size="13" font-weight="bold" text-anchor="end" dominant-baseline="central">Rank {r}</text><rect x="{LEFT}" y="{:.2}" width="{plot_w:.2}" height="{:.2}" fill="#FFFFFF" stroke="#BBBBBB" stroke-width="0.5"/>"##,
            LEFT - 8.0,
            y + ROW / 2.0,
            y + 2.0,
            ROW - 4.0
        );
    }
}

/// The cells: one per compute op (an FB as its forward third and backward two thirds, framed).
fn write_cells(out: &mut String, timeline: &Timeline, frame: &Frame) {
    let (top, scale, ranks) = (frame.top, frame.scale, timeline.ranks());
    for (r, intervals) in timeline.compute.iter().enumerate() {
        let y = top + r as f64 * ROW + 2.0;
        for iv in intervals {
            let x = LEFT + iv.start * scale;
            let w = (iv.end - iv.start) * scale;
            match iv.op {
                Op::FB { f, b } => {
                    let wf = w / 3.0;
                    let lf = lane(f, ranks);
                    let lb = lane(b, ranks);
                    cell(out, x, y, wf, color(OpKind::F, lf), f.mb, lf == 1);
                    cell(out, x + wf, y, w - wf, color(OpKind::B, lb), b.mb, lb == 1);
                    let _ = writeln!(
                        out,
                        r##"<rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="none" stroke="#000000" stroke-width="2"/>"##,
                        x + 1.0,
                        y + 1.0,
                        (w - 2.0).max(0.0),
                        ROW - 6.0
                    );
                }
                op => {
                    if let Some(c) = op.chunk() {
                        let l = lane(c, ranks);
                        cell(out, x, y, w, color(op.kind(), l), c.mb, l == 1);
                    }
                }
            }
        }
    }
}

/// The time axis, its ticks and its label.
fn write_axis(out: &mut String, makespan: f64, frame: &Frame) {
    let (scale, plot_w, axis_y) = (frame.scale, frame.plot_w, frame.axis_y);
    let step = tick_step(makespan, (plot_w / 90.0).max(2.0));
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{axis_y:.2}" x2="{:.2}" y2="{axis_y:.2}" stroke="#000000" stroke-width="1"/>"##,
        LEFT + plot_w
    );
    let mut t = 0.0;
    while t <= makespan + 1e-9 {
        let x = LEFT + t * scale;
        let _ = writeln!(
            out,
            r##"<line x1="{x:.2}" y1="{axis_y:.2}" x2="{x:.2}" y2="{:.2}" stroke="#000000"/><text x="{x:.2}" y="{:.2}" font-size="11" text-anchor="middle">{}</text>"##,
            axis_y + 4.0,
            axis_y + 16.0,
            num(t)
        );
        t += step;
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.0}" y="{:.2}" font-size="13" font-weight="bold" text-anchor="end">Time →</text>"#,
        LEFT - 8.0,
        axis_y + 16.0
    );
}

/// The legend: the op kinds' colours, then the darker shade's meaning.
fn write_legend(out: &mut String, legend_y: f64) {
    let mut x = LEFT;
    let ly = legend_y;
    let items: [(&[&str], &str); 5] = [
        (&[color(OpKind::F, 0)], "Forward"),
        (&[color(OpKind::B, 0)], "Backward"),
        (&[color(OpKind::I, 0)], "Backward for input"),
        (&[color(OpKind::W, 0)], "Backward for weights"),
        (
            &[color(OpKind::F, 0), color(OpKind::B, 0)],
            "Overlapped forward & backward",
        ),
    ];
    for (fills, label) in items {
        for fill in fills {
            let _ = write!(
                out,
                r##"<rect x="{x:.2}" y="{ly:.2}" width="18" height="18" fill="{fill}" stroke="#444" stroke-width="0.5"/>"##
            );
            x += 18.0;
        }
        if fills.len() > 1 {
            let _ = write!(
                out,
                r##"<rect x="{:.2}" y="{:.2}" width="{}" height="16" fill="none" stroke="#000000" stroke-width="2"/>"##,
                x - 35.0,
                ly + 1.0,
                34
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.2}" y="{:.2}" font-size="13" dominant-baseline="central">{}</text>"#,
            x + 6.0,
            ly + 9.0,
            escape(label)
        );
        x += 14.0 + 7.2 * label.len() as f64;
    }
    let _ = write!(
        out,
        r##"<rect x="{x:.2}" y="{ly:.2}" width="18" height="18" fill="{}" stroke="#444" stroke-width="0.5"/>"##,
        color(OpKind::F, 1)
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.2}" y="{:.2}" font-size="13" dominant-baseline="central">darker: reverse direction, second leg of the V, odd virtual stage</text>"#,
        x + 24.0,
        ly + 9.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualpipe_schedule::timeline::ComputeInterval;

    fn sample() -> Timeline {
        let c = |dir, stage, mb| Chunk::new(dir, stage, mb);
        let mut t = Timeline::new(2);
        t.compute[0] = vec![
            ComputeInterval {
                op: Op::F(c(0, 0, 0)),
                start: 0.0,
                end: 1.0,
            },
            ComputeInterval {
                op: Op::FB {
                    f: c(0, 0, 1),
                    b: c(1, 1, 0),
                },
                start: 1.0,
                end: 3.5,
            },
        ];
        t.compute[1] = vec![ComputeInterval {
            op: Op::W(c(1, 0, 12)),
            start: 2.0,
            end: 3.0,
        }];
        t
    }

    #[test]
    fn svg_has_rows_cells_frames_legend_and_caption() {
        let svg = render_svg(
            &sample(),
            &SvgOptions {
                title: Some("a & b".into()),
                caption: vec!["makespan 3.5".into()],
            },
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("Rank 0") && svg.contains("Rank 1"));
        assert!(svg.contains("a &amp; b"));
        assert!(
            svg.contains(">12</text>"),
            "micro-batch number in the W cell"
        );
        assert!(svg.contains(r#"stroke-width="2""#), "FB pair framed");
        assert!(svg.contains("Backward for weights"));
        assert!(svg.contains("makespan 3.5"));
        assert_eq!(
            svg.matches(color(OpKind::F, 1)).count(),
            1,
            "legend swatch only"
        );
        assert_eq!(
            svg,
            render_svg(
                &sample(),
                &SvgOptions {
                    title: Some("a & b".into()),
                    caption: vec!["makespan 3.5".into()]
                }
            )
        );
    }

    #[test]
    fn lanes_follow_direction_and_v_leg() {
        assert_eq!(lane(Chunk::new(1, 2, 0), 4), 1);
        assert_eq!(lane(Chunk::new(0, 5, 0), 4), 1);
        assert_eq!(lane(Chunk::new(0, 3, 0), 4), 0);
        assert_eq!(num(2.50), "2.5");
        assert_eq!(num(3.0), "3");
        assert_eq!(tick_step(60.0, 10.0), 10.0);
    }
}
