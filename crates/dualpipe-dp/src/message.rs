//! The logical clock's stamp on every gradient message, and its byte form.
//!
//! A message is named by a [`MsgKey`] (step, stage, bucket, part) and its sender; the
//! [`MsgHeader`] adds what the body holds (its compression and value count) so a receiver can
//! check both against its own configuration before decoding anything.
//!
//! Encoded header (46 bytes, integers little-endian): `b"DPG1"`, step `u64`, stage `u64`,
//! bucket `u64`, part kind `u8` (0 = reduce-scatter contribution, 1 = all-gather result), shard
//! `u64`, compression code `u8` ([`Compression::code`]), value count `u64`.

use std::fmt;

use crate::Compression;

/// Which half of a bucket's exchange a message belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// A worker's contribution to shard `shard`, sent to the shard's owner (reduce-scatter).
    Scatter {
        /// The shard (= the owning worker).
        shard: usize,
    },
    /// The owner's averaged shard `shard`, sent to every other worker (all-gather).
    Gather {
        /// The shard (= the owning worker).
        shard: usize,
    },
}

/// The logical clock's name for a message: (step, stage, bucket, part).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsgKey {
    /// The training step.
    pub step: u64,
    /// The pipeline stage whose data-parallel group exchanges it.
    pub stage: usize,
    /// The bucket.
    pub bucket: usize,
    /// Which part of the bucket's exchange.
    pub part: Part,
}

impl fmt::Display for MsgKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, shard) = match self.part {
            Part::Scatter { shard } => ("reduce-scatter contribution", shard),
            Part::Gather { shard } => ("all-gather result", shard),
        };
        write!(
            f,
            "the {what} for shard {shard} of bucket {} of stage {} at step {}",
            self.bucket, self.stage, self.step
        )
    }
}

/// A message's header: its key and what its body holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsgHeader {
    /// The logical clock's stamp.
    pub key: MsgKey,
    /// How the body is encoded.
    pub compression: Compression,
    /// How many values the body holds.
    pub values: usize,
}

/// Bytes of an encoded [`MsgHeader`].
pub const HEADER_BYTES: usize = 46;

const MAGIC: [u8; 4] = *b"DPG1";

/// A header that cannot be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a malformed gradient message header: {0}")]
pub struct HeaderError(pub String);

impl MsgHeader {
    /// The header's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES);
        out.extend_from_slice(&MAGIC);
        let (kind, shard) = match self.key.part {
            Part::Scatter { shard } => (0u8, shard),
            Part::Gather { shard } => (1u8, shard),
        };
        out.extend_from_slice(&self.key.step.to_le_bytes());
        out.extend_from_slice(&(self.key.stage as u64).to_le_bytes());
        out.extend_from_slice(&(self.key.bucket as u64).to_le_bytes());
        out.push(kind);
        out.extend_from_slice(&(shard as u64).to_le_bytes());
        out.push(self.compression.code());
        out.extend_from_slice(&(self.values as u64).to_le_bytes());
        out
    }

    /// Parses a header.
    pub fn decode(bytes: &[u8]) -> Result<MsgHeader, HeaderError> {
        if bytes.len() != HEADER_BYTES {
            return Err(HeaderError(format!(
                "{} bytes instead of {HEADER_BYTES}",
                bytes.len()
            )));
        }
        if bytes[..4] != MAGIC {
            return Err(HeaderError(
                "no gradient-exchange magic (another program's message on this link?)".into(),
            ));
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let usize_at = |at: usize| {
            usize::try_from(u64_at(at))
                .map_err(|_| HeaderError(format!("field at byte {at} is too large")))
        };
        let shard = usize_at(29)?;
        let part = match bytes[28] {
            0 => Part::Scatter { shard },
            1 => Part::Gather { shard },
            k => return Err(HeaderError(format!("unknown part kind {k}"))),
        };
        let compression = Compression::from_code(bytes[37])
            .ok_or_else(|| HeaderError(format!("unknown compression code {}", bytes[37])))?;
        Ok(MsgHeader {
            key: MsgKey {
                step: u64_at(4),
                stage: usize_at(12)?,
                bucket: usize_at(20)?,
                part,
            },
            compression,
            values: usize_at(38)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_malformed_ones_are_errors() {
        for (part, compression) in [
            (Part::Scatter { shard: 3 }, Compression::OneBit),
            (Part::Gather { shard: 0 }, Compression::None),
        ] {
            let h = MsgHeader {
                key: MsgKey {
                    step: u64::MAX - 1,
                    stage: 7,
                    bucket: 12,
                    part,
                },
                compression,
                values: 1 << 20,
            };
            let bytes = h.encode();
            assert_eq!(bytes.len(), HEADER_BYTES);
            assert_eq!(MsgHeader::decode(&bytes), Ok(h));
            for cut in 0..bytes.len() {
                assert!(MsgHeader::decode(&bytes[..cut]).is_err());
            }
            let mut bad = bytes.clone();
            bad[28] = 9;
            assert!(MsgHeader::decode(&bad).unwrap_err().0.contains("part kind"));
            let mut bad = bytes.clone();
            bad[37] = 9;
            assert!(MsgHeader::decode(&bad).is_err());
            let mut bad = bytes;
            bad[0] = b'X';
            assert!(MsgHeader::decode(&bad).unwrap_err().0.contains("magic"));
        }
    }
}
