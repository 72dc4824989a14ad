//! Uneven stage partitions: which contiguous run of the GPT's blocks each model stage holds.
//!
//! [`TrainConfig::partition`] lists the blocks of every model stage, input to output
//! (`[3, 2, 2, 1]`: stage 0 holds blocks 0..3, stage 1 blocks 3..5, ...). Stage 0 always keeps
//! the embeddings and the last stage the final norm and the head, whatever blocks they hold.
//! Without a partition every stage holds [`TrainConfig::layers_per_stage`] blocks. Weights and
//! checkpoints are named by model layer, so a run may resume onto any partition of the same
//! model.

use std::ops::Range;

use crate::config::{Field, ModelKind, Naming, TrainConfig};
use crate::error::TrainError;

/// The most blocks a partition may list in all (far above any model that fits in memory;
/// checked before anything per block is allocated).
pub const MAX_BLOCKS: usize = 1 << 20;

impl TrainConfig {
    /// Blocks of the model: the partition's sum, or `layers_per_stage × model_stages`
    /// (saturating).
    pub fn blocks(&self) -> usize {
        match &self.model.partition {
            Some(p) => p.iter().fold(0usize, |a, &b| a.saturating_add(b)),
            None => self
                .model
                .layers_per_stage
                .saturating_mul(self.model_stages()),
        }
    }

    /// The blocks of every model stage, input to output: the partition, or
    /// `layers_per_stage` for each of [`TrainConfig::model_stages`].
    pub fn stage_blocks(&self) -> Vec<usize> {
        match &self.model.partition {
            Some(p) => p.clone(),
            None => vec![self.model.layers_per_stage; self.model_stages()],
        }
    }

    /// The blocks model stage `stage` holds (empty past the last stage).
    pub fn stage_layers(&self, stage: usize) -> Range<usize> {
        layer_range(&self.stage_blocks(), stage)
    }

    /// The partition's own checks: the GPT only, one entry per model stage, each at least 1,
    /// at most [`MAX_BLOCKS`] in all.
    pub(crate) fn check_partition(&self, naming: Naming) -> Result<(), TrainError> {
        if let Some(slow) = &self.parallelism.slow_rank {
            slow.check(self.schedule.ranks, &Field::SlowRank.name(naming))?;
        }
        if let Some(r) = &self.parallelism.rebalance {
            r.check(naming)?;
            if self.model.kind != ModelKind::Gpt || self.parallelism.data_parallel > 1 {
                return Err(TrainError::Config(format!(
                    "{} moves the GPT's blocks within one pipeline replica; drop it for the \
                     MLP or with {} {}",
                    Field::Rebalance.name(naming),
                    Field::DataParallel.name(naming),
                    self.parallelism.data_parallel
                )));
            }
        }
        let Some(p) = &self.model.partition else {
            return Ok(());
        };
        let flag = Field::Partition.name(naming);
        let shown = format_partition(p);
        if self.model.kind != ModelKind::Gpt {
            return Err(TrainError::Config(format!(
                "{flag} {shown}: uneven stages are built for the GPT; drop it for the MLP"
            )));
        }
        let stages = self.model_stages();
        if p.len() != stages {
            return Err(TrainError::Config(format!(
                "{flag} {shown} lists {} stages but the {} schedule on {} {} has {stages} \
                 model stages; give one block count per stage",
                p.len(),
                self.schedule.kind,
                Field::Ranks.name(naming),
                self.schedule.ranks
            )));
        }
        if let Some(s) = p.iter().position(|&b| b == 0) {
            return Err(TrainError::Config(format!(
                "{flag} {shown}: stage {s} holds no block; give every stage at least 1"
            )));
        }
        if p.iter()
            .try_fold(0usize, |a, &b| a.checked_add(b))
            .is_none_or(|n| n > MAX_BLOCKS)
        {
            return Err(TrainError::Config(format!(
                "{flag} {shown}: more than {MAX_BLOCKS} blocks in all; use a smaller model"
            )));
        }
        Ok(())
    }
}

/// The blocks of stage `stage` under `blocks` (block counts per stage, input to output).
pub fn layer_range(blocks: &[usize], stage: usize) -> Range<usize> {
    let start: usize = blocks.iter().take(stage).sum();
    let len = blocks.get(stage).copied().unwrap_or(0);
    start..start + len
}

/// A partition as the flag writes it: `3,2,2,1`.
pub fn format_partition(blocks: &[usize]) -> String {
    blocks
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses `3,2,2,1` (block counts per stage); an error names the bad entry.
pub fn parse_partition(text: &str) -> Result<Vec<usize>, String> {
    text.split(',')
        .map(|part| {
            part.trim().parse::<usize>().map_err(|_| {
                format!("'{text}': '{part}' is not a block count; give counts such as 3,2,2,1")
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelSection;

    #[test]
    fn ranges_follow_the_counts() {
        let p = [3, 2, 2, 1];
        assert_eq!(layer_range(&p, 0), 0..3);
        assert_eq!(layer_range(&p, 1), 3..5);
        assert_eq!(layer_range(&p, 3), 7..8);
        assert_eq!(layer_range(&p, 4), 8..8);
        assert_eq!(parse_partition("3, 2,2,1").unwrap(), p);
        assert!(parse_partition("3,x").unwrap_err().contains("'x'"));
        assert_eq!(format_partition(&p), "3,2,2,1");
    }

    #[test]
    fn checks_name_the_problem() {
        let base = TrainConfig {
            model: ModelSection {
                partition: Some(vec![3, 2, 2, 1]),
                ..TrainConfig::DEFAULT.model
            },
            ..TrainConfig::DEFAULT
        };
        base.check_partition(Naming::Flags).unwrap();
        assert_eq!(base.blocks(), 8);
        assert_eq!(base.gpt().layers, 8);
        let short = TrainConfig {
            model: ModelSection {
                partition: Some(vec![3, 2]),
                ..base.model.clone()
            },
            ..base.clone()
        };
        let err = short
            .check_partition(Naming::Flags)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--partition 3,2 lists 2 stages") && err.contains("4 model stages"),
            "{err}"
        );
        let empty = TrainConfig {
            model: ModelSection {
                partition: Some(vec![3, 0, 2, 1]),
                ..base.model.clone()
            },
            ..base.clone()
        };
        let err = empty
            .check_partition(Naming::Fields)
            .unwrap_err()
            .to_string();
        assert!(err.contains("stage 1 holds no block"), "{err}");
        let mlp = TrainConfig {
            model: ModelSection {
                kind: ModelKind::Mlp,
                ..base.model.clone()
            },
            ..base.clone()
        };
        assert!(mlp.check_partition(Naming::Flags).is_err());
        let huge = TrainConfig {
            model: ModelSection {
                partition: Some(vec![usize::MAX, 1, 1, 1]),
                ..base.model
            },
            ..base
        };
        assert!(huge.check_partition(Naming::Flags).is_err());
    }
}
