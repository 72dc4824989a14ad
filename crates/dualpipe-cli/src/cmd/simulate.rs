//! `dualpipe simulate`.

/// Flags of `dualpipe simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `dualpipe simulate`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`dualpipe simulate` is not implemented yet")
}
