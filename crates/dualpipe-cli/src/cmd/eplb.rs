//! `dualpipe eplb`.

/// Flags of `dualpipe eplb`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `dualpipe eplb`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`dualpipe eplb` is not implemented yet")
}
