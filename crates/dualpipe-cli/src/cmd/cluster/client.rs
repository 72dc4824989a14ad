//! `dualpipe cluster submit / list / cancel`: clients of `serve`'s HTTP/JSON API.

use std::time::Duration;

use dualpipe_cluster::serve::http::{request, Response};
use dualpipe_cluster::serve::{JobRecord, JobRequest};

use super::serve::DEFAULT_ADDR;
use crate::cmd::simulate::Format;
use crate::cmd::UsageError;

/// Flags of `dualpipe cluster submit`.
#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    /// The scheduler's address.
    #[arg(long, default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// A name for the job.
    #[arg(long)]
    pub name: Option<String>,
    /// Ranks of a rigid job (the same as --min-ranks K --max-ranks K).
    #[arg(long, value_parser = crate::cmd::count, conflicts_with_all = ["min_ranks", "max_ranks"])]
    pub ranks: Option<usize>,
    /// Fewest ranks of an elastic job.
    #[arg(long, value_parser = crate::cmd::count, requires = "max_ranks")]
    pub min_ranks: Option<usize>,
    /// Most ranks of an elastic job.
    #[arg(long, value_parser = crate::cmd::count, requires = "min_ranks")]
    pub max_ranks: Option<usize>,
    /// `dualpipe train`'s flags, after `--` (without --ranks, --checkpoint-dir, --resume,
    /// --metrics-addr, --log: the scheduler sets them). Paths are relative to the
    /// scheduler's working directory.
    #[arg(last = true, required = true)]
    pub train: Vec<String>,
}

/// Flags of `dualpipe cluster list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// The scheduler's address.
    #[arg(long, default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Flags of `dualpipe cluster cancel`.
#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    /// The job's id (`job-0001`).
    pub id: String,
    /// The scheduler's address.
    #[arg(long, default_value = DEFAULT_ADDR)]
    pub addr: String,
}

/// One request to the scheduler at `addr`; its 4xx answers are usage errors (their
/// `error` line), other failures errors.
fn call(addr: &str, method: &str, path: &str, body: Option<&str>) -> anyhow::Result<Response> {
    let r = request(addr, method, path, body, Duration::from_secs(30))
        .map_err(|e| anyhow::anyhow!("--addr {e} (is `dualpipe cluster serve` running there?)"))?;
    if r.status >= 400 {
        let message = serde_json::from_str::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
            .unwrap_or_else(|| r.body.trim().to_string());
        if r.status < 500 {
            return Err(UsageError(message).into());
        }
        anyhow::bail!("the scheduler answered {}: {message}", r.status);
    }
    Ok(r)
}

/// Runs `dualpipe cluster submit`: prints the new job's id.
pub fn run_submit(a: SubmitArgs) -> anyhow::Result<()> {
    let (min_ranks, max_ranks) = match (a.ranks, a.min_ranks, a.max_ranks) {
        (Some(k), _, _) => (k, k),
        (None, Some(lo), Some(hi)) => (lo, hi),
        _ => {
            return Err(UsageError(
                "give --ranks K (a rigid job) or --min-ranks A --max-ranks B (an elastic one)"
                    .into(),
            )
            .into())
        }
    };
    if max_ranks < min_ranks {
        return Err(UsageError(format!(
            "--max-ranks {max_ranks} is below --min-ranks {min_ranks}"
        ))
        .into());
    }
    let job = JobRequest {
        name: a.name,
        args: a.train,
        min_ranks,
        max_ranks,
    };
    let body = serde_json::to_string(&job)?;
    let r = call(&a.addr, "POST", "/jobs", Some(&body))?;
    let v: serde_json::Value = serde_json::from_str(&r.body)?;
    println!("{}", v.get("id").and_then(|i| i.as_str()).unwrap_or(""));
    Ok(())
}

/// Runs `dualpipe cluster list`.
pub fn run_list(a: ListArgs) -> anyhow::Result<()> {
    let r = call(&a.addr, "GET", "/jobs", None)?;
    match a.format {
        Format::Json => print!("{}", r.body),
        Format::Table => {
            let v: serde_json::Value = serde_json::from_str(&r.body)?;
            let jobs: Vec<JobRecord> = serde_json::from_value(v["jobs"].clone())?;
            println!(
                "{:<10} {:<12} {:<9} {:<12} {:>11} {:>10} {:>5} {:>5} {:>7} {:>9}",
                "id",
                "name",
                "phase",
                "slots",
                "step",
                "loss",
                "migr",
                "resz",
                "crashes",
                "paused s"
            );
            for j in jobs {
                let loss = j.loss.map_or("-".into(), |l| format!("{l:.5}"));
                println!(
                    "{:<10} {:<12} {:<9} {:<12} {:>11} {:>10} {:>5} {:>5} {:>7} {:>9.2}",
                    j.id,
                    j.name.unwrap_or_default(),
                    j.phase.name(),
                    format!("{:?}", j.slots),
                    format!("{}/{}", j.step, j.steps),
                    loss,
                    j.migrations,
                    j.resizes,
                    j.crashes,
                    j.move_pause_s
                );
            }
        }
    }
    Ok(())
}

/// Runs `dualpipe cluster cancel`.
pub fn run_cancel(a: CancelArgs) -> anyhow::Result<()> {
    call(&a.addr, "DELETE", &format!("/jobs/{}", a.id), None)?;
    println!("{}: cancel requested", a.id);
    Ok(())
}
