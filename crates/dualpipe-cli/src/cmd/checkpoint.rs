//! `dualpipe checkpoint inspect DIR`: the checkpoints of a checkpoint directory (or one
//! checkpoint), each verified against its manifest, with its step, shape, size and
//! configuration. Reading and verifying are `dualpipe_train::checkpoint`'s.

use std::path::PathBuf;

use dualpipe_train::checkpoint::{self, Listed};
use serde_json::json;

use super::output::{check_paths, write_output};
use super::UsageError;

/// Output format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One line per checkpoint.
    Table,
    /// One JSON object.
    Json,
}

/// `dualpipe checkpoint`'s subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// List the checkpoints of DIR (a --checkpoint-dir, or one step-NNNNNN directory): steps,
    /// shapes, sizes, configurations, and whether each is intact.
    Inspect(InspectArgs),
}

/// Flags of `dualpipe checkpoint`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

/// Flags of `dualpipe checkpoint inspect`.
#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The checkpoint directory, or one of its step-NNNNNN checkpoints.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write into FILE instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs `dualpipe checkpoint`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Inspect(args) => inspect(&args),
    }
}

fn listing(dir: &std::path::Path) -> Result<Vec<Listed>, UsageError> {
    let own = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(checkpoint::writer::parse_dir_name);
    match own {
        Some(step)
            if dir.join(checkpoint::format::MANIFEST).exists() || !dir.join("latest").exists() =>
        {
            let status = checkpoint::Checkpoint::read(dir).map(|c| (c.state, c.manifest));
            Ok(vec![Listed {
                step,
                path: dir.to_path_buf(),
                status,
            }])
        }
        _ => checkpoint::list(dir).map_err(|e| UsageError(format!("checkpoint inspect: {e}"))),
    }
}

fn inspect(args: &InspectArgs) -> anyhow::Result<()> {
    let listed = listing(&args.dir)?;
    // The pointer is read only when it is a small regular file (never a FIFO or a huge file).
    let latest = match checkpoint::pointer::read(&args.dir) {
        checkpoint::pointer::Pointer::Names(name) => Some(name),
        checkpoint::pointer::Pointer::Foreign(what) => Some(format!("not a pointer: {what}")),
        checkpoint::pointer::Pointer::Absent => None,
    };
    check_paths(
        &inspected_files(&args.dir, &listed)
            .iter()
            .map(|p| ("the checkpoint folder", Some(p.as_path())))
            .collect::<Vec<_>>(),
        ("--output", args.output.as_deref()),
        &[],
    )?;
    let text = match args.format {
        Format::Json => {
            let items: Vec<_> = listed
                .iter()
                .map(|l| match &l.status {
                    Ok((state, manifest)) => json!({
                        "step": l.step,
                        "path": l.path.display().to_string(),
                        "ok": true,
                        "bytes": manifest.bytes(),
                        "files": manifest.files.len(),
                        "schedule": state.schedule,
                        "data_parallel": state.config.parallelism.data_parallel,
                        "config": state.config,
                    }),
                    Err(e) => json!({
                        "step": l.step,
                        "path": l.path.display().to_string(),
                        "ok": false,
                        "problem": e.to_string(),
                    }),
                })
                .collect();
            let mut text = serde_json::to_string_pretty(&json!({
                "dir": args.dir.display().to_string(),
                "latest": latest,
                "checkpoints": items,
            }))?;
            text.push('\n');
            text
        }
        Format::Table => table(&args.dir, &listed, latest.as_deref()),
    };
    write_output(args.output.as_deref(), &text)
}

/// The files `inspect` reads: the folder's `latest` and every file of each checkpoint listed
/// (an output on one of them would destroy the checkpoint).
fn inspected_files(dir: &std::path::Path, listed: &[Listed]) -> Vec<std::path::PathBuf> {
    let mut files = vec![dir.join("latest")];
    for l in listed {
        if let Ok(entries) = std::fs::read_dir(&l.path) {
            files.extend(entries.filter_map(|e| e.ok()).map(|e| e.path()));
        }
    }
    files
}

fn table(dir: &std::path::Path, listed: &[Listed], latest: Option<&str>) -> String {
    let mut out = format!("checkpoints in {}", dir.display());
    if let Some(latest) = latest {
        out.push_str(&format!(" (latest: {latest})"));
    }
    out.push('\n');
    if listed.is_empty() {
        out.push_str("  none\n");
        return out;
    }
    out.push_str("  step      status   bytes      files  model  schedule   ranks  stages  layers/stage  dp  dtype  optimizer\n");
    for l in listed {
        match &l.status {
            Ok((state, manifest)) => {
                let c = &state.config;
                let model = match c.model.kind {
                    dualpipe_train::ModelKind::Gpt => {
                        format!("gpt d{} h{}", c.model.d_model, c.model.heads)
                    }
                    dualpipe_train::ModelKind::Mlp => format!("mlp w{}", c.model.hidden),
                };
                out.push_str(&format!(
                    "  {:<8}  ok       {:<9}  {:<5}  {model}  {:<9}  {:<5}  {:<6}  {:<12}  {:<2}  {:<5}  {}\n",
                    l.step,
                    manifest.bytes(),
                    manifest.files.len(),
                    state.schedule.kind,
                    state.schedule.ranks,
                    state.schedule.model_stages,
                    c.model.layers_per_stage,
                    c.parallelism.data_parallel,
                    c.model.dtype,
                    c.optimizer.kind,
                ));
            }
            Err(e) => out.push_str(&format!("  {:<8}  DAMAGED  {e}\n", l.step)),
        }
    }
    out
}
