//! Naming a lost peer: every process of an MPI job watches the other processes of the job that
//! run on its own machine, and the moment one of them ends while the job runs (killed, crashed,
//! exited early), it says which rank that was.
//!
//! Launchers end a job when one of its processes dies, but not all of them say which rank it
//! was: Open MPI's `mpirun` does ("process rank 2 with PID ..."); MPICH's hydra names a PID,
//! often a survivor's, and kills every other process within a millisecond of the loss. So each
//! process listens on a [`Beacon`] (an abstract Unix socket named by its pid) from the start,
//! [`PeerWatch::start`] connects to the beacon of every peer on this machine (pids and machine
//! identities are gathered once, with `MPI_Allgather`), and a thread waits on those
//! connections (`poll`). A peer's socket closes while its process is being torn down (before
//! the process is a zombie, as early as the launcher's own pipes from it), so the connection
//! reads as hung up; the thread, at real-time priority where allowed, then writes one line
//! naming the rank to standard error and ends this process with exit code 1 a moment later, so
//! a launcher that does not clean up ends the job too.
//!
//! Peers on other machines are not watched (their sockets are not reachable): there the
//! launcher's own report and the transport's errors stand. A process that finishes normally
//! must first [`PeerWatch::disarm`] (dropping the transport's `MpiWorld` does, before
//! a barrier, so no process ends before every one has stopped watching).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How long a survivor waits between naming the lost rank and ending.
#[cfg(target_os = "linux")]
const SAY_TOGETHER: std::time::Duration = std::time::Duration::from_millis(250);

/// One process's identity, as gathered: its pid and what makes its pids comparable with
/// another's (the machine's boot id and the pid namespace).
pub type Identity = [u64; 3];

/// This process's [`Identity`]: pid, a hash of `/proc/sys/kernel/random/boot_id` (one per
/// machine and boot) and the inode of `/proc/self/ns/pid` (one per pid namespace). Where
/// either cannot be read its slot is 0, which matches no other process.
pub fn identity() -> Identity {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| fnv1a(id.trim().as_bytes()))
        .unwrap_or(0);
    let namespace = namespace_inode().unwrap_or(0);
    [u64::from(std::process::id()), boot, namespace]
}

#[cfg(unix)]
fn namespace_inode() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

#[cfg(not(unix))]
fn namespace_inode() -> Option<u64> {
    None
}

/// FNV-1a, 64 bits: a stable hash of the boot id (any stable hash would do).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The ranks whose process runs beside this one (same machine, same pid namespace), with
/// their pids; `all[r]` is rank `r`'s [`Identity`] and `me` this process's rank.
pub fn neighbours(all: &[Identity], me: usize) -> Vec<(usize, u32)> {
    let [_, boot, namespace] = all[me];
    if boot == 0 || namespace == 0 {
        return Vec::new();
    }
    all.iter()
        .enumerate()
        .filter(|&(r, id)| r != me && id[1] == boot && id[2] == namespace)
        .filter_map(|(r, id)| u32::try_from(id[0]).ok().map(|pid| (r, pid)))
        .collect()
}

/// The line a survivor writes when `lost` ended while the job ran.
pub fn lost_line(me: usize, ranks: usize, lost: usize, pid: u32) -> String {
    format!(
        "error: rank {me} of {ranks}: lost rank {lost} (its process, pid {pid} on this machine, \
         ended while the job ran); the job stops\n"
    )
}

/// This process's socket for its peers to connect to: an abstract Unix socket named by the
/// pid ([`beacon_name`]), listening from [`Beacon::listen`] until the process ends. Peers
/// never send on it: its closing, when this process ends, is the message.
#[derive(Debug)]
pub struct Beacon {
    #[cfg(target_os = "linux")]
    _listener: std::os::unix::net::UnixListener,
}

/// The abstract socket name of the beacon of the process `pid`.
pub fn beacon_name(pid: u32) -> String {
    format!("dualpipe-peer-watch-{pid}")
}

impl Beacon {
    /// Listens on this process's beacon; `None` where that fails (another process of this
    /// pid in the network namespace, or not Linux): this process then cannot be watched.
    pub fn listen() -> Option<Beacon> {
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            use std::os::unix::net::{SocketAddr, UnixListener};
            let name = beacon_name(std::process::id());
            let addr = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
            UnixListener::bind_addr(&addr).ok().map(|listener| Beacon {
                _listener: listener,
            })
        }
        #[cfg(not(target_os = "linux"))]
        None
    }
}

/// The watch over this process's neighbours: armed from [`PeerWatch::start`] until
/// [`PeerWatch::disarm`].
#[derive(Debug, Clone)]
pub struct PeerWatch {
    armed: Arc<AtomicBool>,
    watched: usize,
}

impl PeerWatch {
    /// Connects to the beacons of `peers` (rank and pid) and watches them from a background
    /// thread, which also keeps `beacon` (this process's, if it could listen) open; `me` of `ranks` names this
    /// process in the line it writes. A peer whose beacon does not answer (gone already, or
    /// not Linux) is not watched.
    pub fn start(me: usize, ranks: usize, peers: &[(usize, u32)], beacon: Option<Beacon>) -> Self {
        let armed = Arc::new(AtomicBool::new(true));
        let links = connect(peers);
        let watched = links.len();
        let flag = Arc::clone(&armed);
        let spawned = std::thread::Builder::new()
            .name("dualpipe-peer-watch".into())
            .spawn(move || watch(me, ranks, beacon, links, &flag));
        if spawned.is_err() {
            // Without the thread nothing is watched: the launcher's report stands.
            armed.store(false, Ordering::SeqCst);
            return PeerWatch { armed, watched: 0 };
        }
        PeerWatch { armed, watched }
    }

    /// Stops watching: a peer that ends from now on is not reported.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    /// How many peers are watched (those on this machine whose beacon answered).
    pub fn watched(&self) -> usize {
        self.watched
    }
}

/// A watched peer: its rank, pid and the connection to its beacon.
#[cfg(target_os = "linux")]
type Link = (usize, u32, std::os::unix::net::UnixStream);
#[cfg(not(target_os = "linux"))]
type Link = (usize, u32);

#[cfg(target_os = "linux")]
fn connect(peers: &[(usize, u32)]) -> Vec<Link> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixStream};
    peers
        .iter()
        .filter_map(|&(rank, pid)| {
            let addr = SocketAddr::from_abstract_name(beacon_name(pid).as_bytes()).ok()?;
            let stream = UnixStream::connect_addr(&addr).ok()?;
            Some((rank, pid, stream))
        })
        .collect()
}

#[cfg(not(target_os = "linux"))]
fn connect(_peers: &[(usize, u32)]) -> Vec<Link> {
    Vec::new()
}

/// The watch thread: waits until a peer's connection hangs up, then (if still armed) writes
/// the line and ends the process. Holds `beacon` open for as long as this process lives.
#[cfg(target_os = "linux")]
fn watch(me: usize, ranks: usize, beacon: Option<Beacon>, links: Vec<Link>, armed: &AtomicBool) {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let _beacon = beacon;
    if links.is_empty() {
        // Nothing to watch; the beacon stays open for the peers that watch this process.
        loop {
            std::thread::park();
        }
    }
    // The launcher ends the survivors within a millisecond of the loss (MPICH's hydra kills
    // every process group at once), so this thread must run the moment the peer goes: ask for
    // real-time priority where allowed (root, or an RLIMIT_RTPRIO above 0); elsewhere it
    // competes as any thread does and the launcher may end this process first.
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sets the calling thread's policy; a refusal changes nothing.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    let mut polled: Vec<libc::pollfd> = links
        .iter()
        .map(|(_, _, stream)| libc::pollfd {
            fd: stream.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `polled` is a valid array of pollfd for its length.
        let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        // Peers never send: any event on a connection is its end.
        let Some(i) = polled.iter().position(|p| p.revents != 0) else {
            continue;
        };
        if !armed.load(Ordering::SeqCst) {
            return;
        }
        let (lost, pid, _) = &links[i];
        // One write, so launchers that tag lines by rank keep it whole.
        let _ = std::io::stderr().write_all(lost_line(me, ranks, *lost, *pid).as_bytes());
        // Every survivor on the machine woke at the same moment: give the others time to say
        // it too before this exit (a process that ends can make the launcher end the rest).
        std::thread::sleep(SAY_TOGETHER);
        // SAFETY: _exit ends the process at once; nothing of ours needs unwinding (MPI is
        // not finalised: a peer is gone, finalising could wait for it forever).
        unsafe { libc::_exit(1) }
    }
}

#[cfg(not(target_os = "linux"))]
fn watch(
    _me: usize,
    _ranks: usize,
    _beacon: Option<Beacon>,
    _links: Vec<Link>,
    _armed: &AtomicBool,
) {
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_share_machine_and_namespace() {
        let all = [[10, 7, 3], [11, 7, 3], [12, 8, 3], [13, 7, 4], [14, 7, 3]];
        assert_eq!(neighbours(&all, 0), vec![(1, 11), (4, 14)]);
        assert_eq!(neighbours(&all, 2), Vec::<(usize, u32)>::new());
        // An unreadable identity matches nobody.
        let blind = [[10, 0, 3], [11, 0, 3]];
        assert!(neighbours(&blind, 0).is_empty());
    }

    #[test]
    fn identity_is_this_process() {
        let id = identity();
        assert_eq!(id[0], u64::from(std::process::id()));
        assert_eq!(identity(), id, "stable within a process");
    }

    #[test]
    fn the_line_names_the_lost_rank() {
        let line = lost_line(1, 4, 2, 4321);
        assert!(line.contains("lost rank 2"), "{line}");
        assert!(line.contains("pid 4321"), "{line}");
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_beacon_that_closes_hangs_up_its_watchers() {
        // The watch thread would end this test process, so check the wait it relies on: a
        // connection to a beacon is quiet while the beacon lives and hangs up when it closes.
        use std::os::fd::AsRawFd;
        let beacon = Beacon::listen().expect("this process's beacon");
        assert!(Beacon::listen().is_none(), "one beacon per pid");
        let links = connect(&[(3, std::process::id()), (4, u32::MAX)]);
        assert_eq!(links.len(), 1, "only the live beacon answers");
        let mut p = libc::pollfd {
            fd: links[0].2.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0, "alive: quiet");
        drop(beacon);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 1000) }, 1, "closed: hung up");
    }
}
