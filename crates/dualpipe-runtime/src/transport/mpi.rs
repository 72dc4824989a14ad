//! The MPI link: messages between processes over MPI point-to-point (feature `mpi`).
//!
//! [`MpiWorld::init`] initialises MPI once per process and checks the launcher's variables
//! against MPI's own rank and size; [`MpiWorld::link`] gives the [`MpiLink`] an
//! [`Endpoint`](super::endpoint::Endpoint) runs on.
//!
//! A message is a *head* (tag [`TAG_HEAD`]): a flag, the body length and the endpoint's
//! header; a body of at most [`INLINE_BYTES`] rides inside the head (one MPI message, one small
//! copy), a larger one follows as its own message (tag [`TAG_BODY`]) sent straight from the
//! tensor's buffer, so a megabyte activation crosses with no copy of ours. Sends are
//! `MPI_Isend`s completed in the background of later calls. Arrivals are found with
//! `MPI_Improbe` on every poll, so they are picked up as soon as they are announced, and a
//! large body gets its `MPI_Imrecv` posted the moment its head is read, into a buffer of
//! exactly its size; MPI's non-overtaking order between two ranks pairs each head with its
//! body.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use mpi::collective::CommunicatorCollectives;
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::request::{Request, StaticScope};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::Threading;

use super::endpoint::{Link, LinkError, Packet};
pub use super::mpi_peers::MpiPeers;
pub use super::mpi_sum::{MpiSum, PendingSum};
use super::peer_watch::{self, Beacon, Identity, PeerWatch};
use crate::launch::{LaunchError, LaunchInfo};

/// MPI tag of message heads.
pub const TAG_HEAD: i32 = 0x4450;
/// MPI tag of separate message bodies.
pub const TAG_BODY: i32 = 0x4451;
/// Bodies up to this size travel inside their head.
pub const INLINE_BYTES: usize = 16 * 1024;

/// Buffers of at least this size are kept for reuse once their send completed.
const SPARE_MIN_BYTES: usize = 64 * 1024;
/// At most this many spare buffers are kept.
const SPARE_MAX: usize = 16;

const FLAG_INLINE: u8 = 0;
const FLAG_SEPARATE: u8 = 1;

/// Why MPI could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MpiError {
    /// MPI was initialised before (only one [`MpiWorld`] per process).
    #[error("MPI is already initialised in this process (create one MpiWorld and keep it)")]
    AlreadyInitialised,
    /// The launcher's variables are unusable or disagree with MPI.
    #[error(transparent)]
    Launch(#[from] LaunchError),
}

/// MPI for this process: initialised on creation, finalised when dropped.
///
/// Once [`MpiWorld::watch_peers`] has armed the watch, dropping is collective: it disarms the
/// watch and waits at a barrier, so no process ends (normally) while another still watches it.
pub struct MpiWorld {
    universe: Universe,
    info: LaunchInfo,
    /// Every rank's pid and machine identity, gathered at start.
    identities: Vec<Identity>,
    /// This process's beacon, listening from start (so every peer's exists before any
    /// connects) until [`MpiWorld::watch_peers`] hands it to the watch.
    beacon: Option<Beacon>,
    watch: Option<PeerWatch>,
    /// The thread level MPI provides (`MPI_THREAD_SERIALIZED` asked for).
    threading: Threading,
}

impl std::fmt::Debug for MpiWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiWorld")
            .field("info", &self.info)
            .finish()
    }
}

impl MpiWorld {
    /// Initialises MPI and reads the launcher's variables; MPI's own rank and size win, and
    /// must agree with the variables if any. MPI is asked for `MPI_THREAD_SERIALIZED`: calls
    /// come from this thread, except an expert all-to-all's, which may come from a second
    /// thread under a lock ([`MpiWorld::threads_serialized`] says whether that is allowed).
    pub fn init() -> Result<Self, MpiError> {
        let env = LaunchInfo::from_env()?;
        let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or(MpiError::AlreadyInitialised)?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        env.check_agrees(rank, size)?;
        let info = LaunchInfo {
            rank,
            world_size: size,
            ..env
        };
        let beacon = Beacon::listen();
        let mut gathered = vec![0u64; 3 * size];
        world.all_gather_into(&peer_watch::identity()[..], &mut gathered[..]);
        let identities = gathered
            .chunks_exact(3)
            .map(|id| [id[0], id[1], id[2]])
            .collect();
        Ok(MpiWorld {
            universe,
            info,
            identities,
            beacon,
            watch: None,
            threading,
        })
    }

    /// Starts watching the other processes of the job on this machine (see
    /// [`peer_watch`]): from now on, one that ends is named on standard error and this process
    /// exits with code 1. Not collective; once per process (later calls change nothing).
    /// Returns how many peers are watched.
    pub fn watch_peers(&mut self) -> usize {
        let (me, ranks) = (self.info.rank, self.info.world_size);
        let (identities, beacon) = (&self.identities, &mut self.beacon);
        self.watch
            .get_or_insert_with(|| {
                let peers = peer_watch::neighbours(identities, me);
                PeerWatch::start(me, ranks, &peers, beacon.take())
            })
            .watched()
    }

    /// Stops watching the peers (before leaving after a failure that the peers are told of:
    /// their ending is then expected, not a loss).
    pub fn stop_watching(&self) {
        if let Some(watch) = &self.watch {
            watch.disarm();
        }
    }

    /// Rank, world size and launcher.
    pub fn info(&self) -> &LaunchInfo {
        &self.info
    }

    /// A link on a private duplicate of `MPI_COMM_WORLD` (so other MPI users of the process
    /// cannot see our messages).
    pub fn link(&self) -> MpiLink {
        let comm = self.universe.world().duplicate();
        MpiLink::new(comm)
    }

    /// A link on the part of `MPI_COMM_WORLD` that passes the same `color` (`MPI_Comm_split`;
    /// members keep their world order). Collective: every process calls it, in the same order.
    pub fn split_link(&self, color: usize) -> MpiLink {
        MpiLink::new(self.split(color))
    }

    /// MPI's own sum ([`MpiSum`], `MPI_Iallreduce`) over the part of `MPI_COMM_WORLD` that
    /// passes the same `color` (members in world order). Collective, as
    /// [`MpiWorld::split_link`].
    pub fn split_sum(&self, color: usize) -> MpiSum {
        MpiSum::new(self.split(color))
    }

    /// Point-to-point arrays between the part of `MPI_COMM_WORLD` that passes the same
    /// `color` ([`MpiPeers`], members in world order). Collective, as [`MpiWorld::split_link`].
    pub fn split_peers(&self, color: usize) -> MpiPeers {
        MpiPeers::new(self.split(color))
    }

    /// Whether MPI lets threads other than this one call it, one at a time
    /// (`MPI_THREAD_SERIALIZED` or `MPI_THREAD_MULTIPLE` provided).
    pub fn threads_serialized(&self) -> bool {
        matches!(self.threading, Threading::Serialized | Threading::Multiple)
    }

    fn split(&self, color: usize) -> SimpleCommunicator {
        let color = mpi::topology::Color::with_value(color as i32);
        self.universe
            .world()
            .split_by_color(color)
            .unwrap_or_else(|| self.universe.world().duplicate())
    }

    /// Every process gets process 0's `value` (`MPI_Bcast` on `MPI_COMM_WORLD`; the others'
    /// `value` is ignored). Collective: every process calls it, in the same order.
    pub fn broadcast_u64(&self, value: u64) -> u64 {
        use mpi::collective::Root;
        let mut v = value;
        self.universe
            .world()
            .process_at_rank(0)
            .broadcast_into(&mut v);
        v
    }

    /// Stops every process of the job at once with `code` (`MPI_Abort`): the last resort
    /// when a rank cannot tell its peers in an orderly way.
    pub fn abort(&self, code: i32) -> ! {
        self.universe.world().abort(code)
    }
}

impl Drop for MpiWorld {
    /// With the watch armed: disarm it, then `MPI_Barrier`, so every process has stopped
    /// watching before any ends. `MPI_Finalize` follows (the universe's own drop).
    fn drop(&mut self) {
        if let Some(watch) = &self.watch {
            watch.disarm();
            self.universe.world().barrier();
        }
    }
}

/// A send in flight: the request and the buffer it reads.
struct PendingSend {
    request: Option<Request<'static, [u8]>>,
    buffer: Vec<u8>,
}

/// A message whose head arrived; its body may still be on its way.
struct Incoming {
    src: usize,
    header: Vec<u8>,
    body: Body,
}

enum Body {
    /// The body's head is known but its MPI message has not been matched yet.
    Unmatched(usize),
    /// `MPI_Imrecv` is posted into `buffer`.
    Receiving {
        request: Option<Request<'static, [u8]>>,
        buffer: Vec<u8>,
    },
    /// Complete.
    Done(Vec<u8>),
}

/// A [`Link`] over an MPI communicator.
pub struct MpiLink {
    comm: SimpleCommunicator,
    rank: usize,
    ranks: usize,
    sends: Vec<PendingSend>,
    incoming: VecDeque<Incoming>,
    /// Buffers of completed sends, reused for incoming bodies: a large receive then lands in
    /// memory that is already mapped instead of a fresh allocation the kernel must fault in.
    spare: Vec<Vec<u8>>,
}

// SAFETY: an `MpiLink` owns its communicator and its requests (never shared: no `Sync`), and
// is only moved whole into the value that uses it. Every MPI call it makes happens on whichever
// one thread holds it, which the trainer keeps to the thread that initialised MPI. Under MPICH
// the handles are integers and the type is `Send` already; under Open MPI they are pointers,
// which alone keep the compiler from seeing the same thing.
unsafe impl Send for MpiLink {}

impl std::fmt::Debug for MpiLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiLink")
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .field("sends_in_flight", &self.sends.len())
            .field("incoming", &self.incoming.len())
            .finish()
    }
}

/// A `'static` view of a buffer that the link keeps alive (and does not touch) until the MPI
/// request using it completes.
///
/// # Safety
/// The caller keeps `buffer` (its heap allocation) alive and unmoved-from until the request
/// completes: a `Vec`'s heap block stays put when the `Vec` itself moves.
pub(super) unsafe fn extend<T>(buffer: &[T]) -> &'static [T] {
    std::slice::from_raw_parts(buffer.as_ptr(), buffer.len())
}

/// Like [`extend`], mutably.
///
/// # Safety
/// As for [`extend`].
pub(super) unsafe fn extend_mut<T>(buffer: &mut [T]) -> &'static mut [T] {
    std::slice::from_raw_parts_mut(buffer.as_mut_ptr(), buffer.len())
}

impl MpiLink {
    /// A link on `comm`.
    pub fn new(comm: SimpleCommunicator) -> Self {
        MpiLink {
            rank: comm.rank() as usize,
            ranks: comm.size() as usize,
            comm,
            sends: Vec::new(),
            incoming: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// A buffer of exactly `len` bytes for an incoming body, reusing a spare one if possible.
    fn body_buffer(spare: &mut Vec<Vec<u8>>, len: usize) -> Vec<u8> {
        let best = spare
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                // Its bytes are initialised (old data); the receive overwrites all of them.
                let mut buffer = spare.swap_remove(i);
                buffer.truncate(len);
                buffer
            }
            None if len >= SPARE_MIN_BYTES && !spare.is_empty() => {
                let mut buffer = spare.swap_remove(0);
                buffer.resize(len, 0);
                buffer
            }
            None => vec![0u8; len],
        }
    }

    fn isend(&mut self, dst: usize, buffer: Vec<u8>, tag: i32) {
        // SAFETY: `buffer` moves into `self.sends` next to its request and is dropped only
        // after the request completed (see `reap_sends` and `Drop`).
        let view = unsafe { extend(&buffer) };
        let request = self
            .comm
            .process_at_rank(dst as i32)
            .immediate_send_with_tag(StaticScope, view, tag);
        self.sends.push(PendingSend {
            request: Some(request),
            buffer,
        });
    }

    /// Drops the sends that have completed, keeping large buffers for reuse.
    fn reap_sends(&mut self) {
        let spare = &mut self.spare;
        self.sends.retain_mut(|send| {
            if let Some(request) = send.request.take() {
                match request.test() {
                    Ok(_) => {
                        if send.buffer.len() >= SPARE_MIN_BYTES && spare.len() < SPARE_MAX {
                            spare.push(std::mem::take(&mut send.buffer));
                        }
                    }
                    Err(request) => send.request = Some(request),
                }
            }
            send.request.is_some()
        });
    }

    /// Reads every announced head and starts receiving the bodies.
    fn probe_heads(&mut self) -> Result<(), LinkError> {
        while let Some((message, status)) = self
            .comm
            .any_process()
            .immediate_matched_probe_with_tag(TAG_HEAD)
        {
            let src = status.source_rank() as usize;
            let (head, _) = (message, status).matched_receive_vec::<u8>();
            if head.len() < 9 {
                return Err(LinkError(format!(
                    "a truncated message head ({} bytes) from rank {src}",
                    head.len()
                )));
            }
            let mut len = [0u8; 8];
            len.copy_from_slice(&head[1..9]);
            let body_len = usize::try_from(u64::from_le_bytes(len)).unwrap_or(usize::MAX);
            let rest = &head[9..];
            let incoming = match head[0] {
                FLAG_INLINE if body_len <= rest.len() => {
                    let split = rest.len() - body_len;
                    Incoming {
                        src,
                        header: rest[..split].to_vec(),
                        body: Body::Done(rest[split..].to_vec()),
                    }
                }
                FLAG_SEPARATE => Incoming {
                    src,
                    header: rest.to_vec(),
                    body: Body::Unmatched(body_len),
                },
                flag => {
                    return Err(LinkError(format!(
                        "a malformed message head from rank {src} (flag {flag}, body {body_len} \
                         bytes)"
                    )))
                }
            };
            self.incoming.push_back(incoming);
        }
        Ok(())
    }

    /// Matches bodies to their heads (in order per source) and completes their receives.
    fn progress_bodies(&mut self) -> Result<(), LinkError> {
        let mut blocked: HashSet<usize> = HashSet::new();
        for incoming in self.incoming.iter_mut() {
            let src = incoming.src;
            if let Body::Unmatched(len) = incoming.body {
                if blocked.contains(&src) {
                    continue;
                }
                match self
                    .comm
                    .process_at_rank(src as i32)
                    .immediate_matched_probe_with_tag(TAG_BODY)
                {
                    Some((message, status)) => {
                        let count = status.count(u8::equivalent_datatype()) as usize;
                        if count != len {
                            // Receive it anyway so MPI's queue stays consistent, then fail.
                            let _ = (message, status).matched_receive_vec::<u8>();
                            return Err(LinkError(format!(
                                "rank {src} announced a {len}-byte body but sent {count} bytes"
                            )));
                        }
                        let mut buffer = Self::body_buffer(&mut self.spare, len);
                        // SAFETY: `buffer` moves into `incoming.body` next to its request and
                        // is read only after the request completed.
                        let view = unsafe { extend_mut(&mut buffer) };
                        let request = message.immediate_matched_receive_into(StaticScope, view);
                        incoming.body = Body::Receiving {
                            request: Some(request),
                            buffer,
                        };
                    }
                    None => {
                        blocked.insert(src);
                        continue;
                    }
                }
            }
            if let Body::Receiving { request, buffer } = &mut incoming.body {
                if let Some(r) = request.take() {
                    match r.test() {
                        Ok(_) => incoming.body = Body::Done(std::mem::take(buffer)),
                        Err(r) => *request = Some(r),
                    }
                }
            }
        }
        Ok(())
    }
}

use mpi::datatype::Equivalence;

impl Link for MpiLink {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn post(&mut self, dst: usize, header: Vec<u8>, body: Vec<u8>) -> Result<(), LinkError> {
        if dst >= self.ranks {
            return Err(LinkError(format!(
                "no rank {dst}: the MPI world has {} ranks",
                self.ranks
            )));
        }
        if body.len() > i32::MAX as usize {
            return Err(LinkError(format!(
                "a message of {} bytes is over MPI's limit of {} bytes per message",
                body.len(),
                i32::MAX
            )));
        }
        let inline = body.len() <= INLINE_BYTES;
        let mut head = Vec::with_capacity(9 + header.len() + if inline { body.len() } else { 0 });
        head.push(if inline { FLAG_INLINE } else { FLAG_SEPARATE });
        head.extend_from_slice(&(body.len() as u64).to_le_bytes());
        head.extend_from_slice(&header);
        if inline {
            head.extend_from_slice(&body);
            self.isend(dst, head, TAG_HEAD);
        } else {
            self.isend(dst, head, TAG_HEAD);
            self.isend(dst, body, TAG_BODY);
        }
        self.reap_sends();
        Ok(())
    }

    fn poll(&mut self) -> Result<Option<Packet>, LinkError> {
        self.reap_sends();
        self.probe_heads()?;
        self.progress_bodies()?;
        // Deliver in arrival order per source: the first complete message whose source has
        // no earlier incomplete one.
        let mut waiting: HashSet<usize> = HashSet::new();
        let mut ready = None;
        for (i, incoming) in self.incoming.iter().enumerate() {
            if matches!(incoming.body, Body::Done(_)) && !waiting.contains(&incoming.src) {
                ready = Some(i);
                break;
            }
            waiting.insert(incoming.src);
        }
        Ok(ready
            .and_then(|i| self.incoming.remove(i))
            .map(|incoming| match incoming.body {
                Body::Done(body) => (incoming.src, incoming.header, body),
                // `ready` only points at complete messages.
                _ => (incoming.src, incoming.header, Vec::new()),
            }))
    }

    fn receiving(&self) -> bool {
        self.incoming
            .iter()
            .any(|incoming| matches!(incoming.body, Body::Receiving { .. }))
    }

    fn flush(&mut self, deadline: Instant) -> Result<bool, LinkError> {
        loop {
            self.reap_sends();
            if self.sends.is_empty() {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            // Receiving keeps the peers' sends to us moving, which may be what they wait on.
            self.probe_heads()?;
            self.progress_bodies()?;
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl Drop for MpiLink {
    fn drop(&mut self) {
        let _ = self.flush(Instant::now() + Duration::from_secs(2));
        // Requests that never completed (a peer is gone) cannot be freed safely: leak them and
        // their buffers rather than let MPI write into freed memory.
        for send in self.sends.drain(..) {
            std::mem::forget(send.request);
            std::mem::forget(send.buffer);
        }
        for incoming in self.incoming.drain(..) {
            if let Body::Receiving { request, buffer } = incoming.body {
                std::mem::forget(request);
                std::mem::forget(buffer);
            }
        }
    }
}
