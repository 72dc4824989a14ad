//! JSON in the golden schema.
//!
//! ```json
//! {"schedule":"dualpipe","ranks":4,"micro_batches":8,
//!  "programs":[[{"op":"F","dir":0,"stage":0,"mb":0},{"op":"SEND_F","peer":1,"dir":0,"stage":0,"mb":0},
//!              {"op":"FB","f":{"dir":0,"stage":0,"mb":3},"b":{"dir":1,"stage":3,"mb":1}},{"op":"WAIT"}, ...], ...]}
//! ```
//!
//! * `programs[r]` is rank `r`'s program in execution order; every op of the IR has a form
//!   (`F`, `B`, `I`, `W` with a chunk; `FB` with chunks `f` and `b`; `SEND_F`, `RECV_F`,
//!   `SEND_B`, `RECV_B` with a chunk and a `peer`; `WAIT` alone).
//! * A chunk is `"dir"`, `"stage"`, `"mb"`; `"dir"` is written only for schedules with two
//!   directions (DualPipe) and read as 0 when absent.
//! * `"virtual_stages"` is written only for interleaved schedules, and only when it is not 1
//!   (the other kinds imply it: 2 for dualpipev, 1 otherwise).
//! * The placement is not written: it follows from the kind ([`StagePlacement::for_kind`]).
//!
//! [`to_string`] then [`from_str`] gives back an identical [`Schedule`]; [`from_str`] also reads
//! the golden files and validates what it reads.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use crate::{validate, Chunk, Op, Schedule, ScheduleError, ScheduleKind, StagePlacement};

/// Writes `schedule` as one line of JSON in the golden schema (no trailing newline).
pub fn to_string(schedule: &Schedule) -> String {
    let with_dir = schedule.placement.dirs() > 1;
    let ops: usize = schedule.programs.iter().map(Vec::len).sum();
    let mut out = String::with_capacity(64 + ops * 48);
    let _ = write!(
        out,
        "{{\"schedule\":\"{}\",\"ranks\":{},\"micro_batches\":{}",
        schedule.kind.name(),
        schedule.ranks,
        schedule.micro_batches
    );
    if schedule.kind.fixed_virtual_stages().is_none() && schedule.virtual_stages != 1 {
        let _ = write!(out, ",\"virtual_stages\":{}", schedule.virtual_stages);
    }
    out.push_str(",\"programs\":[");
    for (r, program) in schedule.programs.iter().enumerate() {
        if r > 0 {
            out.push(',');
        }
        out.push('[');
        for (i, op) in program.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_op(&mut out, op, with_dir);
        }
        out.push(']');
    }
    out.push_str("]}");
    out
}

fn write_chunk_fields(out: &mut String, c: Chunk, with_dir: bool) {
    if with_dir {
        let _ = write!(out, "\"dir\":{},", c.dir);
    }
    let _ = write!(out, "\"stage\":{},\"mb\":{}", c.stage, c.mb);
}

fn write_op(out: &mut String, op: &Op, with_dir: bool) {
    let _ = write!(out, "{{\"op\":\"{}\"", op.kind().name());
    match *op {
        Op::Wait => {}
        Op::FB { f, b } => {
            out.push_str(",\"f\":{");
            write_chunk_fields(out, f, with_dir);
            out.push_str("},\"b\":{");
            write_chunk_fields(out, b, with_dir);
            out.push('}');
        }
        _ => {
            if let Some(peer) = op.peer() {
                let _ = write!(out, ",\"peer\":{peer}");
            }
            if let Some(c) = op.chunk() {
                out.push(',');
                write_chunk_fields(out, c, with_dir);
            }
        }
    }
    out.push('}');
}

/// Reads a schedule in the golden schema and validates it.
///
/// Errors name what is wrong and where: [`ScheduleError::Parse`] for text that is not a
/// schedule (naming the rank and op index), [`ScheduleError::Invalid`] for a schedule that
/// breaks a rule, [`ScheduleError::InvalidConfig`] for sizes no generator supports.
pub fn from_str(text: &str) -> Result<Schedule, ScheduleError> {
    let schedule = from_str_unvalidated(text)?;
    validate(&schedule)?;
    Ok(schedule)
}

/// Reads a schedule in the golden schema without validating it (for tools that want to
/// report every problem themselves, and for tests of the validator).
pub fn from_str_unvalidated(text: &str) -> Result<Schedule, ScheduleError> {
    let root: Value =
        serde_json::from_str(text).map_err(|e| parse_err(format!("not valid JSON: {e}")))?;
    let obj = root
        .as_object()
        .ok_or_else(|| parse_err("the top level must be an object with \"schedule\", \"ranks\", \"micro_batches\" and \"programs\"".into()))?;
    let kind_name = obj
        .get("schedule")
        .and_then(Value::as_str)
        .ok_or_else(|| parse_err("missing string field \"schedule\" (the schedule kind)".into()))?;
    let kind = ScheduleKind::from_name(kind_name).ok_or_else(|| {
        let names: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
        parse_err(format!(
            "unknown schedule kind \"{kind_name}\"; expected one of {}",
            names.join(", ")
        ))
    })?;
    let top_usize = |key: &str| -> Result<Option<usize>, ScheduleError> {
        match obj.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    parse_err(format!(
                        "field \"{key}\" must be a non-negative integer, got {v}"
                    ))
                }),
        }
    };
    let ranks = top_usize("ranks")?.ok_or_else(|| parse_err("missing field \"ranks\"".into()))?;
    let micro_batches = top_usize("micro_batches")?
        .ok_or_else(|| parse_err("missing field \"micro_batches\"".into()))?;
    let given = top_usize("virtual_stages")?;
    let virtual_stages = match (kind.fixed_virtual_stages(), given) {
        (_, Some(0)) => {
            return Err(parse_err(
                "field \"virtual_stages\" must be at least 1".into(),
            ));
        }
        (Some(fixed), Some(v)) if v != fixed => {
            return Err(parse_err(format!(
                "\"virtual_stages\" is {v}, but {kind} always has {fixed}; remove the field"
            )));
        }
        (Some(fixed), _) => fixed,
        (None, v) => v.unwrap_or(1),
    };
    if ranks
        .checked_mul(virtual_stages)
        .and_then(|x| x.checked_mul(2))
        .is_none_or(|x| x > text.len())
    {
        return Err(parse_err(format!(
            "{ranks} ranks x {virtual_stages} virtual stages cannot fit in a text of {} bytes",
            text.len()
        )));
    }
    let programs_value = obj
        .get("programs")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            parse_err("missing array field \"programs\" (one program per rank)".into())
        })?;
    if programs_value.len() != ranks {
        return Err(parse_err(format!(
            "\"ranks\" is {ranks} but \"programs\" holds {} programs; give one per rank",
            programs_value.len()
        )));
    }
    let mut programs = Vec::with_capacity(ranks);
    for (rank, program) in programs_value.iter().enumerate() {
        let ops = program.as_array().ok_or_else(|| {
            parse_err(format!("rank {rank}: the program must be an array of ops"))
        })?;
        let mut out = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            out.push(parse_op(op).map_err(|e| parse_err(format!("rank {rank}, op {index}: {e}")))?);
        }
        programs.push(out);
    }
    Ok(Schedule {
        kind,
        ranks,
        micro_batches,
        virtual_stages,
        placement: StagePlacement::for_kind(kind, ranks, virtual_stages),
        programs,
    })
}

fn parse_err(message: String) -> ScheduleError {
    ScheduleError::Parse(format!("JSON schedule: {message}"))
}

fn field_usize(obj: &Map<String, Value>, key: &str) -> Result<usize, String> {
    let v = obj
        .get(key)
        .ok_or_else(|| format!("missing field \"{key}\""))?;
    v.as_u64()
        .and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| format!("field \"{key}\" must be a non-negative integer, got {v}"))
}

fn parse_chunk(obj: &Map<String, Value>) -> Result<Chunk, String> {
    let dir = match obj.get("dir") {
        None => 0,
        Some(_) => field_usize(obj, "dir")?,
    };
    Ok(Chunk::new(
        dir,
        field_usize(obj, "stage")?,
        field_usize(obj, "mb")?,
    ))
}

fn parse_op(value: &Value) -> Result<Op, String> {
    let obj = value.as_object().ok_or_else(|| {
        format!("an op must be an object like {{\"op\":\"F\",\"stage\":0,\"mb\":0}}, got {value}")
    })?;
    let name = obj
        .get("op")
        .and_then(Value::as_str)
        .ok_or_else(|| "missing string field \"op\"".to_string())?;
    let sub = |key: &str| -> Result<Chunk, String> {
        let v = obj
            .get(key)
            .and_then(Value::as_object)
            .ok_or_else(|| format!("FB needs an object field \"{key}\" (a chunk)"))?;
        parse_chunk(v).map_err(|e| format!("in \"{key}\": {e}"))
    };
    let peer = || field_usize(obj, "peer");
    Ok(match name {
        "F" => Op::F(parse_chunk(obj)?),
        "B" => Op::B(parse_chunk(obj)?),
        "I" => Op::I(parse_chunk(obj)?),
        "W" => Op::W(parse_chunk(obj)?),
        "FB" => Op::FB {
            f: sub("f")?,
            b: sub("b")?,
        },
        "SEND_F" => Op::SendF {
            chunk: parse_chunk(obj)?,
            peer: peer()?,
        },
        "RECV_F" => Op::RecvF {
            chunk: parse_chunk(obj)?,
            peer: peer()?,
        },
        "SEND_B" => Op::SendB {
            chunk: parse_chunk(obj)?,
            peer: peer()?,
        },
        "RECV_B" => Op::RecvB {
            chunk: parse_chunk(obj)?,
            peer: peer()?,
        },
        "WAIT" => Op::Wait,
        other => {
            return Err(format!(
                "unknown op \"{other}\"; expected F, B, I, W, FB, SEND_F, RECV_F, SEND_B, RECV_B or WAIT"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_golden_shape() {
        let s = crate::build(ScheduleKind::GPipe, 2, 1, 1).unwrap();
        assert_eq!(
            to_string(&s),
            "{\"schedule\":\"gpipe\",\"ranks\":2,\"micro_batches\":1,\"programs\":[[\
             {\"op\":\"F\",\"stage\":0,\"mb\":0},{\"op\":\"SEND_F\",\"peer\":1,\"stage\":0,\"mb\":0},\
             {\"op\":\"RECV_B\",\"peer\":1,\"stage\":0,\"mb\":0},{\"op\":\"B\",\"stage\":0,\"mb\":0}],[\
             {\"op\":\"RECV_F\",\"peer\":0,\"stage\":1,\"mb\":0},{\"op\":\"F\",\"stage\":1,\"mb\":0},\
             {\"op\":\"B\",\"stage\":1,\"mb\":0},{\"op\":\"SEND_B\",\"peer\":0,\"stage\":1,\"mb\":0}]]}"
        );
    }

    #[test]
    fn errors_name_rank_and_op() {
        let text = "{\"schedule\":\"gpipe\",\"ranks\":1,\"micro_batches\":1,\"programs\":[[{\"op\":\"F\",\"stage\":0,\"mb\":0},{\"op\":\"X\"}]]}";
        let err = from_str(text).unwrap_err().to_string();
        assert!(err.contains("rank 0, op 1: unknown op \"X\""), "{err}");
        let text = "{\"schedule\":\"gpipe\",\"ranks\":1,\"micro_batches\":1,\"programs\":[[{\"op\":\"F\",\"stage\":0}]]}";
        let err = from_str(text).unwrap_err().to_string();
        assert!(err.contains("rank 0, op 0: missing field \"mb\""), "{err}");
        let text = "{\"schedule\":\"gpipe\",\"ranks\":1,\"micro_batches\":1,\"programs\":[[{\"op\":\"F\",\"stage\":0,\"mb\":0}]]}";
        let err = from_str(text).unwrap_err().to_string();
        assert!(err.contains("rank 0") && err.contains("backward"), "{err}");
    }
}
