//! Chrome / Perfetto trace JSON of a timeline.
//!
//! Each rank is a process with two threads: `compute` (tid 0) and `comm` (tid 1). Compute ops
//! are complete events (`"ph": "X"`); every message appears as a `SEND_*` slice on the sender's
//! comm track and a `RECV_*` slice on the receiver's comm track, both spanning the message's
//! flight, joined by a flow arrow (`"ph": "s"` / `"ph": "f"`, bound to the enclosing slices). Times are microseconds
//! (timeline seconds x 1e6). Open the file in <https://ui.perfetto.dev> or `chrome://tracing`.

use dualpipe_schedule::{Chunk, Op};
use serde_json::{json, Value};

use dualpipe_schedule::timeline::{MessageKind, Timeline};

const COMPUTE_TID: usize = 0;
const COMM_TID: usize = 1;

fn us(seconds: f64) -> f64 {
    seconds * 1e6
}

fn chunk_args(c: Chunk) -> Value {
    json!({"dir": c.dir, "stage": c.stage, "mb": c.mb})
}

fn op_event(rank: usize, op: &Op, start: f64, end: f64) -> Value {
    let (name, args) = match *op {
        Op::FB { f, b } => (
            format!("FB f{} b{}", f.mb, b.mb),
            json!({"f": chunk_args(f), "b": chunk_args(b)}),
        ),
        _ => {
            let c = op.chunk().unwrap_or(Chunk::new(0, 0, 0));
            (format!("{} {}", op.kind(), c.mb), chunk_args(c))
        }
    };
    json!({
        "name": name, "cat": op.kind().name(), "ph": "X",
        "pid": rank, "tid": COMPUTE_TID,
        "ts": us(start), "dur": us(end - start), "args": args,
    })
}

/// Appends one event to the `traceEvents` array being written.
fn push_event(out: &mut String, first: &mut bool, event: &Value) {
    if !*first {
        out.push(',');
    }
    *first = false;
    out.push_str(&event.to_string());
}

/// Renders `timeline` as Chrome trace-event JSON (`{"displayTimeUnit": "ms", "traceEvents":
/// [...]}`, one line). Events are written one at a time, so memory stays near the size of the
/// text.
pub fn render_trace(timeline: &Timeline) -> String {
    let ops: usize = timeline.compute.iter().map(Vec::len).sum();
    let mut text = String::with_capacity(256 * (ops + 4 * timeline.messages.len()) + 64);
    text.push_str("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
    let mut first = true;
    let out = &mut text;
    for rank in 0..timeline.ranks() {
        push_event(
            out,
            &mut first,
            &json!({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": format!("rank {rank}")}}),
        );
        push_event(
            out,
            &mut first,
            &json!({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}}),
        );
        push_event(
            out,
            &mut first,
            &json!({"name": "thread_name", "ph": "M", "pid": rank, "tid": COMPUTE_TID, "args": {"name": "compute"}}),
        );
        push_event(
            out,
            &mut first,
            &json!({"name": "thread_name", "ph": "M", "pid": rank, "tid": COMM_TID, "args": {"name": "comm"}}),
        );
    }
    for (rank, intervals) in timeline.compute.iter().enumerate() {
        for iv in intervals {
            push_event(out, &mut first, &op_event(rank, &iv.op, iv.start, iv.end));
        }
    }
    for (id, m) in timeline.messages.iter().enumerate() {
        let (send, recv) = match m.kind {
            MessageKind::Forward => ("SEND_F", "RECV_F"),
            MessageKind::Backward => ("SEND_B", "RECV_B"),
        };
        let args = json!({"src": m.src, "dst": m.dst, "src_chunk": chunk_args(m.src_chunk), "dst_chunk": chunk_args(m.dst_chunk)});
        let (ts, dur) = (us(m.start), us(m.end - m.start));
        push_event(
            out,
            &mut first,
            &json!({
                "name": format!("{send} {} to rank {}", m.src_chunk.mb, m.dst), "cat": "comm", "ph": "X",
                "pid": m.src, "tid": COMM_TID, "ts": ts, "dur": dur, "args": args,
            }),
        );
        push_event(
            out,
            &mut first,
            &json!({
                "name": format!("{recv} {} from rank {}", m.dst_chunk.mb, m.src), "cat": "comm", "ph": "X",
                "pid": m.dst, "tid": COMM_TID, "ts": ts, "dur": dur, "args": args,
            }),
        );
        // Flow ends sit strictly inside their slices (near the send's start and the receive's
        // end) so that viewers bind them to the enclosing slice whatever order they sort equal
        // timestamps in, and the arrow slants with the flight time.
        let (out_ts, in_ts) = (ts + 0.1 * dur, ts + 0.9 * dur);
        push_event(
            out,
            &mut first,
            &json!({"name": "message", "cat": "comm", "ph": "s", "id": id, "pid": m.src, "tid": COMM_TID, "ts": out_ts, "bp": "e"}),
        );
        push_event(
            out,
            &mut first,
            &json!({"name": "message", "cat": "comm", "ph": "f", "id": id, "pid": m.dst, "tid": COMM_TID, "ts": in_ts, "bp": "e"}),
        );
    }
    text.push_str("]}\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualpipe_schedule::timeline::{ComputeInterval, MessageInterval};

    #[test]
    fn trace_has_tracks_slices_and_flows() {
        let c0 = Chunk::new(0, 0, 3);
        let c1 = Chunk::new(0, 1, 3);
        let mut t = Timeline::new(2);
        t.compute[0].push(ComputeInterval {
            op: Op::F(c0),
            start: 0.0,
            end: 0.001,
        });
        t.compute[1].push(ComputeInterval {
            op: Op::F(c1),
            start: 0.002,
            end: 0.003,
        });
        t.messages.push(MessageInterval {
            src: 0,
            dst: 1,
            kind: MessageKind::Forward,
            src_chunk: c0,
            dst_chunk: c1,
            start: 0.001,
            end: 0.0015,
        });
        let v: Value = serde_json::from_str(&render_trace(&t)).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let by_ph = |ph: &str| events.iter().filter(|e| e["ph"] == ph).count();
        assert_eq!(by_ph("M"), 8);
        assert_eq!(by_ph("X"), 4);
        assert_eq!(by_ph("s"), 1);
        assert_eq!(by_ph("f"), 1);
        let f = events
            .iter()
            .find(|e| e["name"] == "F 3" && e["pid"] == 1)
            .unwrap();
        assert_eq!(f["ts"].as_f64().unwrap(), 2000.0);
        assert!((f["dur"].as_f64().unwrap() - 1000.0).abs() < 1e-9);
        let send = events
            .iter()
            .find(|e| e["ph"] == "X" && e["tid"] == 1 && e["pid"] == 0)
            .unwrap();
        assert!((send["dur"].as_f64().unwrap() - 500.0).abs() < 1e-9);
        let flow = |ph: &str| {
            events.iter().find(|e| e["ph"] == ph).unwrap()["ts"]
                .as_f64()
                .unwrap()
        };
        assert!((flow("s") - 1050.0).abs() < 1e-6 && (flow("f") - 1450.0).abs() < 1e-6);
    }
}
