//! Every file flag of every `dualpipe` command, and what the command does with it. Shared by
//! the binary's unit test (which walks clap's command tree and fails on a path flag missing
//! here, or listed here and gone) and by `file_flags.rs` (which runs each input with a FIFO
//! and each output onto an input).
//!
//! A positional argument is listed by its id in angle brackets (`<log>`).

/// What a command does with a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code)]
pub enum Role {
    /// A file read through `dualpipe_io::open_regular` / `read_regular` / `read_text`.
    Input,
    /// A folder read (its files through the input path).
    InputDir,
    /// A file written through the output plan (`dualpipe_io::OutputPlan`) and writer.
    Output,
    /// A folder written into (each file it gets planned against the inputs).
    OutputDir,
    /// A long-running server's folder (`cluster serve --state`, `--data-root`): not a
    /// one-shot command, tested in cluster_serve.rs and cluster_access.rs.
    ServerState,
}

/// `(command, flag, role)` for every path flag.
pub const FILE_FLAGS: &[(&str, &str, Role)] = &[
    ("schedule", "--output", Role::Output),
    ("simulate", "--schedule-file", Role::Input),
    ("simulate", "--output", Role::Output),
    ("simulate", "--svg", Role::Output),
    ("simulate", "--trace", Role::Output),
    ("compare", "--output", Role::Output),
    ("eplb", "--loads", Role::Input),
    ("eplb", "--previous", Role::Input),
    ("eplb", "--output", Role::Output),
    ("train", "--schedule-file", Role::Input),
    ("train", "--data", Role::Input),
    ("train", "--init-from", Role::Input),
    ("train", "--plan", Role::Input),
    ("train", "--resume-from", Role::InputDir),
    ("train", "--save", Role::Output),
    ("train", "--output", Role::Output),
    ("train", "--trace", Role::Output),
    ("train", "--svg", Role::Output),
    ("train", "--log", Role::Output),
    ("train", "--profile", Role::Output),
    ("train", "--checkpoint-dir", Role::OutputDir),
    ("eval", "--weights", Role::Input),
    ("eval", "--data", Role::Input),
    ("generate", "--weights", Role::Input),
    ("generate", "--prompt-file", Role::Input),
    ("report", "<log>", Role::Input),
    ("report", "--svg", Role::Output),
    ("report", "--output", Role::Output),
    ("checkpoint inspect", "<dir>", Role::InputDir),
    ("checkpoint inspect", "--output", Role::Output),
    ("plan", "--topology", Role::Input),
    ("plan", "--profile", Role::Input),
    ("plan", "--previous", Role::Input),
    ("plan", "--output", Role::Output),
    ("plan", "--svg", Role::Output),
    ("cluster trace", "--output", Role::Output),
    ("cluster simulate", "--cluster", Role::Input),
    ("cluster simulate", "--trace", Role::Input),
    ("cluster simulate", "--output", Role::Output),
    ("cluster simulate", "--svg", Role::Output),
    ("cluster simulate", "--placement-out", Role::Output),
    ("cluster serve", "--state", Role::ServerState),
    ("cluster serve", "--data-root", Role::ServerState),
    ("cluster submit", "--state", Role::InputDir),
    ("cluster submit", "--token-file", Role::Input),
    ("cluster list", "--state", Role::InputDir),
    ("cluster list", "--token-file", Role::Input),
    ("cluster cancel", "--state", Role::InputDir),
    ("cluster cancel", "--token-file", Role::Input),
    ("cluster manifests", "--placement", Role::Input),
    ("cluster manifests", "--output-dir", Role::OutputDir),
];
