//! `dualpipe schedule`.

/// Flags of `dualpipe schedule`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `dualpipe schedule`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`dualpipe schedule` is not implemented yet")
}
