//! `dualpipe cluster submit / list / cancel`: clients of `serve`'s HTTP/JSON API.

use std::path::PathBuf;
use std::time::Duration;

use dualpipe_cluster::serve::access::{read_token, token_path};
use dualpipe_cluster::serve::{JobRecord, JobRequest};
use dualpipe_http::client::{request, Response};

use super::serve::DEFAULT_ADDR;
use crate::cmd::simulate::Format;
use crate::cmd::UsageError;

/// The environment variable naming a token file when neither --state nor --token-file is
/// given.
pub const TOKEN_ENV: &str = "DUALPIPE_CLUSTER_TOKEN_FILE";

/// How a client proves it may use the scheduler: the token in its state directory.
#[derive(clap::Args, Debug)]
pub struct AccessArgs {
    /// The scheduler's state directory: its token (DIR/token) is sent with each request.
    #[arg(long, value_name = "DIR", conflicts_with = "token_file")]
    pub state: Option<PathBuf>,
    /// A file holding the scheduler's token (a copy of DIR/token) [default: the file named
    /// by $DUALPIPE_CLUSTER_TOKEN_FILE].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

impl AccessArgs {
    /// The token to send, if a source was given; a source that cannot be read is a usage
    /// error naming it.
    fn token(&self) -> anyhow::Result<Option<String>> {
        let (flag, path) = match (&self.state, &self.token_file) {
            (Some(dir), _) => {
                check_state_dir(dir)?;
                ("--state", token_path(dir))
            }
            (None, Some(file)) => ("--token-file", file.clone()),
            (None, None) => match std::env::var_os(TOKEN_ENV) {
                Some(file) => (TOKEN_ENV, PathBuf::from(file)),
                None => return Ok(None),
            },
        };
        read_token(&path)
            .map(Some)
            .map_err(|e| UsageError(format!("{flag}: {e}")).into())
    }
}

/// Refuses a `--state` that is not a folder, by what it is (a FIFO, a file), before the token
/// inside it is looked for.
fn check_state_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => Err(UsageError(format!(
            "--state {} is {}: give the scheduler's state folder",
            dir.display(),
            dualpipe_io::kind(&meta)
        ))
        .into()),
        _ => Ok(()), // a folder; or missing, which the token's read names
    }
}

/// Flags of `dualpipe cluster submit`.
#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    /// The scheduler's address.
    #[arg(long, default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// The scheduler's token.
    #[command(flatten)]
    pub access: AccessArgs,
    /// This submission's id (1 to 64 of A-Za-z0-9._-) [default: a new random one]: sent
    /// again, it gives the job it queued, never a second one.
    #[arg(long)]
    pub request_id: Option<String>,
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
    /// --metrics-addr, --log: the scheduler sets them). Outputs are relative paths, written
    /// in the job's own folder; inputs are absolute paths under the scheduler's
    /// --data-root folders.
    #[arg(last = true, required = true)]
    pub train: Vec<String>,
}

/// Flags of `dualpipe cluster list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// The scheduler's address.
    #[arg(long, default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// The scheduler's token.
    #[command(flatten)]
    pub access: AccessArgs,
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
    /// The scheduler's token.
    #[command(flatten)]
    pub access: AccessArgs,
}

/// One request to the scheduler at `addr` with the token of `access`; its 4xx answers are
/// usage errors (their `error` line), other failures errors.
fn call(
    addr: &str,
    access: &AccessArgs,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> anyhow::Result<Response> {
    let token = access.token()?;
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| ("Authorization", b))
        .into_iter()
        .collect();
    // A scheduler recovering the jobs of its previous run answers 503 "recovering" (and
    // changes nothing) for at most its --stop-grace: wait for it, up to a minute.
    let patience = std::time::Instant::now() + Duration::from_secs(60);
    let r = loop {
        let r =
            request(addr, method, path, &headers, body, Duration::from_secs(30)).map_err(|e| {
                let line = format!("--addr {e} (is `dualpipe cluster serve` running there?)");
                if e.maybe_received {
                    anyhow::Error::new(Unanswered(line))
                } else {
                    anyhow::anyhow!(line)
                }
            })?;
        if r.status != 503 || !r.body.contains("recovering") || std::time::Instant::now() > patience
        {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if r.status == 401 && bearer.is_none() {
        return Err(UsageError(format!(
            "the scheduler at {addr} wants its token: give --state DIR (its state directory), \
             --token-file FILE or ${TOKEN_ENV}"
        ))
        .into());
    }
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

/// A request that failed after it may have reached the scheduler (sent, but no answer read).
#[derive(Debug)]
struct Unanswered(String);

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unanswered {}

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
    let request_id = match a.request_id {
        Some(id) => id,
        None => new_request_id()?,
    };
    let job = JobRequest {
        name: a.name,
        args: a.train,
        min_ranks,
        max_ranks,
        request_id: Some(request_id.clone()),
    };
    let body = serde_json::to_string(&job)?;
    let r = call(&a.addr, &a.access, "POST", "/jobs", Some(&body)).map_err(|e| {
        // Only a request that may have reached the scheduler leaves the job's fate open; no
        // connection, or an answer, is certain.
        if e.downcast_ref::<Unanswered>().is_some() {
            e.context(format!(
                "the job may or may not be queued: run the same command with --request-id \
                 {request_id} to find out without queuing it twice"
            ))
        } else {
            e
        }
    })?;
    let v: serde_json::Value = serde_json::from_str(&r.body)?;
    println!("{}", v.get("id").and_then(|i| i.as_str()).unwrap_or(""));
    Ok(())
}

/// Runs `dualpipe cluster list`.
pub fn run_list(a: ListArgs) -> anyhow::Result<()> {
    let r = call(&a.addr, &a.access, "GET", "/jobs", None)?;
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
                let loss = j.loss.map_or("-".into(), short);
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
    call(
        &a.addr,
        &a.access,
        "DELETE",
        &format!("/jobs/{}", a.id),
        None,
    )?;
    println!("{}: cancel requested", a.id);
    Ok(())
}

/// A new random request id (`cli-` and 16 hex digits from /dev/urandom).
fn new_request_id() -> anyhow::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| anyhow::anyhow!("cannot draw a request id from /dev/urandom: {e}"))?;
    Ok(format!("cli-{:016x}", u64::from_be_bytes(bytes)))
}

/// A number in at most 10 characters, as C's `%.4g` writes it: 4 significant digits,
/// scientific beyond 1e5 or under 1e-4.
fn short(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let e = x.abs().log10().floor() as i32;
    if !(-4..5).contains(&e) {
        format!("{x:.3e}")
    } else {
        format!("{x:.*}", (3 - e).max(0) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::short;

    #[test]
    fn losses_are_short_whatever_their_size() {
        assert_eq!(short(1.280_784_875_447_871e82), "1.281e82");
        assert_eq!(short(0.25), "0.2500");
        assert_eq!(short(12.3456), "12.35");
        assert_eq!(short(12345.6), "12346");
        assert_eq!(short(3.0e-7), "3.000e-7");
        assert_eq!(short(0.0), "0");
    }
}
