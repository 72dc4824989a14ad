//! Library messages in the command line's words. The library crates name a setting by its
//! field, in backquotes (`` `seq_len` ``, `` `checkpoint.dir` ``); a message that reaches the
//! user through a command names it by that command's flag (`--seq-len`, `--checkpoint-dir`)
//! instead. A field's flag is its name with dashes for underscores, or, for a training field
//! whose flag is worded otherwise, the one [`Field`] gives; a field is reworded only where the
//! command has that flag (read from its clap definition), so the mapping cannot drift from the
//! flags.

use clap::{ArgMatches, Command};
use dualpipe_train::{Field, Naming};
use std::collections::HashSet;

/// The long flags of the subcommand `matches` chose (and of the commands above it).
pub fn long_flags(mut command: &Command, mut matches: &ArgMatches) -> HashSet<String> {
    let mut flags = HashSet::new();
    loop {
        flags.extend(
            command
                .get_arguments()
                .filter_map(|a| a.get_long())
                .map(String::from),
        );
        let Some((name, sub)) = matches.subcommand() else {
            return flags;
        };
        let Some(next) = command.find_subcommand(name) else {
            return flags;
        };
        (command, matches) = (next, sub);
    }
}

/// The long flags of the arguments `A` (one command's, outside a command tree).
pub fn flags_of<A: clap::Args>() -> HashSet<String> {
    long_flags(
        &A::augment_args(Command::new("args")),
        &ArgMatches::default(),
    )
}

/// `message` with every backquoted field whose flag is one of `flags` written as that flag:
/// `` a smaller `seq_len` `` becomes `a smaller --seq-len`. Other backquoted text (a command,
/// a file name) is left as it is.
pub fn in_flags(message: &str, flags: &HashSet<String>) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(open) = rest.find('`') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else { break };
        let quoted = &after[..close];
        out.push_str(&rest[..open]);
        if let Some(flag) = is_field(quoted).then(|| flag_of(quoted, flags)).flatten() {
            out.push_str(&flag);
        } else {
            out.push('`');
            out.push_str(quoted);
            out.push('`');
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// The flag of field `name` among `flags`, if the command has one: the name with dashes for
/// underscores and dots (`seq_len`: `--seq-len`, `moe.every`: `--moe-every`), its last part
/// (`moe.top_k`: `--top-k`), or the flag [`Field`] words otherwise (`rebalance`:
/// `--rebalance-stages`).
fn flag_of(name: &str, flags: &HashSet<String>) -> Option<String> {
    let last = name.rsplit('.').next().unwrap_or(name);
    let field = Field::from_key(name).map(|f| f.name(Naming::Flags)[2..].to_string());
    [name.replace(['_', '.'], "-"), last.replace('_', "-")]
        .into_iter()
        .chain(field)
        .find(|f| flags.contains(f))
        .map(|f| format!("--{f}"))
}

/// Whether `text` is a field's name: lower-case letters, digits, underscores and dots.
fn is_field(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(names: &[&str]) -> HashSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_quoted_field_with_a_flag_becomes_the_flag_and_nothing_else_changes() {
        let f = flags(&[
            "seq-len",
            "validation-fraction",
            "state",
            "checkpoint-dir",
            "top-k",
            "rebalance-stages",
        ]);
        assert_eq!(
            in_flags("use a smaller `seq_len` (`validation_fraction` 0.1)", &f),
            "use a smaller --seq-len (--validation-fraction 0.1)"
        );
        assert_eq!(
            in_flags("drop `checkpoint.dir`, `moe.top_k` or `rebalance`", &f),
            "drop --checkpoint-dir, --top-k or --rebalance-stages"
        );
        // A training field whose flag this command does not have stays a field.
        assert_eq!(
            in_flags("turn the overlap off (`moe.overlap`)", &f),
            "turn the overlap off (`moe.overlap`)"
        );
        assert_eq!(
            in_flags("give another `state` directory", &f),
            "give another --state directory"
        );
        // Not a flag of this command, not a field name, or an unclosed quote: unchanged.
        for kept in [
            "use a smaller `hidden`",
            "written by `dualpipe plan --format json`",
            "a lone ` quote `seq_len",
        ] {
            assert_eq!(in_flags(kept, &f), kept);
        }
    }

    #[test]
    fn the_training_flags_reword_its_fields() {
        let train = flags_of::<crate::train_args::TrainArgs>();
        assert_eq!(
            in_flags(
                "`ranks` 4 x `data_parallel` 2; drop `checkpoint.dir`, `rebalance` or `moe.overlap`",
                &train
            ),
            "--ranks 4 x --data-parallel 2; drop --checkpoint-dir, --rebalance-stages or --no-moe-overlap"
        );
    }

    #[test]
    fn the_flags_are_those_of_the_chosen_subcommand() {
        let cli = Command::new("x")
            .subcommand(Command::new("a").arg(clap::Arg::new("s").long("seq-len")))
            .subcommand(Command::new("b").arg(clap::Arg::new("t").long("state")));
        let matches = cli.clone().get_matches_from(["x", "b", "--state", "d"]);
        assert_eq!(long_flags(&cli, &matches), flags(&["state"]));
    }
}
