//! One module per subcommand; each parses its flags, calls the library crates and prints.

pub mod compare;
pub mod eplb;
pub mod eval;
pub mod generate;
pub mod output;
pub mod schedule;
pub mod simulate;
pub mod train;

use dualpipe_schedule::ScheduleKind;

/// The flags that name one schedule, shared by `dualpipe schedule` and `dualpipe simulate`.
#[derive(clap::Args, Debug)]
pub struct ScheduleArgs {
    /// Schedule kind: gpipe, 1f1b, interleaved, zb1p, dualpipe, dualpipev.
    #[arg(long)]
    pub schedule: String,
    /// Number of ranks (devices).
    #[arg(long)]
    pub ranks: usize,
    /// Micro-batches per step, over both directions for dualpipe.
    #[arg(long)]
    pub micro_batches: usize,
    /// Stages per rank (interleaved only) [default: 2 for interleaved, 1 otherwise].
    #[arg(long)]
    pub virtual_stages: Option<usize>,
}

impl ScheduleArgs {
    /// The schedule kind and the virtual stages to generate with.
    pub fn kind_and_virtual_stages(&self) -> Result<(ScheduleKind, usize), UsageError> {
        let kind = parse_kind(&self.schedule)?;
        let virtual_stages = self
            .virtual_stages
            .unwrap_or_else(|| kind.default_virtual_stages());
        Ok((kind, virtual_stages))
    }
}

/// Parses a `--schedule` value, naming the valid kinds when it is unknown.
pub fn parse_kind(name: &str) -> Result<ScheduleKind, UsageError> {
    ScheduleKind::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
        UsageError(format!(
            "unknown schedule '{name}' (--schedule): use one of {}",
            names.join(", ")
        ))
    })
}

/// A user error: bad flags or input. Exits with code 2 (as clap does for usage errors).
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The process exit code for an error: 2 for usage errors, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.downcast_ref::<UsageError>().is_some() {
        2
    } else {
        1
    }
}
