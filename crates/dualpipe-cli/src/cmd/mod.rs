//! One module per subcommand; each parses its flags, calls the library crates and prints.

pub mod compare;
pub mod eplb;
pub mod output;
pub mod schedule;
pub mod simulate;
pub mod train;

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
