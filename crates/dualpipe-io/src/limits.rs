//! The most bytes read from each kind of input file, with the reason for each, so every reader
//! says the same thing about the same kind of file.
//!
//! | kind | cap | files |
//! |---|---:|---|
//! | [`DOCUMENT`] | 64 MiB | plans, profiles, schedules, cluster files, placements, strategies |
//! | [`TABLE`] | 256 MiB | job traces, expert loads |
//! | [`PROMPT`] | 1 MiB | prompts |
//! | [`MANIFEST`] | 16 MiB | checkpoint manifests and part-manifests |
//! | [`POINTER`] | 256 B | a checkpoint folder's `latest` |
//! | [`RUN_LOG`] | 1 GiB | run logs (`report`) |
//! | [`TENSORS`] | 64 GiB | weights and checkpoint tensor files (readers also cap at memory) |
//! | [`DATA`] | 4 GiB | training text (readers also cap at memory) |
//!
//! A reader that holds the whole file in memory may lower a cap to what the memory holds
//! ([`Limit::at_most`]).

use std::borrow::Cow;

/// The most bytes one input may have, and where that number comes from (for the message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// The cap in bytes.
    pub bytes: u64,
    /// Where it comes from (`the cap of a settings file`).
    pub why: Cow<'static, str>,
}

impl Limit {
    /// A cap of `bytes`, explained by `why`.
    pub const fn new(bytes: u64, why: &'static str) -> Limit {
        Limit {
            bytes,
            why: Cow::Borrowed(why),
        }
    }

    /// This cap, or `bytes` (explained by `why`) when that is lower.
    pub fn at_most(self, bytes: u64, why: impl Into<String>) -> Limit {
        if bytes < self.bytes {
            Limit {
                bytes,
                why: Cow::Owned(why.into()),
            }
        } else {
            self
        }
    }
}

/// Plans, profiles, schedules, cluster files, placements and strategies: 64 MiB.
pub const DOCUMENT: Limit = Limit::new(64 << 20, "the cap of a settings file");
/// Job traces and expert-load tables: 256 MiB.
pub const TABLE: Limit = Limit::new(256 << 20, "the cap of a table file");
/// A prompt: 1 MiB.
pub const PROMPT: Limit = Limit::new(1 << 20, "the cap of a prompt");
/// A checkpoint's manifest or part-manifest: 16 MiB.
pub const MANIFEST: Limit = Limit::new(16 << 20, "the cap of a checkpoint manifest");
/// A checkpoint folder's `latest` pointer: 256 bytes.
pub const POINTER: Limit = Limit::new(256, "the cap of a checkpoint pointer");
/// The bytes of [`RUN_LOG`], for constants.
pub const RUN_LOG_BYTES: u64 = 1 << 30;
/// A run log read by `report`: 1 GiB.
pub const RUN_LOG: Limit = Limit::new(RUN_LOG_BYTES, "the cap of a run log");
/// Weights and checkpoint tensor files: 64 GiB (and never more than the memory holds).
pub const TENSORS: Limit = Limit::new(64 << 30, "the cap of a tensor file");
/// The bytes of [`DATA`], for constants.
pub const DATA_BYTES: u64 = 4 << 30;
/// A training text: 4 GiB (and never more than the memory holds).
pub const DATA: Limit = Limit::new(DATA_BYTES, "the cap of `data`");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_keeps_the_lower_cap_and_its_reason() {
        assert_eq!(DATA.at_most(10, "memory").bytes, 10);
        assert_eq!(DATA.at_most(10, "memory").why, "memory");
        assert_eq!(PROMPT.at_most(u64::MAX, "memory"), PROMPT);
    }
}
