//! The per-rank report a multi-process step exchanges: this rank's losses, compute intervals,
//! messages and where its time went (blocked on receives, active, CPU), as four tensors of
//! f64s.

use dualpipe_schedule::{Chunk, Op};
use dualpipe_schedule::{ComputeInterval, MessageInterval, MessageKind};

use super::cpu::RankTime;
use super::types::MicroBatchLoss;
use crate::transport::wire::{WireData, WireError};

const LOSS_FIELDS: usize = 4;
const COMPUTE_FIELDS: usize = 9;
const MESSAGE_FIELDS: usize = 11;

fn chunk_fields(c: Chunk) -> [f64; 3] {
    [c.dir as f64, c.stage as f64, c.mb as f64]
}

fn chunk_at(v: &[f64]) -> Chunk {
    Chunk::new(v[0] as usize, v[1] as usize, v[2] as usize)
}

pub(super) fn encode_report(
    losses: &[MicroBatchLoss],
    compute: &[ComputeInterval],
    messages: &[MessageInterval],
    time: RankTime,
    comm_wait: f64,
) -> Vec<WireData> {
    let loss_values: Vec<f64> = losses
        .iter()
        .flat_map(|l| [l.dir as f64, l.mb as f64, l.global_mb as f64, l.loss])
        .collect();
    let mut compute_values = Vec::with_capacity(compute.len() * COMPUTE_FIELDS);
    for interval in compute {
        let (code, a, b) = match interval.op {
            Op::F(c) => (0.0, c, c),
            Op::B(c) => (1.0, c, c),
            Op::I(c) => (2.0, c, c),
            Op::W(c) => (3.0, c, c),
            Op::FB { f, b } => (4.0, f, b),
            // The executor records compute ops only.
            _ => continue,
        };
        compute_values.push(code);
        compute_values.extend(chunk_fields(a));
        compute_values.extend(chunk_fields(b));
        compute_values.extend([interval.start, interval.end]);
    }
    let mut message_values = Vec::with_capacity(messages.len() * MESSAGE_FIELDS);
    for m in messages {
        let kind = match m.kind {
            MessageKind::Forward => 0.0,
            MessageKind::Backward => 1.0,
        };
        message_values.extend([m.src as f64, m.dst as f64, kind]);
        message_values.extend(chunk_fields(m.src_chunk));
        message_values.extend(chunk_fields(m.dst_chunk));
        message_values.extend([m.start, m.end]);
    }
    vec![
        WireData::from_f64s(&loss_values),
        WireData::from_f64s(&compute_values),
        WireData::from_f64s(&message_values),
        WireData::from_f64s(&[
            time.message_wait_seconds,
            time.active_seconds,
            if time.cpu_measured {
                time.cpu_seconds
            } else {
                f64::NAN
            },
            comm_wait,
        ]),
    ]
}

pub(super) type Report = (
    Vec<MicroBatchLoss>,
    Vec<ComputeInterval>,
    Vec<MessageInterval>,
    RankTime,
    f64,
);

pub(super) fn decode_report(tensors: &[WireData]) -> Result<Report, WireError> {
    let [losses, compute, messages, wait] = tensors else {
        return Err(WireError(format!("{} tensors instead of 4", tensors.len())));
    };
    let (losses, compute, messages, wait) = (
        losses.to_f64s()?,
        compute.to_f64s()?,
        messages.to_f64s()?,
        wait.to_f64s()?,
    );
    let fits = |v: &[f64], n: usize| v.chunks_exact(n).remainder().is_empty();
    if !fits(&losses, LOSS_FIELDS)
        || !fits(&compute, COMPUTE_FIELDS)
        || !fits(&messages, MESSAGE_FIELDS)
        || wait.len() != 4
    {
        return Err(WireError("report fields of the wrong length".into()));
    }
    let losses = losses
        .chunks_exact(LOSS_FIELDS)
        .map(|v| MicroBatchLoss {
            dir: v[0] as usize,
            mb: v[1] as usize,
            global_mb: v[2] as usize,
            loss: v[3],
        })
        .collect();
    let compute = compute
        .chunks_exact(COMPUTE_FIELDS)
        .map(|v| {
            let (a, b) = (chunk_at(&v[1..4]), chunk_at(&v[4..7]));
            let op = match v[0] as u8 {
                0 => Op::F(a),
                1 => Op::B(a),
                2 => Op::I(a),
                3 => Op::W(a),
                _ => Op::FB { f: a, b },
            };
            ComputeInterval {
                op,
                start: v[7],
                end: v[8],
            }
        })
        .collect();
    let messages = messages
        .chunks_exact(MESSAGE_FIELDS)
        .map(|v| MessageInterval {
            src: v[0] as usize,
            dst: v[1] as usize,
            kind: if v[2] == 0.0 {
                MessageKind::Forward
            } else {
                MessageKind::Backward
            },
            src_chunk: chunk_at(&v[3..6]),
            dst_chunk: chunk_at(&v[6..9]),
            start: v[9],
            end: v[10],
        })
        .collect();
    let cpu = Some(wait[2]).filter(|c| !c.is_nan());
    Ok((
        losses,
        compute,
        messages,
        RankTime::new(wait[1], wait[0], cpu),
        wait[3],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip() {
        let c = |d, s, m| Chunk::new(d, s, m);
        let losses = vec![MicroBatchLoss {
            dir: 1,
            mb: 2,
            global_mb: 6,
            loss: 0.123456789,
        }];
        let compute = vec![
            ComputeInterval {
                op: Op::F(c(0, 1, 2)),
                start: 0.5,
                end: 0.75,
            },
            ComputeInterval {
                op: Op::FB {
                    f: c(0, 1, 3),
                    b: c(1, 2, 0),
                },
                start: 1.0,
                end: 2.0,
            },
            ComputeInterval {
                op: Op::W(c(1, 2, 0)),
                start: 2.0,
                end: 2.5,
            },
        ];
        let messages = vec![MessageInterval {
            src: 1,
            dst: 2,
            kind: MessageKind::Backward,
            src_chunk: c(0, 2, 1),
            dst_chunk: c(0, 1, 1),
            start: 0.25,
            end: 0.3,
        }];
        let time = RankTime::new(2.5, 0.01, Some(1.5));
        let wire = encode_report(&losses, &compute, &messages, time, 0.02);
        let (l, co, m, w, c) = decode_report(&wire).unwrap();
        assert_eq!((l, co, m, w, c), (losses, compute, messages, time, 0.02));
        let unmeasured = RankTime::new(2.5, 0.01, None);
        let wire2 = encode_report(&[], &[], &[], unmeasured, 0.01);
        assert_eq!(decode_report(&wire2).unwrap().3, unmeasured);
        assert!(decode_report(&wire[..3]).is_err());
    }
}
