//! Expert parallelism over a data-parallel group: the [`ExpertPlacement`] (which workers
//! serve each logical expert, with a version), the [`ExpertLink`] the group's all-to-alls go
//! over (and [`ChannelExpertLink`], its in-process form, with an optional [`LinkModel`]
//! emulating a slower link), and the dispatch / combine arithmetic of
//! [`MoeLayer`](crate::layers::MoeLayer) when it serves only its placed experts.
//!
//! A worker's tokens reach the workers serving their experts by one all-to-all (dispatch) and
//! the experts' outputs come back by a second (combine); the backward does the same with the
//! gated output gradients. Rows of an expert with several replicas are split among them by a
//! fixed rule ([`ExpertPlacement::replica_of`]), and every sum runs in expert order, then
//! source order: the results do not depend on timing.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dualpipe_schedule::Chunk;

use super::overlap::{holds_token, while_waiting};
use super::waits::{self, WaitKind};
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

/// An emulated link for expert traffic: a message becomes visible to its receiver
/// `latency + bytes / bandwidth` seconds after it was sent (bytes: 8 per value, as carried).
/// The receiver checks the delivery time, so the sender never blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkModel {
    /// Seconds every message takes on top of its bytes (0: none).
    pub latency: f64,
    /// Bytes per second (`None`: the bytes cost nothing).
    pub bandwidth: Option<f64>,
}

impl LinkModel {
    /// No emulation: a message is visible as soon as it arrives.
    pub const NONE: LinkModel = LinkModel {
        latency: 0.0,
        bandwidth: None,
    };

    /// Seconds a message of `values` values takes: `latency + 8 · values / bandwidth`.
    pub fn delay(&self, values: usize) -> f64 {
        let bytes = (values * std::mem::size_of::<f64>()) as f64;
        self.latency + self.bandwidth.map_or(0.0, |bw| bytes / bw)
    }

    /// Whether this is no emulation at all.
    pub fn is_none(&self) -> bool {
        *self == LinkModel::NONE
    }
}

/// The clock an emulated link stamps and checks delivery times with (seconds).
pub trait LinkClock: Send + Sync + std::fmt::Debug {
    /// Now, in seconds since some fixed origin shared by the group.
    fn now(&self) -> f64;
    /// Returns at `time` or later.
    fn wait_until(&self, time: f64);
}

/// Wall-clock time since the group was made; waiting is sleeping.
#[derive(Debug)]
pub struct WallClock(Instant);

impl WallClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        WallClock(Instant::now())
    }
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock::new()
    }
}

impl LinkClock for WallClock {
    fn now(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }

    fn wait_until(&self, time: f64) {
        let left = time - self.now();
        if left > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(left));
        }
    }
}

#[derive(Debug)]
struct Message {
    from: usize,
    seq: u64,
    tag: ExchangeTag,
    body: Vec<f64>,
    /// When the receiver may read it (on the group's clock).
    visible_at: f64,
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
    model: LinkModel,
    clock: Arc<dyn LinkClock>,
}

impl ChannelExpertLink {
    /// The `workers` ends of one group, worker `w` at index `w`; a receive waits at most
    /// `timeout`. No link emulation.
    pub fn group(workers: usize, timeout: Duration) -> Vec<ChannelExpertLink> {
        Self::emulated(
            workers,
            timeout,
            LinkModel::NONE,
            Arc::new(WallClock::new()),
        )
    }

    /// [`ChannelExpertLink::group`] over an emulated link: every message between two
    /// workers becomes visible `model.delay(values)` after it was sent, on `clock`.
    pub fn emulated(
        workers: usize,
        timeout: Duration,
        model: LinkModel,
        clock: Arc<dyn LinkClock>,
    ) -> Vec<ChannelExpertLink> {
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
                model,
                clock: clock.clone(),
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
        let sent_at = if self.model.is_none() {
            0.0
        } else {
            self.clock.now()
        };
        for (w, body) in parts.into_iter().enumerate() {
            if w == self.worker {
                got[w] = Some(body);
            } else {
                let msg = Message {
                    from: self.worker,
                    seq,
                    tag,
                    visible_at: sent_at + self.model.delay(body.len()),
                    body,
                };
                self.peers[w].send(msg).map_err(|_| {
                    NnError::Execution(format!("expert all-to-all: worker {w} has gone"))
                })?;
            }
        }
        link_wait(tag.phase, || {
            let out = self.receive(tag, seq, got);
            if let Ok((_, last_visible)) = &out {
                if !self.model.is_none() {
                    waits::add_due(wait_kind(tag.phase), (last_visible - sent_at).max(0.0));
                }
            }
            out.map(|(parts, _)| parts)
        })
    }
}

/// Runs `wait`, the receive of an all-to-all of `phase`, as every link waits: inside an
/// overlapped FB pair with the compute token given up meanwhile, and its time added to the
/// process's [`waits`] tallies.
pub fn link_wait<R>(phase: Phase, wait: impl FnOnce() -> R) -> R {
    let kind = wait_kind(phase);
    let start = Instant::now();
    while_waiting(|| {
        let out = wait();
        waits::add_wait(kind, start.elapsed());
        out
    })
}

/// The tally a wait of an all-to-all of `phase` on this thread counts in: a lone forward or
/// backward op's, or a chunk's of an overlapped FB pair (the thread holds the token).
fn wait_kind(phase: Phase) -> WaitKind {
    match (phase, holds_token()) {
        (Phase::Dispatch | Phase::Combine, false) => WaitKind::Forward,
        (Phase::GradDispatch | Phase::GradCombine, false) => WaitKind::Backward,
        (Phase::Dispatch | Phase::Combine, true) => WaitKind::PairForward,
        (Phase::GradDispatch | Phase::GradCombine, true) => WaitKind::PairBackward,
    }
}

impl ChannelExpertLink {
    /// The rest of all-to-all `seq`: every peer's part into `got`, then the wait until the
    /// last of them is visible. Returns the parts and when the last of them became visible
    /// (on the link's clock; `-inf` without peers).
    fn receive(
        &mut self,
        tag: ExchangeTag,
        seq: u64,
        mut got: Vec<Option<Vec<f64>>>,
    ) -> Result<(Vec<Vec<f64>>, f64), NnError> {
        let n = got.len();
        let deadline = Instant::now() + self.timeout;
        let mut visible_at = f64::NEG_INFINITY;
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
            // A peer may already be at a later all-to-all (with three or more workers it
            // can finish this one before another peer has sent): kept for then. Only a
            // message of this all-to-all is checked against its version.
            if msg.seq != seq {
                self.early.insert((msg.seq, msg.from), msg);
                continue;
            }
            if msg.tag.version < tag.version {
                return Err(NnError::Execution(format!(
                    "expert all-to-all: worker {} sent rows for placement version {} to \
                     version {}; refused as stale",
                    msg.from, msg.tag.version, tag.version
                )));
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
            visible_at = visible_at.max(msg.visible_at);
            got[msg.from] = Some(msg.body);
        }
        if !self.model.is_none() {
            self.clock.wait_until(visible_at);
        }
        let parts = got.into_iter().map(Option::unwrap_or_default).collect();
        Ok((parts, visible_at))
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

    #[test]
    fn a_peer_already_at_the_next_all_to_all_is_kept_for_it() {
        // With three workers, worker 0 can finish all-to-all 0 (placement version 3) and
        // send its part of all-to-all 1 (version 0) before worker 1's part of all-to-all 0
        // reaches worker 2: worker 2 keeps that early part, neither refusing it as stale
        // nor losing it.
        let mut links = ChannelExpertLink::group(3, Duration::from_secs(5));
        let mut c = links.pop().unwrap();
        let b = links.pop().unwrap();
        let a = links.pop().unwrap();
        let tag = |mb, version| ExchangeTag {
            chunk: Chunk::new(0, 0, mb),
            phase: Phase::Dispatch,
            version,
        };
        let part = |link: &ChannelExpertLink, seq, version, value| {
            link.peers[2]
                .send(Message {
                    from: link.worker,
                    seq,
                    tag: tag(seq as usize, version),
                    body: vec![value],
                    visible_at: 0.0,
                })
                .unwrap()
        };
        // Worker 2's inbox, in arrival order.
        part(&a, 0, 3, 0.0);
        part(&a, 1, 0, 10.0);
        part(&b, 0, 3, 1.0);
        part(&b, 1, 0, 11.0);
        let first = c.all_to_all(tag(0, 3), vec![vec![], vec![], vec![2.0]]);
        assert_eq!(first.unwrap(), vec![vec![0.0], vec![1.0], vec![2.0]]);
        let second = c.all_to_all(tag(1, 0), vec![vec![], vec![], vec![12.0]]);
        assert_eq!(second.unwrap(), vec![vec![10.0], vec![11.0], vec![12.0]]);
    }

    /// A clock that stands still except when a wait moves it on; it logs every wait.
    #[derive(Debug, Default)]
    struct ManualClock {
        now: std::sync::Mutex<f64>,
        waits: std::sync::Mutex<Vec<f64>>,
    }

    impl LinkClock for ManualClock {
        fn now(&self) -> f64 {
            *self.now.lock().unwrap()
        }

        fn wait_until(&self, time: f64) {
            self.waits.lock().unwrap().push(time);
            let mut now = self.now.lock().unwrap();
            *now = now.max(time);
        }
    }

    #[test]
    fn an_emulated_link_delivers_after_latency_plus_bytes_over_bandwidth() {
        let clock = Arc::new(ManualClock::default());
        *clock.now.lock().unwrap() = 1.0;
        let model = LinkModel {
            latency: 0.25,
            bandwidth: Some(800.0),
        };
        assert_eq!(model.delay(10), 0.25 + 80.0 / 800.0);
        let mut links =
            ChannelExpertLink::emulated(2, Duration::from_secs(5), model, clock.clone());
        let mut b = links.pop().unwrap();
        let mut a = links.pop().unwrap();
        let tag = ExchangeTag {
            chunk: Chunk::new(0, 0, 0),
            phase: Phase::Dispatch,
            version: 0,
        };
        // a sends b 10 values (80 bytes: visible at 1 + 0.25 + 0.1), b sends a 5 (40 bytes:
        // visible at 1 + 0.25 + 0.05); both sends happen before either side waits.
        let t = std::thread::spawn(move || b.all_to_all(tag, vec![vec![0.5; 5], vec![9.0]]));
        let got_a = a.all_to_all(tag, vec![vec![1.0], vec![2.0; 10]]).unwrap();
        let got_b = t.join().unwrap().unwrap();
        assert_eq!(got_a, vec![vec![1.0], vec![0.5; 5]]);
        assert_eq!(got_b, vec![vec![2.0; 10], vec![9.0]]);
        let mut waits = clock.waits.lock().unwrap().clone();
        waits.sort_by(f64::total_cmp);
        assert_eq!(waits.len(), 2, "{waits:?}");
        assert!((waits[0] - 1.30).abs() < 1e-12, "{waits:?}");
        assert!((waits[1] - 1.35).abs() < 1e-12, "{waits:?}");
        // Without emulation nothing waits on the clock.
        let mut plain =
            ChannelExpertLink::emulated(1, Duration::from_secs(5), LinkModel::NONE, clock.clone());
        plain[0].all_to_all(tag, vec![vec![3.0]]).unwrap();
        assert_eq!(clock.waits.lock().unwrap().len(), 2);
    }
}
