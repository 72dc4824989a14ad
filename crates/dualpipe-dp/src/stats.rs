//! What an exchange sent and how long it took.

/// What an exchange sent, over one step or over its lifetime.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ExchangeStats {
    /// Gradient bytes the transport sent (message bodies, counted by the transport).
    pub grad_bytes_sent: u64,
    /// Header bytes the transport sent (0 in-process).
    pub header_bytes_sent: u64,
    /// What the same messages would have carried uncompressed (`values * size_of::<T>()`).
    pub grad_bytes_uncompressed: u64,
    /// Messages sent.
    pub messages: u64,
    /// Seconds spent inside exchange calls (start, progress, finish): compression included.
    pub exchange_seconds: f64,
    /// Seconds [`crate::GradExchange::finish`] took: the part of the exchange nothing else overlapped.
    pub finish_seconds: f64,
}

impl ExchangeStats {
    /// Adds `other`'s bytes, messages and seconds to these.
    pub fn add(&mut self, other: &ExchangeStats) {
        self.grad_bytes_sent += other.grad_bytes_sent;
        self.header_bytes_sent += other.header_bytes_sent;
        self.grad_bytes_uncompressed += other.grad_bytes_uncompressed;
        self.messages += other.messages;
        self.exchange_seconds += other.exchange_seconds;
        self.finish_seconds += other.finish_seconds;
    }
}
