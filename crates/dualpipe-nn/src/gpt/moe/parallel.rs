//! Expert parallelism over a data-parallel group: the [`ExpertPlacement`] (which workers
//! serve each logical expert, with a version), the [`ExpertLink`] the group's all-to-alls go
//! over (and [`ChannelExpertLink`], its in-process form), and the dispatch / combine
//! arithmetic of [`MoeLayer`](super::MoeLayer) when it serves only its placed experts.
//!
//! A worker's tokens reach the workers serving their experts by one all-to-all (dispatch) and
//! the experts' outputs come back by a second (combine); the backward does the same with the
//! gated output gradients. Rows of an expert with several replicas are split among them by a
//! fixed rule ([`ExpertPlacement::replica_of`]), and every sum runs in expert order, then
//! source order: the results do not depend on timing.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use dualpipe_schedule::Chunk;

use crate::error::NnError;

/// Which workers of a data-parallel group serve each logical expert of one MoE layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertPlacement {
    /// The step the placement took effect (0: the initial one); messages carry it.
    pub version: u64,
    /// Workers of the group.
    pub workers: usize,
    /// Per logical expert: the workers holding a replica of it, ascending, at least one.
    pub replicas: Vec<Vec<usize>>,
}

impl ExpertPlacement {
    /// `experts` logical experts in contiguous runs over `workers` workers (expert `j` on
    /// worker `j · workers / experts`: `E / D` each when `D` divides `E`), one replica each.
    pub fn contiguous(experts: usize, workers: usize) -> Self {
        let workers = workers.max(1);
        ExpertPlacement {
            version: 0,
            workers,
            replicas: (0..experts)
                .map(|j| vec![j * workers / experts.max(1)])
                .collect(),
        }
    }

    /// Checks the placement against the layer: `experts` entries, every worker in range,
    /// every expert with at least one replica, no worker twice for one expert.
    pub fn check(&self, experts: usize) -> Result<(), NnError> {
        if self.replicas.len() != experts {
            return Err(NnError::Config(format!(
                "an expert placement for {} experts given to a layer of {experts}",
                self.replicas.len()
            )));
        }
        for (j, r) in self.replicas.iter().enumerate() {
            if r.is_empty()
                || r.iter().any(|&w| w >= self.workers)
                || r.windows(2).any(|p| p[0] >= p[1])
            {
                return Err(NnError::Config(format!(
                    "expert {j}: replicas on workers {r:?} of {}; give ascending workers below {}",
                    self.workers, self.workers
                )));
            }
        }
        Ok(())
    }

    /// The worker that serves the `i`-th row (0-based, ascending token order) that worker
    /// `source` routes to expert `j`: the replicas take turns, starting at `source`'s turn.
    pub fn replica_of(&self, j: usize, source: usize, i: usize) -> usize {
        let r = &self.replicas[j];
        r[(i + source) % r.len()]
    }

    /// Whether `worker` holds a replica of expert `j`.
    pub fn serves(&self, worker: usize, j: usize) -> bool {
        self.replicas[j].contains(&worker)
    }
}

/// Which of a chunk's four all-to-alls a message belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Tokens to their experts' workers (forward).
    Dispatch,
    /// Expert outputs back to the tokens' workers (forward).
    Combine,
    /// Gated output gradients to the experts' workers (input backward).
    GradDispatch,
    /// Input gradients back to the tokens' workers (input backward).
    GradCombine,
}

/// The stamp of one all-to-all: the chunk, the phase, and the placement version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExchangeTag {
    /// The chunk whose rows travel.
    pub chunk: Chunk,
    /// Which all-to-all of the chunk.
    pub phase: Phase,
    /// The placement's version (the step it took effect).
    pub version: u64,
}

/// One worker's end of a group's all-to-all. Every worker of the group calls
/// [`ExpertLink::all_to_all`] in the same order (the schedule's order of the layer's ops).
pub trait ExpertLink: Send + std::fmt::Debug {
    /// This worker's index in the group.
    fn worker(&self) -> usize;
    /// Workers of the group.
    fn workers(&self) -> usize;
    /// Sends `parts[w]` to worker `w` (this worker's own part stays) and returns what every
    /// worker sent this one, in worker order. A message stamped with an older placement
    /// version than `tag`'s is refused.
    fn all_to_all(
        &mut self,
        tag: ExchangeTag,
        parts: Vec<Vec<f64>>,
    ) -> Result<Vec<Vec<f64>>, NnError>;
}

#[derive(Debug)]
struct Message {
    from: usize,
    seq: u64,
    tag: ExchangeTag,
    body: Vec<f64>,
}

/// An in-process [`ExpertLink`] over channels (threads of one process).
#[derive(Debug)]
pub struct ChannelExpertLink {
    worker: usize,
    peers: Vec<Sender<Message>>,
    inbox: Receiver<Message>,
    early: HashMap<(u64, usize), Message>,
    seq: u64,
    timeout: Duration,
}

impl ChannelExpertLink {
    /// The `workers` ends of one group, worker `w` at index `w`; a receive waits at most
    /// `timeout`.
    pub fn group(workers: usize, timeout: Duration) -> Vec<ChannelExpertLink> {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..workers).map(|_| channel()).unzip();
        receivers
            .into_iter()
            .enumerate()
            .map(|(worker, inbox)| ChannelExpertLink {
                worker,
                peers: senders.clone(),
                inbox,
                early: HashMap::new(),
                seq: 0,
                timeout,
            })
            .collect()
    }
}

impl ExpertLink for ChannelExpertLink {
    fn worker(&self) -> usize {
        self.worker
    }

    fn workers(&self) -> usize {
        self.peers.len()
    }

    fn all_to_all(
        &mut self,
        tag: ExchangeTag,
        parts: Vec<Vec<f64>>,
    ) -> Result<Vec<Vec<f64>>, NnError> {
        let n = self.peers.len();
        if parts.len() != n {
            return Err(NnError::Execution(format!(
                "an all-to-all of {} parts over {n} workers",
                parts.len()
            )));
        }
        let seq = self.seq;
        self.seq += 1;
        let mut got: Vec<Option<Vec<f64>>> = vec![None; n];
        for (w, body) in parts.into_iter().enumerate() {
            if w == self.worker {
                got[w] = Some(body);
            } else {
                let msg = Message {
                    from: self.worker,
                    seq,
                    tag,
                    body,
                };
                self.peers[w].send(msg).map_err(|_| {
                    NnError::Execution(format!("expert all-to-all: worker {w} has gone"))
                })?;
            }
        }
        let deadline = Instant::now() + self.timeout;
        let mut buffered: Vec<Message> = (0..n)
            .filter_map(|w| self.early.remove(&(seq, w)))
            .collect();
        while got.iter().any(Option::is_none) {
            let pending = (0..n).find(|&w| got[w].is_none()).unwrap_or(0);
            let msg = match buffered.pop() {
                Some(m) => m,
                None => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.inbox.recv_timeout(left) {
                        Ok(m) => m,
                        Err(RecvTimeoutError::Timeout) => {
                            return Err(NnError::Execution(format!(
                                "expert all-to-all {:?} of {}: worker {pending} sent nothing in \
                                 {:.0} s (a peer failed or stalled)",
                                tag.phase,
                                tag.chunk,
                                self.timeout.as_secs_f64()
                            )))
                        }
                        Err(RecvTimeoutError::Disconnected) => {
                            return Err(NnError::Execution(
                                "expert all-to-all: every peer has gone".into(),
                            ))
                        }
                    }
                }
            };
            if msg.tag.version < tag.version {
                return Err(NnError::Execution(format!(
                    "expert all-to-all: worker {} sent rows for placement version {} to \
                     version {}; refused as stale",
                    msg.from, msg.tag.version, tag.version
                )));
            }
            if msg.seq != seq {
                self.early.insert((msg.seq, msg.from), msg);
                continue;
            }
            if msg.tag != tag {
                return Err(NnError::Execution(format!(
                    "expert all-to-all: worker {} is at {:?} of {} (version {}), this worker at \
                     {:?} of {} (version {})",
                    msg.from,
                    msg.tag.phase,
                    msg.tag.chunk,
                    msg.tag.version,
                    tag.phase,
                    tag.chunk,
                    tag.version
                )));
            }
            got[msg.from] = Some(msg.body);
        }
        Ok(got.into_iter().map(Option::unwrap_or_default).collect())
    }
}

/// Per source worker, per logical expert: how many rows it sent this worker.
pub(crate) type RowCounts = Vec<Vec<usize>>;

/// Per source worker, per logical expert: the rows it sent this worker, flattened.
pub(crate) type SourceRows = Vec<Vec<Vec<f64>>>;

/// The rows of one all-to-all, split by destination: `counts[w][j]` rows of expert `j` for
/// worker `w` (in ascending order of the expert's rows), and each part's payload (a header
/// of the `E` counts, then the rows).
pub(crate) fn split_rows(
    placement: &ExpertPlacement,
    me: usize,
    rows_per_expert: &[Vec<f64>],
    width: usize,
) -> Vec<Vec<f64>> {
    let e = placement.replicas.len();
    let mut parts: Vec<Vec<f64>> = (0..placement.workers).map(|_| vec![0.0; e]).collect();
    for (j, data) in rows_per_expert.iter().enumerate() {
        for (i, row) in data.chunks(width.max(1)).enumerate() {
            let w = placement.replica_of(j, me, i);
            parts[w][j] += 1.0;
            parts[w].extend_from_slice(row);
        }
    }
    parts
}

/// Reads received parts: per source its counts and, per expert, its rows (flattened).
pub(crate) fn read_parts(
    parts: &[Vec<f64>],
    experts: usize,
    width: usize,
) -> Result<(RowCounts, SourceRows), NnError> {
    let mut counts = Vec::with_capacity(parts.len());
    let mut rows = Vec::with_capacity(parts.len());
    for (s, p) in parts.iter().enumerate() {
        if p.len() < experts {
            return Err(NnError::Execution(format!(
                "expert all-to-all: worker {s} sent {} values, less than the {experts} counts",
                p.len()
            )));
        }
        let c: Vec<usize> = p[..experts].iter().map(|&v| v as usize).collect();
        let total: usize = c.iter().sum();
        if total
            .checked_mul(width)
            .and_then(|n| n.checked_add(experts))
            != Some(p.len())
        {
            return Err(NnError::Execution(format!(
                "expert all-to-all: worker {s} sent {} values for {total} rows of width {width}",
                p.len() - experts
            )));
        }
        let mut at = experts;
        let per: Vec<Vec<f64>> = c
            .iter()
            .map(|&n| {
                let v = p[at..at + n * width].to_vec();
                at += n * width;
                v
            })
            .collect();
        counts.push(c);
        rows.push(per);
    }
    Ok((counts, rows))
}

/// Puts each expert's rows back in ascending order from the replies (`back[w]`: the rows this
/// worker sent `w`, expert after expert, each `width` wide).
pub(crate) fn merge_replies(
    placement: &ExpertPlacement,
    me: usize,
    rows: &[usize],
    back: &[Vec<f64>],
    width: usize,
) -> Result<Vec<Vec<f64>>, NnError> {
    let mut at = vec![0usize; back.len()];
    let mut out = Vec::with_capacity(rows.len());
    for (j, &n) in rows.iter().enumerate() {
        let mut v = Vec::with_capacity(n * width);
        for i in 0..n {
            let w = placement.replica_of(j, me, i);
            let row = back[w].get(at[w]..at[w] + width).ok_or_else(|| {
                NnError::Execution(format!(
                    "expert all-to-all: worker {w} returned fewer rows than it was sent"
                ))
            })?;
            v.extend_from_slice(row);
            at[w] += width;
        }
        out.push(v);
    }
    if at.iter().zip(back).any(|(&a, b)| a != b.len()) {
        return Err(NnError::Execution(
            "expert all-to-all: a worker returned more rows than it was sent".into(),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_take_turns_and_rows_come_back_in_order() {
        let p = ExpertPlacement {
            version: 3,
            workers: 2,
            replicas: vec![vec![0, 1], vec![1]],
        };
        p.check(2).unwrap();
        assert_eq!(
            (0..4).map(|i| p.replica_of(0, 1, i)).collect::<Vec<_>>(),
            vec![1, 0, 1, 0]
        );
        let rows = vec![vec![1.0, 2.0, 3.0], vec![4.0]];
        let parts = split_rows(&p, 0, &rows, 1);
        assert_eq!(parts[0], vec![2.0, 0.0, 1.0, 3.0]);
        assert_eq!(parts[1], vec![1.0, 1.0, 2.0, 4.0]);
        let (counts, got) = read_parts(&parts, 2, 1).unwrap();
        assert_eq!(counts, vec![vec![2, 0], vec![1, 1]]);
        // Each worker echoes its rows (expert after expert), times ten.
        let back: Vec<Vec<f64>> = got
            .iter()
            .map(|per| per.iter().flatten().map(|v| v * 10.0).collect())
            .collect();
        let merged = merge_replies(&p, 0, &[3, 1], &back, 1).unwrap();
        assert_eq!(merged, vec![vec![10.0, 20.0, 30.0], vec![40.0]]);
        assert!(ExpertPlacement {
            replicas: vec![vec![1, 0], vec![1]],
            ..p.clone()
        }
        .check(2)
        .is_err());
    }

    #[test]
    fn a_stale_version_is_refused() {
        let mut links = ChannelExpertLink::group(2, Duration::from_secs(5));
        let mut b = links.pop().unwrap();
        let mut a = links.pop().unwrap();
        let tag = |version| ExchangeTag {
            chunk: Chunk::new(0, 0, 0),
            phase: Phase::Dispatch,
            version,
        };
        let t = std::thread::spawn(move || b.all_to_all(tag(1), vec![vec![1.0], vec![]]));
        let err = a.all_to_all(tag(2), vec![vec![], vec![2.0]]).unwrap_err();
        assert!(err.to_string().contains("stale"), "{err}");
        assert!(
            t.join().unwrap().is_err(),
            "the other side sees the mismatch"
        );
    }
}
