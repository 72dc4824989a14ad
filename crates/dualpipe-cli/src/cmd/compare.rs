//! `dualpipe compare`.

/// Flags of `dualpipe compare`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `dualpipe compare`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`dualpipe compare` is not implemented yet")
}
