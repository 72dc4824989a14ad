//! The compute-only action CSV that torch.distributed.pipelining loads.
//!
//! One line per rank, one action per comma-separated cell, in execution order:
//!
//! | op | cell | torch action |
//! |---|---|---|
//! | `F` | `3F7` | forward of stage 3, micro-batch 7 |
//! | `B` | `3B7` | full backward |
//! | `I` | `3I7` | backward for the input gradient only |
//! | `W` | `3W7` | the deferred weight gradient |
//! | `FB` | `(0F7;7B3)OVERLAP_F_B` | the forward `0F7` overlapped with the full backward `7B3` |
//!
//! The stage in a cell is the *global* stage id and the micro-batch the *global* micro-batch:
//!
//! * single direction (gpipe, 1f1b, interleaved, zb1p, dualpipev): the stage and the micro-batch
//!   as they are (interleaved: stage `s` of `ranks x virtual_stages` runs on rank `s % ranks`;
//!   dualpipev: stage `s` of `2 x ranks` runs on rank `s` or `2 x ranks - 1 - s`);
//! * DualPipe: direction 0 stage `s` is `s`, direction 1 stage `s` is `ranks + s`; the
//!   micro-batch is `dir x micro_batches / 2 + mb` ([`Schedule::global_mb`]).
//!
//! Communication and `WAIT` are not written: torch's runtime adds its own sends and receives
//! from the stage-to-rank mapping (as [`crate::lower()`] does here).

use std::fmt::Write as _;

use crate::{generate, validate, Chunk, Op, Schedule, ScheduleError, ScheduleKind, StagePlacement};

/// The global stage id of a chunk in `schedule` (see the module documentation).
pub fn global_stage(schedule: &Schedule, chunk: Chunk) -> usize {
    chunk.dir * schedule.placement.stages() + chunk.stage
}

fn write_action(out: &mut String, schedule: &Schedule, letter: char, c: Chunk) {
    let _ = write!(
        out,
        "{}{letter}{}",
        global_stage(schedule, c),
        schedule.global_mb(c)
    );
}

/// Writes the compute ops of `schedule` as torch's compute-only CSV (one line per rank, each
/// ending in a newline). Communication and `WAIT` ops are left out.
pub fn to_string(schedule: &Schedule) -> String {
    let mut out = String::new();
    for program in &schedule.programs {
        let mut first = true;
        for op in program.iter().filter(|op| op.is_compute()) {
            if !first {
                out.push(',');
            }
            first = false;
            match *op {
                Op::F(c) => write_action(&mut out, schedule, 'F', c),
                Op::B(c) => write_action(&mut out, schedule, 'B', c),
                Op::I(c) => write_action(&mut out, schedule, 'I', c),
                Op::W(c) => write_action(&mut out, schedule, 'W', c),
                Op::FB { f, b } => {
                    out.push('(');
                    write_action(&mut out, schedule, 'F', f);
                    out.push(';');
                    write_action(&mut out, schedule, 'B', b);
                    out.push_str(")OVERLAP_F_B");
                }
                _ => {}
            }
        }
        out.push('\n');
    }
    out
}

/// One parsed cell part: (letter, global stage, global micro-batch).
type Action = (char, usize, usize);

/// Most rows (ranks) a CSV schedule may have: every rank runs at least one chunk, so no
/// schedule within [`crate::MAX_CHUNKS`] has more.
pub const MAX_ROWS: usize = crate::MAX_CHUNKS;

/// Most cells (actions, an overlapped pair counted once per comma-separated cell) a CSV
/// schedule may have: a chunk is at most three actions (`F`, `I`, `W`).
pub const MAX_ACTIONS: usize = 3 * crate::MAX_CHUNKS;

fn parse_err(message: String) -> ScheduleError {
    ScheduleError::Parse(format!("CSV schedule: {message}"))
}

fn parse_action(text: &str) -> Result<Action, String> {
    let letter_at = text.find(|ch: char| !ch.is_ascii_digit()).ok_or_else(|| {
        format!("\"{text}\" has no action letter; expected e.g. 0F3, 2B1, 5I2, 5W2")
    })?;
    let (stage, rest) = text.split_at(letter_at);
    let mut chars = rest.chars();
    let letter = chars.next().unwrap_or(' ');
    let mb = chars.as_str();
    if stage.is_empty() || mb.is_empty() || !mb.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "\"{text}\" is not STAGE LETTER MICRO-BATCH; expected e.g. 0F3, 2B1, 5I2, 5W2"
        ));
    }
    if !matches!(letter, 'F' | 'B' | 'I' | 'W') {
        return Err(format!(
            "\"{text}\": unknown action '{letter}'; a compute-only CSV holds F, B, I, W and \
             (F;B)OVERLAP_F_B"
        ));
    }
    let num = |s: &str| {
        s.parse::<usize>()
            .map_err(|_| format!("\"{text}\": number {s} is too large"))
    };
    Ok((letter, num(stage)?, num(mb)?))
}

/// A cell: one action, or an overlapped (forward; backward) pair.
enum Cell {
    One(Action),
    Pair(Action, Action),
}

fn parse_cell(cell: &str) -> Result<Cell, String> {
    if let Some(inner) = cell
        .strip_prefix('(')
        .and_then(|c| c.strip_suffix(")OVERLAP_F_B"))
    {
        let (f, b) = inner
            .split_once(';')
            .ok_or_else(|| format!("\"{cell}\": an OVERLAP_F_B cell holds two actions, (F;B)"))?;
        let (f, b) = (parse_action(f.trim())?, parse_action(b.trim())?);
        if f.0 != 'F' || b.0 != 'B' {
            return Err(format!(
                "\"{cell}\": an OVERLAP_F_B cell pairs a forward then a full backward, e.g. (0F7;7B3)OVERLAP_F_B"
            ));
        }
        return Ok(Cell::Pair(f, b));
    }
    parse_action(cell).map(Cell::One)
}

/// Reads a compute-only CSV and validates it.
///
/// `kind` names the schedule family (it fixes the placement and how global stages and
/// micro-batches decode); `None` infers it: when the programs equal those a generator makes
/// for the same sizes, that generator's kind (the first in [`ScheduleKind::ALL`] when several
/// agree); otherwise from the shape (`2 x ranks` stages in a V: dualpipev, or dualpipe when
/// stage 0 sees only half the micro-batches; more stages than ranks: interleaved; `I`/`W`
/// present: zb1p; otherwise 1f1b).
pub fn from_str(text: &str, kind: Option<ScheduleKind>) -> Result<Schedule, ScheduleError> {
    let schedule = from_str_unvalidated(text, kind)?;
    validate(&schedule)?;
    Ok(schedule)
}

/// Reads a compute-only CSV without validating it (see [`from_str`]).
pub fn from_str_unvalidated(
    text: &str,
    kind: Option<ScheduleKind>,
) -> Result<Schedule, ScheduleError> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let body = body.strip_suffix('\r').unwrap_or(body);
    if body.trim().is_empty() {
        return Err(parse_err(
            "the text holds no rows; expected one row per rank".into(),
        ));
    }
    let lines = body.split('\n').count();
    if lines > MAX_ROWS {
        return Err(parse_err(format!(
            "{lines} rows, more than the {MAX_ROWS} ranks a schedule may have (one row per rank)"
        )));
    }
    let cells = body.bytes().filter(|&b| b == b',').count() + lines;
    if cells > MAX_ACTIONS {
        return Err(parse_err(format!(
            "{cells} cells, more than the {MAX_ACTIONS} actions a schedule of at most {} chunks \
             may have",
            crate::MAX_CHUNKS
        )));
    }
    let mut rows: Vec<Vec<Cell>> = Vec::with_capacity(lines);
    for (rank, line) in body.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let mut row = Vec::new();
        for (index, cell) in line.split(',').enumerate() {
            let cell = cell.trim();
            if cell.is_empty() {
                continue;
            }
            row.push(
                parse_cell(cell)
                    .map_err(|e| parse_err(format!("rank {rank}, cell {index}: {e}")))?,
            );
        }
        rows.push(row);
    }
    let ranks = rows.len();
    let actions = || {
        {
            rows.iter().flatten().flat_map(|c| match *c {
                Cell::One(a) => [Some(a), None],
                Cell::Pair(f, b) => [Some(f), Some(b)],
            })
        }
        .flatten()
    };
    // Saturating: an id of usize::MAX is refused below, not an overflow.
    let global_stages = actions().map(|a| a.1.saturating_add(1)).max().unwrap_or(0);
    let global_mbs = actions().map(|a| a.2.saturating_add(1)).max().unwrap_or(0);
    let count = actions().count();
    if global_stages > count + 2 * ranks {
        return Err(parse_err(format!(
            "stage ids up to {} in only {count} actions over {ranks} ranks; stage ids count \
             from 0 and every stage runs on some rank",
            global_stages.saturating_sub(1),
        )));
    }
    // DualPipe's direction 1 numbers its micro-batches after direction 0's, so a partial
    // program may name ids up to twice its actions; anything beyond cannot be a schedule and
    // would make the kind inference generate one of that size.
    if global_mbs > 2 * (count + ranks) {
        return Err(parse_err(format!(
            "micro-batch ids up to {} in only {count} actions over {ranks} ranks; micro-batch \
             ids count from 0 and every micro-batch runs on some rank",
            global_mbs.saturating_sub(1),
        )));
    }
    let kind = match kind {
        Some(k) => k,
        None => infer_kind(&rows, ranks, global_stages, global_mbs),
    };
    let (dirs, virtual_stages) = match kind {
        ScheduleKind::DualPipe => (2, 1),
        ScheduleKind::DualPipeV => (1, 2),
        ScheduleKind::Interleaved => (1, global_stages.div_ceil(ranks).max(1)),
        _ => (1, 1),
    };
    let placement = StagePlacement::for_kind(kind, ranks, virtual_stages);
    let stages = placement.stages();
    let micro_batches = if dirs == 2 {
        global_mbs.div_ceil(2) * 2
    } else {
        global_mbs
    };
    let per_dir = micro_batches / dirs;
    let decode =
        |rank: usize, index: usize, (letter, g, m): Action| -> Result<Chunk, ScheduleError> {
            let dir = g / stages.max(1);
            if dir >= dirs {
                return Err(parse_err(format!(
                    "rank {rank}, cell {index}: stage {g} does not exist in {kind} over {ranks} \
                 ranks ({} global stages)",
                    stages * dirs
                )));
            }
            let mb = m.checked_sub(dir * per_dir).ok_or_else(|| {
                parse_err(format!(
                "rank {rank}, cell {index}: {g}{letter}{m} is in direction {dir}, whose global \
                 micro-batches are {} .. {}",
                dir * per_dir,
                (dir + 1) * per_dir - 1
            ))
            })?;
            Ok(Chunk::new(dir, g % stages.max(1), mb))
        };
    let mut programs = Vec::with_capacity(ranks);
    for (rank, row) in rows.iter().enumerate() {
        let mut program = Vec::with_capacity(row.len());
        for (index, cell) in row.iter().enumerate() {
            program.push(match *cell {
                Cell::One(a) => {
                    let c = decode(rank, index, a)?;
                    match a.0 {
                        'F' => Op::F(c),
                        'B' => Op::B(c),
                        'I' => Op::I(c),
                        _ => Op::W(c),
                    }
                }
                Cell::Pair(f, b) => Op::FB {
                    f: decode(rank, index, f)?,
                    b: decode(rank, index, b)?,
                },
            });
        }
        programs.push(program);
    }
    Ok(Schedule {
        kind,
        ranks,
        micro_batches,
        virtual_stages,
        placement,
        programs,
    })
}

fn infer_kind(
    rows: &[Vec<Cell>],
    ranks: usize,
    global_stages: usize,
    global_mbs: usize,
) -> ScheduleKind {
    // A generated schedule is recognised exactly.
    let ours = rows_to_text(rows);
    for k in ScheduleKind::ALL {
        let v = if k == ScheduleKind::Interleaved {
            global_stages.div_ceil(ranks.max(1)).max(1)
        } else {
            1
        };
        let micro_batches = if k == ScheduleKind::DualPipe {
            global_mbs.div_ceil(2) * 2
        } else {
            global_mbs
        };
        if let Ok(s) = generate(k, ranks, micro_batches, v) {
            if to_string(&s) == ours {
                return k;
            }
        }
    }
    // Otherwise, from the shape.
    let has = |letter: char| {
        rows.iter().flatten().any(|c| match *c {
            Cell::One(a) => a.0 == letter,
            Cell::Pair(..) => false,
        })
    };
    let on_rank = |stage: usize| {
        rows.iter().position(|row| {
            row.iter().any(|c| match *c {
                Cell::One(a) => a.1 == stage,
                Cell::Pair(f, b) => f.1 == stage || b.1 == stage,
            })
        })
    };
    if ranks > 1 && global_stages == 2 * ranks && on_rank(ranks) == Some(ranks - 1) {
        let stage0_forwards = rows
            .iter()
            .flatten()
            .filter(|c| match **c {
                Cell::One(a) => a.0 == 'F' && a.1 == 0,
                Cell::Pair(f, _) => f.1 == 0,
            })
            .count();
        return if stage0_forwards * 2 <= global_mbs {
            ScheduleKind::DualPipe
        } else {
            ScheduleKind::DualPipeV
        };
    }
    if global_stages > ranks {
        ScheduleKind::Interleaved
    } else if has('I') || has('W') {
        ScheduleKind::Zb1p
    } else {
        ScheduleKind::OneFOneB
    }
}

/// The rows written back in canonical form, to compare with a generated schedule's CSV.
fn rows_to_text(rows: &[Vec<Cell>]) -> String {
    let mut out = String::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            match *cell {
                Cell::One((l, s, m)) => {
                    let _ = write!(out, "{s}{l}{m}");
                }
                Cell::Pair((_, fs, fm), (_, bs, bm)) => {
                    let _ = write!(out, "({fs}F{fm};{bs}B{bm})OVERLAP_F_B");
                }
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_cells_past_the_caps_are_refused_before_parsing() {
        let rows = "0F0\n".repeat(MAX_ROWS + 1);
        let err = from_str(&rows, None).unwrap_err().to_string();
        assert!(err.contains("ranks a schedule may have"), "{err}");
        let wide = "0F0,".repeat(MAX_ACTIONS + 1);
        let err = from_str(&wide, None).unwrap_err().to_string();
        assert!(err.contains("actions a schedule"), "{err}");
    }

    #[test]
    fn cells() {
        let s = generate(ScheduleKind::GPipe, 2, 2, 1).unwrap();
        assert_eq!(to_string(&s), "0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n");
        let err = from_str("0F0,0X1\n", None).unwrap_err().to_string();
        assert!(
            err.contains("rank 0, cell 1") && err.contains("unknown action 'X'"),
            "{err}"
        );
        let err = from_str("0F0,(0F1)OVERLAP_F_B\n", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("rank 0, cell 1"), "{err}");
    }

    #[test]
    fn dualpipe_encoding() {
        let s = Schedule {
            kind: ScheduleKind::DualPipe,
            ranks: 2,
            micro_batches: 4,
            virtual_stages: 1,
            placement: StagePlacement::for_kind(ScheduleKind::DualPipe, 2, 1),
            programs: vec![
                vec![Op::FB {
                    f: Chunk::new(0, 0, 1),
                    b: Chunk::new(1, 1, 0),
                }],
                vec![],
            ],
        };
        assert_eq!(to_string(&s), "(0F1;3B2)OVERLAP_F_B\n\n");
        let back = from_str_unvalidated(&to_string(&s), Some(ScheduleKind::DualPipe)).unwrap();
        assert_eq!(back.programs, s.programs);
    }
}
