//! `dualpipe train`'s layout flags ([`LayoutArgs`]): `--partition`, `--recompute`, `--plan`, `--profile`,
//! `--slow-rank` and `--rebalance-stages` (with its threshold and window). They map onto
//! [`TrainConfig::partition`], [`PlanChoice`], [`SlowRank`] and [`RebalanceSettings`]; the
//! profiling run itself is [`profile_gpt`](dualpipe_train::parallel::stages::profile::profile_gpt).

use std::path::PathBuf;

use super::{message, reworded};
use dualpipe_train::job::plan_file::PlanChoice;
use dualpipe_train::job::Failure;
use dualpipe_train::parallel::stages::partition::parse_partition;
use dualpipe_train::parallel::stages::rebalance::{
    RebalanceSettings, SlowRank, DEFAULT_THRESHOLD, DEFAULT_WINDOW,
};
use dualpipe_train::{Naming, TrainConfig, TrainError};

/// Stage layout flags of `dualpipe train`.
#[derive(clap::Args, Debug, Default)]
pub struct LayoutArgs {
    /// Blocks of each model stage, input to output, e.g. 3,2,2,1 (stage 0 keeps the
    /// embeddings, the last the head); replaces --layers-per-stage.
    #[arg(long, value_name = "B,B,...", conflicts_with = "layers_per_stage")]
    pub partition: Option<String>,
    /// Activation recomputation of the GPT's blocks: none, full (keep each block's input,
    /// rerun its forward before the backward) or selective (keep the attention's tensors
    /// too, rerun the norms and the MLP); one value for every stage or a comma list, one
    /// per model stage, e.g. full,none,none,none [default: none].
    #[arg(long, value_name = "MODE[,MODE...]")]
    pub recompute: Option<String>,
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
    ) -> Result<(), TrainError> {
        if let Some(text) = &self.partition {
            let blocks = parse_partition(text)
                .map_err(|e| TrainError::Config(format!("--partition {e}")))?;
            config.model.partition = Some(blocks);
        }
        if let Some(text) = &self.recompute {
            config.model.recompute = Some(
                dualpipe_train::config::recompute::parse_recompute(text)
                    .map_err(|e| TrainError::Config(format!("--recompute {e}")))?,
            );
        }
        if let Some(path) = &self.plan {
            let text = dualpipe_io::read_text(path, dualpipe_io::limits::DOCUMENT, "--plan")
                .map_err(|e| {
                    TrainError::Config(format!(
                        "{e} (give the file `dualpipe plan --format json --output FILE` wrote)"
                    ))
                })?;
            let source = format!("--plan {}", path.display());
            let choice = PlanChoice::from_json(&text, &source).map_err(reworded)?;
            choice
                .apply(config, defaults, Naming::Flags)
                .map_err(|e| TrainError::Config(format!("{source}: {}", message(e))))?;
        }
        if let Some(text) = &self.slow_rank {
            let slow = SlowRank::parse(text)
                .map_err(|e| TrainError::Config(format!("--slow-rank {e}")))?;
            config.parallelism.slow_rank = Some(slow);
        }
        if self.rebalance_stages {
            config.parallelism.rebalance = Some(RebalanceSettings {
                threshold: self.rebalance_threshold,
                window: self.rebalance_window,
            });
        }
        Ok(())
    }
}

/// What `--profile`'s run leaves: the cost profile as the file's text, for the caller to
/// write, and the line that tells of it (`None` with `--quiet`).
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileRun {
    /// Where the profile goes (`--profile`'s path).
    pub path: PathBuf,
    /// The profile as pretty JSON, ending in a newline.
    pub text: String,
    /// `profile: N blocks, T ms of F+I+W per micro-batch in all, written to PATH`.
    pub note: Option<String>,
}

impl super::TrainArgs {
    /// With `--profile`: measures `config`'s GPT (`--profile-repeats` times per block) and
    /// returns the profile to write; `None` without the flag (the run trains instead).
    pub fn profile_run(&self, config: &TrainConfig) -> Result<Option<ProfileRun>, Failure> {
        let Some(path) = &self.layout.profile else {
            return Ok(None);
        };
        let profile = dualpipe_train::parallel::stages::profile::profile_gpt(
            config,
            self.layout.profile_repeats,
        )
        .map_err(|e| Failure::usage(message(e)))?;
        let mut text =
            serde_json::to_string_pretty(&profile).map_err(|e| Failure::error(None, &e))?;
        text.push('\n');
        let total: f64 = profile.layers.iter().map(|l| l.work()).sum();
        let note = (!self.observe.quiet).then(|| {
            format!(
                "profile: {} blocks, {:.3} ms of F+I+W per micro-batch in all, written to {}",
                profile.layers.len(),
                total * 1e3,
                path.display()
            )
        });
        Ok(Some(ProfileRun {
            path: path.clone(),
            text,
            note,
        }))
    }
}
