//! A compact text timeline for terminals: one row per rank, one character per time slot.
//!
//! Letters name the op (`F`, `B`, `I`, `W`, `X` for an overlapped `F&B` pair); upper case is
//! direction 0 (or the first leg of a V), lower case the other; `.` is idle. With colour on,
//! cells get ANSI 256-colour backgrounds matching the SVG palette.

use std::fmt::Write as _;

use dualpipe_schedule::{Op, OpKind};

use crate::svg::lane;
use dualpipe_schedule::timeline::Timeline;

/// ANSI 256-colour background of an op kind in a lane.
fn ansi_bg(kind: OpKind, lane: usize) -> u8 {
    match (kind, lane % 2 == 1) {
        (OpKind::F, false) => 214,
        (OpKind::F, true) => 130,
        (OpKind::B, false) => 112,
        (OpKind::B, true) => 28,
        (OpKind::I, false) => 150,
        (OpKind::I, true) => 65,
        (OpKind::W, false) => 117,
        (OpKind::W, true) => 25,
        (OpKind::FB, false) => 183,
        (OpKind::FB, true) => 97,
        _ => 250,
    }
}

/// The letter and lane of a compute op.
fn glyph(op: &Op, ranks: usize) -> (char, usize, OpKind) {
    let (letter, chunk) = match *op {
        Op::F(c) => ('F', c),
        Op::B(c) => ('B', c),
        Op::I(c) => ('I', c),
        Op::W(c) => ('W', c),
        Op::FB { f, .. } => ('X', f),
        _ => ('?', dualpipe_schedule::Chunk::new(0, 0, 0)),
    };
    let l = lane(chunk, ranks);
    let letter = if l == 1 {
        letter.to_ascii_lowercase()
    } else {
        letter
    };
    (letter, l, op.kind())
}

/// Renders `timeline` in at most `width` columns of time slots (plus a rank label), with
/// ANSI colours when `color` is set. Slot `k` shows the op running at its midpoint.
pub fn render_ascii(timeline: &Timeline, width: usize, color: bool) -> String {
    let ranks = timeline.ranks();
    let makespan = timeline.makespan();
    let min_duration = crate::svg::shortest_op(timeline);
    let width = width.max(10);
    // One column per shortest op if that fits, else squeeze into `width`.
    let columns = if min_duration.is_finite() && makespan > 0.0 {
        ((makespan / min_duration).ceil() as usize).clamp(1, width)
    } else {
        1
    };
    let slot = if makespan > 0.0 {
        makespan / columns as f64
    } else {
        1.0
    };
    let label_w = format!("r{}", ranks.saturating_sub(1)).len();
    let mut out = String::new();
    for (r, intervals) in timeline.compute.iter().enumerate() {
        let _ = write!(out, "{:>label_w$} |", format!("r{r}"));
        let mut k = 0; // cursor into the rank's intervals (they are in start order)
        let mut current: Option<u8> = None;
        for col in 0..columns {
            let t = (col as f64 + 0.5) * slot;
            while k < intervals.len() && intervals[k].end <= t {
                k += 1;
            }
            let here = intervals.get(k).filter(|iv| iv.start <= t && t < iv.end);
            let (ch, bg) = match here {
                Some(iv) => {
                    let (ch, l, kind) = glyph(&iv.op, ranks);
                    (ch, Some(ansi_bg(kind, l)))
                }
                None => ('.', None),
            };
            if color && bg != current {
                match bg {
                    Some(code) => {
                        let fg = if code == 130
                            || code == 28
                            || code == 65
                            || code == 25
                            || code == 97
                        {
                            15
                        } else {
                            16
                        };
                        let _ = write!(out, "\x1b[38;5;{fg};48;5;{code}m");
                    }
                    None => out.push_str("\x1b[0m"),
                }
                current = bg;
            }
            out.push(ch);
        }
        if color && current.is_some() {
            out.push_str("\x1b[0m");
        }
        out.push_str("|\n");
    }
    let _ = writeln!(
        out,
        "{:>label_w$}  one column = {} time units; F forward, B backward, I input grad, W weight grad, X overlapped F&B; lower case = reverse direction / second leg; . idle",
        "",
        crate::svg::num(slot)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualpipe_schedule::timeline::ComputeInterval;
    use dualpipe_schedule::Chunk;

    fn sample() -> Timeline {
        let mut t = Timeline::new(2);
        t.compute[0] = vec![
            ComputeInterval {
                op: Op::F(Chunk::new(0, 0, 0)),
                start: 0.0,
                end: 1.0,
            },
            ComputeInterval {
                op: Op::B(Chunk::new(0, 0, 0)),
                start: 3.0,
                end: 5.0,
            },
        ];
        t.compute[1] = vec![
            ComputeInterval {
                op: Op::F(Chunk::new(1, 1, 0)),
                start: 1.0,
                end: 2.0,
            },
            ComputeInterval {
                op: Op::B(Chunk::new(1, 1, 0)),
                start: 2.0,
                end: 3.0,
            },
        ];
        t
    }

    #[test]
    fn plain_rows_show_ops_and_idle_slots() {
        let text = render_ascii(&sample(), 80, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "r0 |F..BB|");
        assert_eq!(lines[1], "r1 |.fb..|");
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn colour_adds_ansi_codes_and_resets() {
        let text = render_ascii(&sample(), 80, true);
        assert!(text.contains("\x1b[38;5;16;48;5;214mF"));
        assert!(text.lines().next().unwrap().ends_with("\x1b[0m|"));
    }

    #[test]
    fn long_timelines_fit_the_width() {
        let mut t = Timeline::new(1);
        t.compute[0] = (0..1000)
            .map(|k| ComputeInterval {
                op: Op::F(Chunk::new(0, 0, k)),
                start: k as f64,
                end: k as f64 + 1.0,
            })
            .collect();
        let text = render_ascii(&t, 50, false);
        assert_eq!(text.lines().next().unwrap().len(), "r0 |".len() + 50 + 1);
    }
}
