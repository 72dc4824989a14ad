//! The exchange's settings, with their defaults in one place.

use std::time::Duration;

use crate::codec::{Codec, Compression, Rounding};
use crate::layout::DEFAULT_BUCKET_BYTES;
use crate::DpError;

/// Default values per scale of int8 and 1bit.
pub const DEFAULT_CHUNK_VALUES: usize = 2048;

/// Default wait for a peer's message before the exchange gives up.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// What the exchange returns: the workers' gradients summed (in worker order), then divided.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduce {
    /// The sum divided by the group size (the DDP convention).
    #[default]
    Mean,
    /// The sum.
    Sum,
    /// The sum divided by this number. DualPipe keeps two copies of every stage, whose
    /// gradients are summed: its group of stage `s` has `2 D` members (both copies of every
    /// replica, listed replica by replica, copy of direction 0 first, so `D = 1` adds them in
    /// the order `sum_stage_copies` uses), and `Divide(D)` averages over the replicas.
    Divide(usize),
}

impl Reduce {
    /// The divisor for a group of `workers` (`None`: no division).
    pub fn divisor(self, workers: usize) -> Option<usize> {
        match self {
            Reduce::Mean => Some(workers),
            Reduce::Sum => None,
            Reduce::Divide(n) => Some(n),
        }
    }
}

/// How a data-parallel group exchanges gradients.
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeConfig {
    /// The wire format after the warm-up (`--gradient-compression`).
    pub compression: Compression,
    /// Keep what compression dropped and add it to the next step (`--no-error-feedback`
    /// turns it off); only matters for a lossy compression.
    pub error_feedback: bool,
    /// Steps `0..compression_warmup` are exchanged in `warmup_compression`
    /// (`--compression-warmup`).
    pub compression_warmup: u64,
    /// The wire format of the warm-up and of the refresh steps (`none` by default; 1-bit
    /// Adam's runs use int8). Error feedback is kept and used only on the steps of
    /// `compression`, so a refresh step neither adds nor changes the residual of the others.
    pub warmup_compression: Compression,
    /// After the warm-up, every step whose 1-based number is a multiple of this is exchanged
    /// in `warmup_compression` (1-bit Adam's variance refresh); 0: none. With
    /// `refresh_doubling`, only the multiples `refresh_every · 2^i` are.
    pub refresh_every: u64,
    /// The refresh steps double (`refresh_every`, twice it, four times it, ...: 0/1 Adam's
    /// growing intervals) instead of recurring every `refresh_every` steps.
    pub refresh_doubling: bool,
    /// Bucket budget in bytes of uncompressed gradients (`--bucket-mb`).
    pub bucket_bytes: usize,
    /// Values per scale for int8 and 1bit.
    pub chunk_values: usize,
    /// int8's rounding.
    pub rounding: Rounding,
    /// Mean or sum.
    pub reduce: Reduce,
    /// How long to wait for a peer's message.
    pub timeout: Duration,
}

impl Default for ExchangeConfig {
    fn default() -> Self {
        ExchangeConfig {
            compression: Compression::None,
            error_feedback: true,
            compression_warmup: 0,
            warmup_compression: Compression::None,
            refresh_every: 0,
            refresh_doubling: false,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            chunk_values: DEFAULT_CHUNK_VALUES,
            rounding: Rounding::Nearest,
            reduce: Reduce::Mean,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl ExchangeConfig {
    /// Checks the settings.
    pub fn check(&self) -> Result<(), DpError> {
        if self.bucket_bytes == 0 {
            return Err(DpError::Config(
                "the bucket size is 0 bytes; give `bucket_bytes` a positive size".into(),
            ));
        }
        if self.chunk_values == 0 {
            return Err(DpError::Config(
                "chunk_values is 0; every scale needs at least one value".into(),
            ));
        }
        if self.reduce == Reduce::Divide(0) {
            return Err(DpError::Config("Reduce::Divide(0) divides by zero".into()));
        }
        if self.timeout.is_zero() {
            return Err(DpError::Config("the exchange timeout is 0".into()));
        }
        Ok(())
    }

    /// Whether `step` (0-based) is a refresh step: after the warm-up, its 1-based number a
    /// multiple of `refresh_every` (with `refresh_doubling`, `refresh_every` times a power of
    /// two).
    pub fn is_refresh(&self, step: u64) -> bool {
        let (t, k) = (step + 1, self.refresh_every);
        k > 0
            && step >= self.compression_warmup
            && t.is_multiple_of(k)
            && (!self.refresh_doubling || (t / k).is_power_of_two())
    }

    /// The compression used at `step`: `warmup_compression` during the warm-up and on refresh
    /// steps, else `compression`.
    pub fn compression_at(&self, step: u64) -> Compression {
        if step < self.compression_warmup || self.is_refresh(step) {
            self.warmup_compression
        } else {
            self.compression
        }
    }

    /// Whether `step` keeps and uses error feedback: a lossy `compression` on one of its own
    /// steps (not the warm-up's or a refresh's), unless error feedback is off.
    pub fn feedback_at(&self, step: u64) -> bool {
        self.error_feedback
            && self.compression.is_lossy()
            && step >= self.compression_warmup
            && !self.is_refresh(step)
    }

    /// The codec used at `step`.
    pub fn codec_at(&self, step: u64) -> Codec {
        Codec {
            compression: self.compression_at(step),
            chunk_values: self.chunk_values,
            rounding: self.rounding,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1-based step numbers in `1..=steps` that `config` exchanges in `warmup_compression`.
    fn warmup_format_steps(config: &ExchangeConfig, steps: u64) -> Vec<u64> {
        (0..steps)
            .filter(|&s| config.compression_at(s) == config.warmup_compression)
            .map(|s| s + 1)
            .collect()
    }

    #[test]
    fn refreshes_recur_every_period_or_double() {
        let every = ExchangeConfig {
            compression: Compression::OneBit,
            warmup_compression: Compression::Int8,
            compression_warmup: 4,
            refresh_every: 8,
            ..ExchangeConfig::default()
        };
        assert_eq!(
            warmup_format_steps(&every, 40),
            [1, 2, 3, 4, 8, 16, 24, 32, 40]
        );
        let doubling = ExchangeConfig {
            refresh_doubling: true,
            ..every.clone()
        };
        assert_eq!(
            warmup_format_steps(&doubling, 300),
            [1, 2, 3, 4, 8, 16, 32, 64, 128, 256]
        );
        // Error feedback only on the 1-bit steps.
        assert!(!doubling.feedback_at(3) && doubling.feedback_at(4));
        assert!(!doubling.feedback_at(15) && doubling.feedback_at(16));
        // No refresh inside the warm-up, and none at all with a period of 0.
        let long = ExchangeConfig {
            compression_warmup: 20,
            ..doubling.clone()
        };
        assert_eq!(warmup_format_steps(&long, 70).len(), 20 + 2, "32 and 64");
        let never = ExchangeConfig {
            refresh_every: 0,
            ..doubling
        };
        assert_eq!(warmup_format_steps(&never, 300), [1, 2, 3, 4]);
    }
}
