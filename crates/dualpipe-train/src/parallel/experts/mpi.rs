//! The experts' all-to-alls over MPI (feature `mpi`): [`MpiExpertLink`], an [`ExpertLink`] on
//! a communicator of one stage's data-parallel group (the processes of that pipeline rank in
//! every replica, in replica order), and [`expert_links`], every link a process of the grid
//! needs, made collectively once at start: one communicator per (MoE block, direction) copy
//! and one for the group's counts, so the messages of different copies never mix.
//!
//! Each part travels as one point-to-point message (`MPI_Isend`, found by `MPI_Improbe`)
//! with a head: the all-to-all's sequence number, the placement version, the phase and the
//! chunk. A part stamped with an older placement version than the receiver's is refused as
//! stale, one of another all-to-all as a mismatch (every worker checks every part it gets,
//! so all of them fail, none waits forever).
//!
//! Threads: DualPipe's overlapped FB pair runs its forward chunk's all-to-alls on a second
//! thread beside the backward chunk's. MPI is asked for `MPI_THREAD_SERIALIZED`, and every
//! MPI call of every link of the process is made under one lock, taken per call and given up
//! between polls, so the two chunks' all-to-alls make progress side by side, one call at a
//! time. The trainer's other MPI calls come from the main thread outside the pair.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dualpipe_nn::gpt::moe::parallel::{link_wait, ExchangeTag, ExpertLink, Phase};
use dualpipe_nn::NnError;
use dualpipe_runtime::transport::mpi::{MpiPeers, MpiWorld};

use crate::parallel::experts::group::ExpertLinks;
use crate::{TrainConfig, TrainError};

/// Every MPI call of the process's expert links is made holding this lock.
static MPI_CALLS: Mutex<()> = Mutex::new(());

fn mpi_calls() -> MutexGuard<'static, ()> {
    MPI_CALLS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Values of a part's head: sequence number, version, phase, chunk (direction, stage,
/// micro-batch).
const HEAD: usize = 6;

/// Polls that only yield the thread before a wait sleeps between polls.
const SPIN_POLLS: u32 = 64;

fn phase_code(phase: Phase) -> f64 {
    match phase {
        Phase::Dispatch => 0.0,
        Phase::Combine => 1.0,
        Phase::GradDispatch => 2.0,
        Phase::GradCombine => 3.0,
    }
}

/// One worker's end of a group's all-to-all over MPI (see the [module](self) documentation).
#[derive(Debug)]
pub struct MpiExpertLink {
    peers: MpiPeers,
    seq: u64,
    timeout: Duration,
}

impl MpiExpertLink {
    /// The link over `peers`' communicator; a receive waits at most `timeout`.
    pub fn new(peers: MpiPeers, timeout: Duration) -> Self {
        MpiExpertLink {
            peers,
            seq: 0,
            timeout,
        }
    }

    /// Checks the head of `message` from `from` against this all-to-all and returns its body.
    fn read(
        from: usize,
        tag: ExchangeTag,
        seq: u64,
        mut message: Vec<f64>,
    ) -> Result<Vec<f64>, NnError> {
        if message.len() < HEAD {
            return Err(NnError::Execution(format!(
                "expert all-to-all over MPI: worker {from} sent a part of {} values, shorter \
                 than its head",
                message.len()
            )));
        }
        let version = message[1] as u64;
        if version < tag.version {
            return Err(NnError::Execution(format!(
                "expert all-to-all: worker {from} sent rows for placement version {version} to \
                 version {}; refused as stale",
                tag.version
            )));
        }
        let chunk = &message[3..HEAD];
        let same = message[0] as u64 == seq
            && version == tag.version
            && message[2] == phase_code(tag.phase)
            && chunk == [tag.chunk.dir, tag.chunk.stage, tag.chunk.mb].map(|v| v as f64);
        if !same {
            return Err(NnError::Execution(format!(
                "expert all-to-all over MPI: worker {from} is at all-to-all {} (phase {}, chunk \
                 {:?}, version {version}), this worker at {seq} ({:?} of {}, version {})",
                message[0], message[2], chunk, tag.phase, tag.chunk, tag.version
            )));
        }
        Ok(message.split_off(HEAD))
    }

    /// The rest of all-to-all `seq`: every peer's part into `got`, and every send complete.
    fn receive(
        &mut self,
        tag: ExchangeTag,
        seq: u64,
        mut got: Vec<Option<Vec<f64>>>,
    ) -> Result<Vec<Vec<f64>>, NnError> {
        let deadline = Instant::now() + self.timeout;
        let mut polls = 0u32;
        loop {
            let sent = {
                let _calls = mpi_calls();
                for (w, slot) in got.iter_mut().enumerate() {
                    if slot.is_none() {
                        if let Some(message) = self.peers.try_receive(w) {
                            *slot = Some(Self::read(w, tag, seq, message)?);
                        }
                    }
                }
                self.peers.sends_done()
            };
            if sent && got.iter().all(Option::is_some) {
                return Ok(got.into_iter().map(Option::unwrap_or_default).collect());
            }
            if Instant::now() >= deadline {
                let what = match got.iter().position(Option::is_none) {
                    Some(w) => format!("worker {w} sent nothing"),
                    None => "its parts were not taken".into(),
                };
                return Err(NnError::Execution(format!(
                    "expert all-to-all {:?} of {} over MPI: {what} in {:.0} s (a peer failed or \
                     stalled)",
                    tag.phase,
                    tag.chunk,
                    self.timeout.as_secs_f64()
                )));
            }
            polls += 1;
            if polls < SPIN_POLLS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

impl ExpertLink for MpiExpertLink {
    fn worker(&self) -> usize {
        self.peers.rank()
    }

    fn workers(&self) -> usize {
        self.peers.size()
    }

    fn all_to_all(
        &mut self,
        tag: ExchangeTag,
        parts: Vec<Vec<f64>>,
    ) -> Result<Vec<Vec<f64>>, NnError> {
        let (me, n) = (self.peers.rank(), self.peers.size());
        if parts.len() != n {
            return Err(NnError::Execution(format!(
                "an all-to-all of {} parts over {n} workers",
                parts.len()
            )));
        }
        let seq = self.seq;
        self.seq += 1;
        let head = [
            seq as f64,
            tag.version as f64,
            phase_code(tag.phase),
            tag.chunk.dir as f64,
            tag.chunk.stage as f64,
            tag.chunk.mb as f64,
        ];
        let mut got: Vec<Option<Vec<f64>>> = vec![None; n];
        {
            let _calls = mpi_calls();
            for (w, body) in parts.into_iter().enumerate() {
                if w == me {
                    got[w] = Some(body);
                } else {
                    let mut message = Vec::with_capacity(HEAD + body.len());
                    message.extend_from_slice(&head);
                    message.extend_from_slice(&body);
                    self.peers.send(w, message);
                }
            }
        }
        link_wait(tag.phase, || self.receive(tag, seq, got))
    }
}

/// The expert links of this process (pipeline rank `rank` of the grid of `config`), or none
/// for a dense model or a single replica: per MoE block of the model and direction, a link
/// over that pipeline rank in every replica (the copies this rank does not hold are dropped
/// by [`ExpertGroup::new`](crate::parallel::experts::group::ExpertGroup::new)), and one for the
/// counts. Collective: every process of the world calls it, in the same order.
pub fn expert_links(
    world: &MpiWorld,
    config: &TrainConfig,
    rank: usize,
) -> Result<Option<ExpertLinks>, TrainError> {
    let Some(moe) = config
        .gpt()
        .moe
        .filter(|_| config.parallelism.data_parallel > 1)
    else {
        return Ok(None);
    };
    let threads = config
        .model
        .moe
        .is_some_and(|m| m.expert_parallel && m.overlap);
    if threads && !world.threads_serialized() {
        return Err(TrainError::Config(
            "this MPI does not provide MPI_THREAD_SERIALIZED, which the overlapped FB pair's \
             expert all-to-alls need (two threads); turn the overlap off (`moe.overlap`)"
                .into(),
        ));
    }
    let timeout = Duration::from_secs_f64(config.transport.recv_timeout);
    let layers = config
        .model
        .layers_per_stage
        .saturating_mul(config.model_stages());
    let mut blocks: BTreeMap<(usize, usize), Box<dyn ExpertLink>> = BTreeMap::new();
    for l in (0..layers).filter(|&l| moe.is_moe_block(l)) {
        for dir in 0..2 {
            let link = MpiExpertLink::new(world.split_peers(rank), timeout);
            blocks.insert((l, dir), Box::new(link));
        }
    }
    let counts = Box::new(MpiExpertLink::new(world.split_peers(rank), timeout));
    Ok(Some(ExpertLinks { blocks, counts }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dualpipe_schedule::Chunk;

    fn tag(version: u64) -> ExchangeTag {
        ExchangeTag {
            chunk: Chunk::new(1, 0, 3),
            phase: Phase::Combine,
            version,
        }
    }

    fn message(seq: u64, version: u64, body: &[f64]) -> Vec<f64> {
        let mut m = vec![seq as f64, version as f64, 1.0, 1.0, 0.0, 3.0];
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn a_part_of_a_stale_version_or_another_all_to_all_is_refused() {
        let body = MpiExpertLink::read(1, tag(4), 7, message(7, 4, &[2.5, -1.0])).unwrap();
        assert_eq!(body, vec![2.5, -1.0]);
        let stale = MpiExpertLink::read(1, tag(4), 7, message(7, 3, &[2.5])).unwrap_err();
        assert!(stale.to_string().contains("refused as stale"), "{stale}");
        let newer = MpiExpertLink::read(1, tag(4), 7, message(7, 5, &[])).unwrap_err();
        assert!(newer.to_string().contains("worker 1 is at"), "{newer}");
        let other = MpiExpertLink::read(1, tag(4), 8, message(7, 4, &[])).unwrap_err();
        assert!(other.to_string().contains("this worker at 8"), "{other}");
        assert!(MpiExpertLink::read(1, tag(4), 7, vec![7.0, 4.0]).is_err());
    }
}
