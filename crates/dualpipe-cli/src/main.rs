//! `dualpipe`: plan, simulate and run pipeline schedules; balance MoE experts.

mod cmd;
#[cfg(test)]
mod file_flag_table;
mod parse;
mod train_args;
mod wording;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Pipeline-parallel training with DualPipe schedules and MoE expert load balancing.
#[derive(Parser)]
#[command(name = "dualpipe", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate, lower and validate a schedule; print it as a table, JSON or torch CSV.
    Schedule(cmd::schedule::Args),
    /// Simulate a schedule on a cost model and report bubbles, memory and step time.
    Simulate(cmd::simulate::Args),
    /// Simulate every schedule that accepts a configuration and compare them.
    Compare(cmd::compare::Args),
    /// Balance MoE experts over GPUs (DeepSeek EPLB policies and our migration-aware planner).
    Eplb(cmd::eplb::Args),
    /// Train a model (the GPT by default) with a pipeline schedule: local ranks, or one
    /// process per rank under MPI (the main job).
    Train(Box<train_args::TrainArgs>),
    /// Mean next-token cross-entropy of GPT weights over a file (loss, bits per byte).
    Eval(cmd::eval::Args),
    /// Continue a prompt with GPT weights (greedy, or sampled with a temperature).
    Generate(cmd::generate::Args),
    /// Summarise a run from its `train --log` file; draw its loss, throughput and bubble.
    Report(cmd::report::Args),
    /// Inspect training checkpoints (`dualpipe checkpoint inspect DIR`).
    Checkpoint(cmd::checkpoint::Args),
    /// Plan a job for a topology and a cost profile: schedule, micro-batches, layer
    /// partition and stage-to-device placement, scored by simulation.
    Plan(cmd::plan::Args),
    /// EPLB for the cluster: synthetic traces, and many jobs simulated on a shared pool
    /// under the static or the elastic policy.
    Cluster(cmd::cluster::Args),
}

fn main() -> std::process::ExitCode {
    let command = Cli::command();
    let matches = command.clone().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = match cli.command {
        Command::Schedule(args) => cmd::schedule::run(args),
        Command::Simulate(args) => cmd::simulate::run(args),
        Command::Compare(args) => cmd::compare::run(args),
        Command::Eplb(args) => cmd::eplb::run(args),
        Command::Train(args) => cmd::train::run(*args),
        Command::Eval(args) => cmd::eval::run(args),
        Command::Generate(args) => cmd::generate::run(args),
        Command::Report(args) => cmd::report::run(args),
        Command::Checkpoint(args) => cmd::checkpoint::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Cluster(args) => cmd::cluster::run_cluster(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            let flags = wording::long_flags(&command, &matches);
            eprintln!("error: {}", wording::in_flags(&format!("{err:#}"), &flags));
            std::process::ExitCode::from(cmd::exit_code(&err))
        }
    }
}
