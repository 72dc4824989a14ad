//! Standard output as a parent leaves it, for every command that writes its result there:
//! `/dev/null` opened read-write (Python's `subprocess.DEVNULL`, the way a Python program
//! starts `dualpipe`) and `/dev/null` opened write-only (`Stdio::null()`, a shell's `>
//! /dev/null`) run normally; a closed standard output (`>&-`) is one error line before the
//! work, exit code 1.

use std::fs::File;
use std::process::{Command, Output, Stdio};

use crate::{dualpipe, s, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_dualpipe");

/// Every command that writes its result to standard output, with small inputs made in `dir`.
fn commands(dir: &TempDir) -> Vec<(&'static str, Vec<String>)> {
    let loads = dir.write("loads.csv", "5,1,7,3,2,8\n1,1,9,4,4,2\n");
    let (log, ckpt) = (dir.join("train.jsonl"), dir.join("ckpt"));
    let train = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "train",
            "--model",
            "mlp",
            "--ranks",
            "2",
            "--steps",
            "2",
            "--hidden",
            "8",
            "--micro-batch-size",
            "2",
            "--micro-batches",
            "4",
            "--layers-per-stage",
            "1",
            "--eval-every",
            "0",
            "--quiet",
        ]
        .map(String::from)
        .to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    // The log and the checkpoints `report` and `checkpoint inspect` read.
    dualpipe(train(&[
        "--log",
        s(&log),
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "1",
    ]))
    .ok();
    let testdata = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/plan");
    let v = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    vec![
        (
            "schedule",
            v(&[
                "schedule",
                "--schedule",
                "1f1b",
                "--ranks",
                "2",
                "--micro-batches",
                "4",
            ]),
        ),
        (
            "simulate",
            v(&[
                "simulate",
                "--schedule",
                "dualpipe",
                "--ranks",
                "4",
                "--micro-batches",
                "8",
            ]),
        ),
        (
            "compare",
            v(&["compare", "--ranks", "4", "--micro-batches", "8"]),
        ),
        (
            "eplb",
            v(&[
                "eplb",
                "--loads",
                s(&loads),
                "--replicas",
                "8",
                "--groups",
                "2",
                "--nodes",
                "2",
                "--gpus",
                "4",
            ]),
        ),
        (
            "plan",
            v(&[
                "plan",
                "--topology",
                s(&testdata.join("hetero.json")),
                "--profile",
                s(&testdata.join("gpt32.json")),
                "--schedules",
                "1f1b",
                "--micro-batches",
                "8",
            ]),
        ),
        ("train", train(&[])),
        ("report", v(&["report", s(&log)])),
        (
            "checkpoint inspect",
            v(&["checkpoint", "inspect", s(&ckpt)]),
        ),
    ]
}

fn run_with_stdout(args: &[String], stdout: Stdio) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn dev_null_read_write_as_python_opens_it_runs_every_command() {
    let dir = TempDir::new("stdout-null-rw");
    for (name, args) in commands(&dir) {
        let null = File::options()
            .read(true)
            .write(true)
            .open("/dev/null")
            .unwrap();
        let out = run_with_stdout(&args, Stdio::from(null));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{name}: {stderr}");
        assert!(!stderr.contains("error"), "{name}: {stderr}");
    }
}

#[test]
fn dev_null_write_only_runs_every_command() {
    let dir = TempDir::new("stdout-null-wo");
    for (name, args) in commands(&dir) {
        let out = run_with_stdout(&args, Stdio::null());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{name}: {stderr}");
        assert!(!stderr.contains("error"), "{name}: {stderr}");
    }
}

#[test]
fn a_closed_stdout_is_one_error_line_for_every_command() {
    let dir = TempDir::new("stdout-closed");
    for (name, args) in commands(&dir) {
        let out = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" >&-"#)
            .arg(BIN)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(
            stderr.starts_with("error: standard output is closed") && stderr.lines().count() == 1,
            "{name}: {stderr}"
        );
    }
}
