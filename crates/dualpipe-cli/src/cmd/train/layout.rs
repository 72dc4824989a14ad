//! `dualpipe train`'s layout flags: `--partition`, `--plan`, `--profile`, `--slow-rank` and
//! `--rebalance-stages` (with its threshold and window). They map onto
//! [`TrainConfig::partition`], [`PlanChoice`], [`profile_gpt`], [`SlowRank`] and
//! [`RebalanceSettings`]; the logic is `dualpipe_train`'s.

use std::path::PathBuf;

use dualpipe_train::partition::{format_partition, parse_partition};
use dualpipe_train::plan_file::PlanChoice;
use dualpipe_train::profile::profile_gpt;
use dualpipe_train::rebalance::Repartition;
use dualpipe_train::rebalance::{RebalanceSettings, SlowRank, DEFAULT_THRESHOLD, DEFAULT_WINDOW};
use dualpipe_train::{Naming, TrainConfig};

use super::args::usage;
use crate::cmd::UsageError;

/// Stage layout flags of `dualpipe train`.
#[derive(clap::Args, Debug, Default)]
pub struct LayoutArgs {
    /// Blocks of each model stage, input to output, e.g. 3,2,2,1 (stage 0 keeps the
    /// embeddings, the last the head); replaces --layers-per-stage.
    #[arg(long, value_name = "B,B,...", conflicts_with = "layers_per_stage")]
    pub partition: Option<String>,
    /// Train with the best plan of `dualpipe plan --format json` in FILE: its schedule,
    /// ranks, micro-batches and partition (a flag given that disagrees is an error).
    #[arg(long, value_name = "FILE", conflicts_with = "schedule_file")]
    pub plan: Option<PathBuf>,
    /// Do not train: measure every block's F, I, W times and bytes in a short profiling
    /// run and write them into FILE as the cost profile `dualpipe plan --profile` reads.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Timed passes of the --profile run (the median is kept).
    #[arg(long, value_name = "N", default_value_t = 5, requires = "profile")]
    pub profile_repeats: usize,
    /// Make rank R's compute F times slower (it sleeps F - 1 times each op's CPU time), for
    /// tests and demonstrations of imbalance, e.g. 1:2.
    #[arg(long, value_name = "R:F")]
    pub slow_rank: Option<String>,
    /// Re-partition the stages while training: when the slowest rank's compute over a
    /// window exceeds the mean by more than --rebalance-threshold, move whole blocks
    /// (weights and optimizer state) between neighbouring stages at a step boundary.
    #[arg(long)]
    pub rebalance_stages: bool,
    /// The imbalance that triggers a move (a share of the mean rank compute).
    #[arg(long, value_name = "SHARE", default_value_t = DEFAULT_THRESHOLD, requires = "rebalance_stages", allow_negative_numbers = true)]
    pub rebalance_threshold: f64,
    /// Steps measured before each re-balancing decision.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_WINDOW, requires = "rebalance_stages")]
    pub rebalance_window: usize,
}

impl LayoutArgs {
    /// Sets the partition, the plan's shape, the slow rank and the rebalancing on `config`;
    /// `defaults` are the model's (a flag equal to its default takes the plan's value).
    pub fn apply(
        &self,
        config: &mut TrainConfig,
        defaults: &TrainConfig,
    ) -> Result<(), UsageError> {
        if let Some(text) = &self.partition {
            let blocks =
                parse_partition(text).map_err(|e| UsageError(format!("--partition {e}")))?;
            config.partition = Some(blocks);
        }
        if let Some(path) = &self.plan {
            let text = std::fs::read_to_string(path).map_err(|e| {
                UsageError(format!(
                    "--plan {}: cannot read it ({e}); give the file `dualpipe plan --format \
                     json --output FILE` wrote",
                    path.display()
                ))
            })?;
            let source = format!("--plan {}", path.display());
            let choice = PlanChoice::from_json(&text, &source).map_err(usage)?;
            choice
                .apply(config, defaults, Naming::Flags)
                .map_err(|e| UsageError(format!("{source}: {}", usage(e).0)))?;
        }
        if let Some(text) = &self.slow_rank {
            let slow = SlowRank::parse(text).map_err(|e| UsageError(format!("--slow-rank {e}")))?;
            config.slow_rank = Some(slow);
        }
        if self.rebalance_stages {
            config.rebalance = Some(RebalanceSettings {
                threshold: self.rebalance_threshold,
                window: self.rebalance_window,
            });
        }
        Ok(())
    }

    /// With `--profile`: measures `config`'s GPT and writes the profile; `true` when it did
    /// (the run then trains nothing).
    pub fn profile_run(&self, config: &TrainConfig, quiet: bool) -> anyhow::Result<bool> {
        let Some(path) = &self.profile else {
            return Ok(false);
        };
        let profile = profile_gpt(config, self.profile_repeats).map_err(usage)?;
        let mut text = serde_json::to_string_pretty(&profile)?;
        text.push('\n');
        crate::cmd::output::write_together(vec![(Some(path.clone()), text.into_bytes())])?;
        if !quiet {
            let total: f64 = profile.layers.iter().map(|l| l.work()).sum();
            eprintln!(
                "profile: {} blocks, {:.3} ms of F+I+W per micro-batch in all, written to {}",
                profile.layers.len(),
                total * 1e3,
                path.display()
            );
        }
        Ok(true)
    }
}

/// One stderr line per re-partitioning of a run.
pub fn report_moves(moves: &[Repartition], quiet: bool) {
    if quiet {
        return;
    }
    for m in moves {
        let seconds: Vec<String> = m.rank_seconds.iter().map(|s| format!("{s:.3}")).collect();
        eprintln!(
            "rebalanced after step {}: blocks {} -> {} (rank compute {} s over the window; \
             slowest predicted {:.3} -> {:.3} s)",
            m.after_steps,
            format_partition(&m.from),
            format_partition(&m.to),
            seconds.join(" "),
            m.predicted.0,
            m.predicted.1
        );
    }
}
