//! Byte-level data: windows over any file's bytes, and the seeded addition task.
//!
//! A *window* is a run of `seq_len + 1` consecutive bytes; the windows of a text are its
//! consecutive non-overlapping runs (a last partial run dropped). Window `w` gives the inputs
//! `bytes[w(L+1) .. w(L+1)+L]` and the targets shifted by one byte.

use std::collections::HashSet;
use std::sync::Arc;

use rand::Rng;

use super::{TokenBatch, TokenMicroBatch};
use crate::error::NnError;
use crate::rng::{self, Purpose};

/// The non-overlapping windows of `seq_len + 1` bytes of a text: a part of a buffer that may
/// be shared with other parts (a text's training and validation windows share one buffer).
#[derive(Clone, Debug)]
pub struct ByteWindows {
    bytes: Arc<Vec<u8>>,
    start: usize,
    end: usize,
    seq_len: usize,
}

impl ByteWindows {
    /// Windows over `bytes`; an error when not even one window fits.
    pub fn new(bytes: Arc<[u8]>, seq_len: usize, what: &str) -> Result<Self, NnError> {
        let len = bytes.len();
        Self::part(Arc::new(bytes.to_vec()), 0..len, seq_len, what, "")
    }

    /// Windows over `bytes[range]` (the buffer is shared, not copied); an error naming `what`
    /// when not even one window fits, `advice` added to it.
    fn part(
        bytes: Arc<Vec<u8>>,
        range: std::ops::Range<usize>,
        seq_len: usize,
        what: &str,
        advice: &str,
    ) -> Result<Self, NnError> {
        if seq_len == 0 {
            return Err(NnError::Config("seq_len must be at least 1".into()));
        }
        if range.len() < seq_len + 1 {
            return Err(NnError::Config(format!(
                "{what} has {} bytes, fewer than one window of seq_len + 1 = {}; use a longer file or a smaller `seq_len`{advice}",
                range.len(),
                seq_len + 1
            )));
        }
        Ok(ByteWindows {
            bytes,
            start: range.start,
            end: range.end,
            seq_len,
        })
    }

    /// Number of windows.
    pub fn len(&self) -> usize {
        (self.end - self.start) / (self.seq_len + 1)
    }

    /// Whether there is no window (never, once built).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens per sequence.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Window `w` (of [`ByteWindows::len`]) as `seq_len + 1` bytes.
    pub fn window(&self, w: usize) -> &[u8] {
        let n = self.seq_len + 1;
        &self.bytes[self.start + w * n..self.start + (w + 1) * n]
    }

    /// The micro-batch of the given windows: inputs are each window's first `seq_len` bytes,
    /// targets its last `seq_len`.
    pub fn micro_batch(&self, windows: &[usize]) -> TokenMicroBatch {
        let l = self.seq_len;
        let mut inputs = Vec::with_capacity(windows.len() * l);
        let mut targets = Vec::with_capacity(windows.len() * l);
        for &w in windows {
            let win = self.window(w % self.len());
            inputs.extend(win[..l].iter().map(|&b| u32::from(b)));
            targets.extend(win[1..].iter().map(|&b| u32::from(b)));
        }
        TokenMicroBatch {
            inputs: inputs.into(),
            targets: targets.into(),
            rows: windows.len(),
            seq: l,
        }
    }
}

/// A text split into training and validation windows: the validation part is the text's last
/// `⌊len · validation_fraction⌋` bytes.
#[derive(Clone, Debug)]
pub struct TextData {
    /// Windows of the training bytes.
    pub train: ByteWindows,
    /// Windows of the validation bytes (`None` for a fraction of 0).
    pub validation: Option<ByteWindows>,
    /// Seed of the shuffled order (`None`: the documented unshuffled order).
    pub shuffle_seed: Option<u64>,
}

impl TextData {
    /// Splits `bytes`; `validation_fraction` in `[0, 1)`. The bytes are copied once into the
    /// buffer both parts share ([`TextData::from_vec`] takes a buffer without copying).
    pub fn new(
        bytes: &[u8],
        seq_len: usize,
        validation_fraction: f64,
        shuffle_seed: Option<u64>,
    ) -> Result<Self, NnError> {
        Self::from_vec(bytes.to_vec(), seq_len, validation_fraction, shuffle_seed)
    }

    /// [`TextData::new`] over a buffer it keeps: the training and the validation windows are
    /// two parts of it, so a text is held in memory once.
    pub fn from_vec(
        bytes: Vec<u8>,
        seq_len: usize,
        validation_fraction: f64,
        shuffle_seed: Option<u64>,
    ) -> Result<Self, NnError> {
        if !(0.0..1.0).contains(&validation_fraction) {
            return Err(NnError::Config(format!(
                "validation fraction {validation_fraction} must be in [0, 1)"
            )));
        }
        let len = bytes.len();
        let val_len = (len as f64 * validation_fraction).floor() as usize;
        let split = len - val_len;
        let bytes = Arc::new(bytes);
        let validation = (val_len > 0)
            .then(|| {
                ByteWindows::part(
                    bytes.clone(),
                    split..len,
                    seq_len,
                    "the validation part",
                    &format!(
                        ", or hold out more (`validation_fraction` {validation_fraction}; 0 \
                         holds nothing out)"
                    ),
                )
            })
            .transpose()?;
        let advice = if val_len > 0 {
            format!(", or hold out less (`validation_fraction` {validation_fraction})")
        } else {
            String::new()
        };
        Ok(TextData {
            train: ByteWindows::part(bytes, 0..split, seq_len, "the training part", &advice)?,
            validation,
            shuffle_seed,
        })
    }

    /// The window of row `row` of global micro-batch `mb` of step `step` (0-based): without
    /// shuffling `((step · micro_batches + mb) · rows + row) mod windows`; with, a seeded
    /// uniform draw from the stream (seed, step, mb).
    pub fn window_index(
        &self,
        step: usize,
        micro_batches: usize,
        mb: usize,
        rows: usize,
        row: usize,
    ) -> usize {
        let n = self.train.len();
        match self.shuffle_seed {
            None => ((step * micro_batches + mb) * rows + row) % n,
            Some(seed) => {
                let mut r = rng::stream(seed, Purpose::Text, 16 + step as u64, mb as u64);
                (0..=row).map(|_| r.random_range(0..n)).last().unwrap_or(0)
            }
        }
    }

    /// Every micro-batch of step `step`: `micro_batches` of `rows` sequences.
    pub fn batch(&self, step: usize, micro_batches: usize, rows: usize) -> TokenBatch {
        self.batch_range(step, micro_batches, 0..micro_batches, rows)
    }

    /// Global micro-batches `range` of step `step`, of `global` in the step (a data-parallel
    /// replica's share), as micro-batches `0 .. range.len()`.
    pub fn batch_range(
        &self,
        step: usize,
        global: usize,
        range: std::ops::Range<usize>,
        rows: usize,
    ) -> TokenBatch {
        Arc::new(
            range
                .map(|mb| {
                    let windows: Vec<usize> = (0..rows)
                        .map(|r| self.window_index(step, global, mb, rows, r))
                        .collect();
                    self.train.micro_batch(&windows)
                })
                .collect(),
        )
    }
}

/// The embedded default task: seeded multi-digit additions `"123+456=579\n"`, learned as text
/// and scored as the exact-match accuracy of greedy-decoded answers on held-out problems.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdditionTask {
    /// Most digits of each operand.
    pub digits: u32,
    /// Seed of the problems.
    pub seed: u64,
}

/// One held-out problem: the prompt `"a+b="` and the expected answer `"c"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// `"a+b="`.
    pub prompt: String,
    /// The sum's decimal digits.
    pub answer: String,
}

impl AdditionTask {
    fn draw(&self, r: &mut rand_chacha::ChaCha8Rng) -> (u64, u64) {
        let max = 10u64.pow(self.digits.min(18));
        (r.random_range(0..max), r.random_range(0..max))
    }

    /// `count` training problems as text, one per line.
    pub fn training_text(&self, count: usize) -> Vec<u8> {
        let mut r = rng::stream(self.seed, Purpose::Text, 0, 0);
        let mut text = String::new();
        for _ in 0..count {
            let (a, b) = self.draw(&mut r);
            text.push_str(&format!("{a}+{b}={}\n", a + b));
        }
        text.into_bytes()
    }

    /// `count` held-out problems, none of which is among the first `training` training ones.
    pub fn held_out(&self, count: usize, training: usize) -> Vec<Problem> {
        let mut seen = HashSet::new();
        let mut r = rng::stream(self.seed, Purpose::Text, 0, 0);
        for _ in 0..training {
            seen.insert(self.draw(&mut r));
        }
        let mut r = rng::stream(self.seed, Purpose::Text, 1, 0);
        let mut out = Vec::with_capacity(count);
        // At most 64 draws per problem: a tiny operand range cannot loop forever.
        for _ in 0..count.saturating_mul(64) {
            if out.len() == count {
                break;
            }
            let (a, b) = self.draw(&mut r);
            if seen.insert((a, b)) {
                out.push(Problem {
                    prompt: format!("{a}+{b}="),
                    answer: (a + b).to_string(),
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_follow_the_documented_order() {
        let bytes: Vec<u8> = (0..50u8).collect();
        let data = TextData::new(&bytes, 4, 0.2, None).unwrap();
        // 40 training bytes -> 8 windows of 5; validation = the last 10 bytes.
        assert_eq!(data.train.len(), 8);
        assert_eq!(
            data.validation.as_ref().unwrap().window(0),
            &[40, 41, 42, 43, 44]
        );
        let batch = data.batch(1, 2, 3);
        // step 1, mb 1, row 0 -> window (1·2 + 1)·3 + 0 = 9 mod 8 = 1.
        assert_eq!(&batch[1].inputs[..4], &[5, 6, 7, 8]);
        assert_eq!(&batch[1].targets[..4], &[6, 7, 8, 9]);
        assert!(TextData::new(&bytes[..4], 4, 0.0, None).is_err());
    }

    #[test]
    fn both_parts_share_one_buffer_and_a_short_part_names_the_fraction() {
        let bytes: Vec<u8> = (0..50u8).collect();
        let data = TextData::from_vec(bytes, 4, 0.2, None).unwrap();
        let validation = data.validation.as_ref().unwrap();
        assert!(Arc::ptr_eq(&data.train.bytes, &validation.bytes));
        assert_eq!(validation.len(), 2);
        assert_eq!(data.train.window(7), &[35, 36, 37, 38, 39]);
        // 40 bytes, 10% held out: the validation part's 4 bytes hold no window of 17.
        let err = TextData::new(&[0u8; 40], 16, 0.1, None).unwrap_err();
        assert!(
            err.to_string().contains("`validation_fraction` 0.1"),
            "{err}"
        );
    }

    #[test]
    fn a_replicas_range_is_its_share_of_the_global_batch() {
        let bytes: Vec<u8> = (0..200u8).collect();
        for seed in [None, Some(4)] {
            let data = TextData::new(&bytes, 4, 0.1, seed).unwrap();
            let whole = data.batch(3, 6, 2);
            let second = data.batch_range(3, 6, 3..6, 2);
            assert_eq!(second.len(), 3);
            for (m, mb) in second.iter().enumerate() {
                assert_eq!(mb.inputs, whole[3 + m].inputs, "{seed:?} {m}");
                assert_eq!(mb.targets, whole[3 + m].targets);
            }
        }
    }

    #[test]
    fn addition_problems_are_seeded_and_held_out() {
        let task = AdditionTask { digits: 2, seed: 5 };
        let text = String::from_utf8(task.training_text(100)).unwrap();
        assert_eq!(text.lines().count(), 100);
        for line in text.lines() {
            let (ab, c) = line.split_once('=').unwrap();
            let (a, b) = ab.split_once('+').unwrap();
            assert_eq!(
                a.parse::<u64>().unwrap() + b.parse::<u64>().unwrap(),
                c.parse::<u64>().unwrap()
            );
        }
        let held = task.held_out(20, 100);
        assert_eq!(held.len(), 20);
        for p in &held {
            assert!(
                !text.lines().any(|l| l.starts_with(&p.prompt)),
                "{p:?} leaked"
            );
        }
        assert_eq!(task.training_text(10), task.training_text(10));
    }
}
