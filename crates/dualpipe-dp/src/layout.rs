//! Buckets: consecutive parameters grouped up to a byte budget, as PyTorch DDP does.

use std::ops::Range;

use crate::DpError;

/// The default bucket size: 25 MiB, DDP's `bucket_cap_mb`.
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// How a stage's gradients are cut into buckets.
///
/// Parameters keep their order and are never split: a bucket takes parameters while its bytes
/// stay within the budget, and a parameter larger than the budget gets a bucket of its own.
/// List the parameters in the order their gradients become final (the reverse of the forward
/// order in a backward pass) so the first bucket can start first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketLayout {
    /// Per bucket: its parameters (a range of parameter indices).
    params: Vec<Range<usize>>,
    /// Per parameter: (bucket, range of values in the bucket).
    spans: Vec<(usize, Range<usize>)>,
    /// Per bucket: number of values.
    lens: Vec<usize>,
}

impl BucketLayout {
    /// Groups parameters of `param_lens` values each into buckets of at most `bucket_bytes`,
    /// counting `value_bytes` per value.
    pub fn new(
        param_lens: &[usize],
        bucket_bytes: usize,
        value_bytes: usize,
    ) -> Result<Self, DpError> {
        if bucket_bytes == 0 || value_bytes == 0 {
            return Err(DpError::Config(
                "the bucket size must be positive (`bucket_bytes`)".into(),
            ));
        }
        let cap = (bucket_bytes / value_bytes).max(1);
        let mut layout = BucketLayout {
            params: Vec::new(),
            spans: Vec::with_capacity(param_lens.len()),
            lens: Vec::new(),
        };
        let mut total = 0usize;
        for (p, &len) in param_lens.iter().enumerate() {
            total = total
                .checked_add(len)
                .and_then(|t| t.checked_mul(value_bytes).map(|_| t))
                .ok_or_else(|| DpError::Config("the gradients are too large to address".into()))?;
            let open = layout.lens.last().copied();
            match open {
                Some(used) if used + len <= cap || used == 0 => {
                    let b = layout.lens.len() - 1;
                    layout.spans.push((b, used..used + len));
                    layout.lens[b] += len;
                    layout.params[b].end = p + 1;
                }
                _ => {
                    layout.spans.push((layout.lens.len(), 0..len));
                    layout.lens.push(len);
                    layout.params.push(p..p + 1);
                }
            }
        }
        Ok(layout)
    }

    /// One bucket per entry of `lens` (one parameter each).
    pub fn from_bucket_lens(lens: &[usize]) -> Self {
        BucketLayout {
            params: (0..lens.len()).map(|b| b..b + 1).collect(),
            spans: lens.iter().enumerate().map(|(b, &n)| (b, 0..n)).collect(),
            lens: lens.to_vec(),
        }
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.lens.len()
    }

    /// Number of values in `bucket`.
    pub fn len(&self, bucket: usize) -> usize {
        self.lens[bucket]
    }

    /// Whether there are no values at all.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().all(|&n| n == 0)
    }

    /// The parameters in `bucket` (indices into the list given to [`BucketLayout::new`]).
    pub fn params(&self, bucket: usize) -> Range<usize> {
        self.params[bucket].clone()
    }

    /// Where parameter `param` lives: its bucket and its values' range in that bucket.
    pub fn span(&self, param: usize) -> (usize, Range<usize>) {
        self.spans[param].clone()
    }

    /// Total values over all buckets.
    pub fn total_values(&self) -> usize {
        self.lens.iter().sum()
    }

    /// The length of `bucket`, checked against the `got` values given to start it: the bucket
    /// must exist and hold exactly that many.
    pub(crate) fn check_start(&self, bucket: usize, got: usize) -> Result<usize, DpError> {
        let Some(&expected) = self.lens.get(bucket) else {
            return Err(DpError::NoSuchBucket {
                bucket,
                buckets: self.lens.len(),
            });
        };
        if got != expected {
            return Err(DpError::BucketLength {
                bucket,
                expected,
                got,
            });
        }
        Ok(expected)
    }

    /// Shard `shard` of `bucket` among `workers`: the first `len % workers` shards hold one
    /// value more than the others.
    pub fn shard(&self, bucket: usize, shard: usize, workers: usize) -> Range<usize> {
        shard_range(self.lens[bucket], shard, workers)
    }
}

/// Shard `shard` of `len` values split among `workers` as evenly as possible, in order.
pub fn shard_range(len: usize, shard: usize, workers: usize) -> Range<usize> {
    let base = len / workers;
    let extra = len % workers;
    let start = shard * base + shard.min(extra);
    start..start + base + usize::from(shard < extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_fill_buckets_in_order_and_big_ones_stand_alone() {
        let l = BucketLayout::new(&[10, 20, 5, 100, 1, 1], 128, 4).unwrap();
        // 32 values per bucket: [10, 20], [5], [100], [1, 1]
        assert_eq!(l.buckets(), 4);
        assert_eq!(
            (0..4).map(|b| l.len(b)).collect::<Vec<_>>(),
            [30, 5, 100, 2]
        );
        assert_eq!(l.params(0), 0..2);
        assert_eq!(l.params(3), 4..6);
        assert_eq!(l.span(1), (0, 10..30));
        assert_eq!(l.span(5), (3, 1..2));
        assert_eq!(l.total_values(), 137);
        assert!(BucketLayout::new(&[1], 0, 4).is_err());
        assert!(BucketLayout::new(&[usize::MAX, 1], 64, 4).is_err());
        assert_eq!(BucketLayout::new(&[], 64, 4).unwrap().buckets(), 0);
    }

    #[test]
    fn shards_cover_a_bucket_exactly() {
        for len in [0, 1, 7, 100] {
            for workers in 1..6 {
                let mut at = 0;
                for s in 0..workers {
                    let r = shard_range(len, s, workers);
                    assert_eq!(r.start, at);
                    assert!(r.len() <= len / workers + 1);
                    at = r.end;
                }
                assert_eq!(at, len);
            }
        }
    }
}
