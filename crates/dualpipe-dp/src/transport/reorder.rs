//! A transport wrapper that delays and reorders messages, for testing the logical clock.

use std::time::Duration;

use super::{GradTransport, Incoming, TransportError, TransportStats};
use crate::message::MsgHeader;

/// Wraps a transport and scrambles timing and order with a seeded generator: sends are held
/// back and released later in a random order (some only when the step's exchange is finished
/// or the worker waits), and each receive hands out a random one of the messages that have
/// arrived, sometimes after a short pause. Nothing is lost or duplicated, so an exchange over
/// it must give bit-identical results to one over the plain transport.
#[derive(Debug)]
pub struct Reordering<X> {
    inner: X,
    state: u64,
    held: Vec<(usize, MsgHeader, Vec<u8>)>,
    pool: Vec<Incoming>,
}

impl<X: GradTransport> Reordering<X> {
    /// Wraps `inner`; `seed` fixes the scrambling.
    pub fn new(inner: X, seed: u64) -> Self {
        Reordering {
            inner,
            state: seed ^ 0x5851_f42d_4c95_7f2d,
            held: Vec::new(),
            pool: Vec::new(),
        }
    }

    /// The wrapped transport.
    pub fn into_inner(self) -> X {
        self.inner
    }

    fn next(&mut self) -> u64 {
        // xorshift64*
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Sends held messages in a random order, each with probability `1 / every`.
    fn release(&mut self, every: u64) -> Result<(), TransportError> {
        let mut i = 0;
        while i < self.held.len() {
            if self.next().is_multiple_of(every) {
                let j = i + self.below(self.held.len() - i);
                let (to, header, body) = self.held.swap_remove(j);
                self.inner.send(to, header, body)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }
}

impl<X: GradTransport> GradTransport for Reordering<X> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn send(&mut self, to: usize, header: MsgHeader, body: Vec<u8>) -> Result<(), TransportError> {
        if to >= self.inner.size() {
            return Err(TransportError(format!("no worker {to}")));
        }
        self.held.push((to, header, body));
        self.release(3)
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Incoming>, TransportError> {
        self.release(2)?;
        while let Some(m) = self.inner.recv(Duration::ZERO)? {
            self.pool.push(m);
        }
        if self.pool.is_empty() {
            // Waiting: everything held goes out, so a group of waiting workers cannot stall.
            self.release(1)?;
            match self.inner.recv(timeout)? {
                Some(m) => self.pool.push(m),
                None => return Ok(None),
            }
        }
        if self.next().is_multiple_of(4) {
            std::thread::sleep(Duration::from_micros(self.next() % 200));
            while let Some(m) = self.inner.recv(Duration::ZERO)? {
                self.pool.push(m);
            }
        }
        let i = self.below(self.pool.len());
        Ok(Some(self.pool.swap_remove(i)))
    }

    fn stats(&self) -> TransportStats {
        self.inner.stats()
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        self.release(1)?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{MsgKey, Part};
    use crate::transport::ChannelTransport;
    use crate::Compression;

    fn header(bucket: usize) -> MsgHeader {
        MsgHeader {
            key: MsgKey {
                step: 0,
                stage: 0,
                bucket,
                part: Part::Scatter { shard: 1 },
            },
            compression: Compression::None,
            values: 0,
        }
    }

    #[test]
    fn messages_arrive_all_once_in_a_scrambled_seeded_order() {
        let order = |seed: u64| {
            let mut g = ChannelTransport::group(2);
            let b = g.pop().unwrap();
            let mut a = Reordering::new(g.pop().unwrap(), seed);
            let mut b = Reordering::new(b, seed + 1);
            for bucket in 0..50 {
                a.send(1, header(bucket), Vec::new()).unwrap();
            }
            a.flush().unwrap();
            let mut got = Vec::new();
            while let Some(m) = b.recv(Duration::from_millis(10)).unwrap() {
                got.push(m.header.key.bucket);
            }
            got
        };
        let got = order(1);
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>(), "each message once");
        assert_ne!(got, sorted, "the order is scrambled");
        assert_eq!(order(1), got, "by the seed alone");
        assert_ne!(order(2), got);
    }
}
