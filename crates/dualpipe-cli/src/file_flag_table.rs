//! The table of file flags (tests/cli/file_flags_table.rs) is the command tree's: every
//! argument whose value is a path is listed there with what the command does with it, and
//! nothing listed there is gone. A new path flag fails here until it is listed (and so tested
//! by tests/cli/file_flags.rs against FIFOs and outputs on inputs).

#[path = "../tests/cli/file_flags_table.rs"]
mod table;

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::CommandFactory;

/// `(command path, flag)` of every argument of `cmd` and its subcommands whose value is a path.
fn path_flags(cmd: &clap::Command, prefix: &str, out: &mut BTreeSet<(String, String)>) {
    for arg in cmd.get_arguments() {
        if arg.get_value_parser().type_id() != std::any::TypeId::of::<PathBuf>() {
            continue;
        }
        let name = match arg.get_long() {
            Some(long) => format!("--{long}"),
            None => format!("<{}>", arg.get_id()),
        };
        out.insert((prefix.to_string(), name));
    }
    for sub in cmd.get_subcommands() {
        let path = if prefix.is_empty() {
            sub.get_name().to_string()
        } else {
            format!("{prefix} {}", sub.get_name())
        };
        path_flags(sub, &path, out);
    }
}

#[test]
fn every_path_flag_is_in_the_table_and_every_listed_flag_exists() {
    let mut found = BTreeSet::new();
    path_flags(&crate::Cli::command(), "", &mut found);
    let listed: BTreeSet<(String, String)> = table::FILE_FLAGS
        .iter()
        .map(|(c, f, _)| (c.to_string(), f.to_string()))
        .collect();
    let missing: Vec<_> = found.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "path flags missing from tests/cli/file_flags_table.rs (list each with its role): {missing:?}"
    );
    let gone: Vec<_> = listed.difference(&found).collect();
    assert!(gone.is_empty(), "listed but not path flags: {gone:?}");
    assert_eq!(listed.len(), table::FILE_FLAGS.len(), "a flag listed twice");
}
