//! The command line itself: help, version, unknown subcommands.

use crate::dualpipe;

const SUBCOMMANDS: [&str; 6] = ["schedule", "simulate", "compare", "eplb", "train", "report"];

#[test]
fn help_lists_every_subcommand() {
    let run = dualpipe(["--help"]);
    run.ok();
    for cmd in SUBCOMMANDS {
        assert!(
            run.stdout.contains(cmd),
            "{cmd} missing from --help:\n{}",
            run.stdout
        );
    }
}

#[test]
fn every_subcommand_has_help_naming_format_and_its_flags() {
    for (cmd, flags) in [
        (
            "schedule",
            &["--schedule", "--ranks", "--micro-batches", "--output"][..],
        ),
        (
            "simulate",
            &[
                "--schedule",
                "--f",
                "--b",
                "--w",
                "--fb",
                "--svg",
                "--trace",
            ][..],
        ),
        ("compare", &["--ranks", "--micro-batches", "--output"][..]),
        (
            "eplb",
            &[
                "--loads",
                "--replicas",
                "--groups",
                "--nodes",
                "--gpus",
                "--output",
            ][..],
        ),
        (
            "train",
            &[
                "--schedule",
                "--steps",
                "--seed",
                "--hidden",
                "--trace",
                "--svg",
                "--metrics-addr",
                "--log",
                "--quiet",
            ][..],
        ),
        ("report", &["--svg", "--output"][..]),
    ] {
        let run = dualpipe([cmd, "--help"]);
        run.ok();
        for flag in flags.iter().chain(&["--format"]) {
            assert!(
                run.stdout.contains(flag),
                "{cmd} --help lacks {flag}:\n{}",
                run.stdout
            );
        }
    }
}

#[test]
fn version_names_the_binary() {
    let run = dualpipe(["--version"]);
    run.ok();
    assert!(run.stdout.starts_with("dualpipe "), "{}", run.stdout);
}

#[test]
fn no_or_unknown_subcommand_is_a_usage_error() {
    let none = dualpipe(Vec::<&str>::new());
    assert_eq!(none.code, Some(2), "{}", none.stderr);
    none.no_panic();
    dualpipe(["frobnicate"]).flag_error(&["frobnicate"]);
}
