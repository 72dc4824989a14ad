//! `dualpipe train`.

/// Flags of `dualpipe train`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `dualpipe train`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`dualpipe train` is not implemented yet")
}
