//! `dualpipe train --profile` (measure the blocks, write the cost profile, train nothing) and
//! the lines that tell of a run's re-partitionings. The flags are
//! [`LayoutArgs`](dualpipe_train::cli::LayoutArgs); the logic is `dualpipe_train`'s.

use dualpipe_train::cli::TrainArgs;
use dualpipe_train::partition::format_partition;
use dualpipe_train::profile::profile_gpt;
use dualpipe_train::rebalance::Repartition;
use dualpipe_train::TrainConfig;

use crate::cmd::UsageError;

/// With `--profile`: measures `config`'s GPT and writes the profile; `true` when it did
/// (the run then trains nothing).
pub fn profile_run(args: &TrainArgs, config: &TrainConfig) -> anyhow::Result<bool> {
    let Some(path) = &args.layout.profile else {
        return Ok(false);
    };
    let profile = profile_gpt(config, args.layout.profile_repeats).map_err(UsageError::from)?;
    let mut text = serde_json::to_string_pretty(&profile)?;
    text.push('\n');
    crate::cmd::output::write_together(vec![(Some(path.clone()), text.into_bytes())])?;
    if !args.observe.quiet {
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
