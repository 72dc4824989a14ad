//! Issue 55, point 4: every file flag of every command (the table of file_flags_table.rs,
//! which the binary's own test keeps equal to clap's command tree) goes through the one input
//! path and the one output plan:
//!
//! - each input flag given a FIFO with no writer exits 2 at once, naming the FIFO (a FIFO that
//!   were opened for reading would block the command for ever: each run has a deadline and is
//!   killed past it);
//! - each output flag given one of the command's inputs, by its own name, a symbolic link, a
//!   hard link or a `sub/../` path, exits 2 and leaves the input byte for byte as it was (a
//!   command without inputs: an output that is a folder exits 2).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::file_flags_table::{Role, FILE_FLAGS};
use crate::{dualpipe, s, TempDir};

/// The longest a refused run may take (a blocked read would take for ever).
const DEADLINE: Duration = Duration::from_secs(30);

/// A tiny GPT's flags for `train`: two steps in f64, no validation.
fn tiny() -> Vec<&'static str> {
    let mut args = crate::io_paths::TINY.to_vec();
    args.extend(["2", "--dtype", "f64"]);
    args
}

/// Runs `dualpipe ARGS` with a deadline; returns the exit code (`None`: killed at the
/// deadline) and stderr.
fn bounded(args: &[String]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dualpipe"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the dualpipe binary starts");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            return (status.code(), err);
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return (None, String::new());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(s(path)).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// The inputs every command reads, made once.
struct Inputs {
    dir: TempDir,
    data: PathBuf,
    weights: PathBuf,
    log: PathBuf,
    checkpoints: PathBuf,
    schedule: PathBuf,
    loads: PathBuf,
    placement: PathBuf,
    trace: PathBuf,
    topology: PathBuf,
    profile: PathBuf,
    cluster: PathBuf,
}

impl Inputs {
    fn new() -> Inputs {
        let dir = TempDir::new("file-flags");
        let text: Vec<u8> = (0..4000u32)
            .map(|i| b"abcdefgh "[(i % 9) as usize])
            .collect();
        let data = dir.write("data.txt", text);
        let (weights, log, checkpoints) = (
            dir.join("w.safetensors"),
            dir.join("run.jsonl"),
            dir.join("ckpt"),
        );
        let mut train: Vec<String> = ["train"]
            .into_iter()
            .chain(tiny())
            .map(String::from)
            .collect();
        train.extend(
            [
                "--data",
                s(&data),
                "--save",
                s(&weights),
                "--log",
                s(&log),
                "--checkpoint-dir",
                s(&checkpoints),
                "--checkpoint-every",
                "1",
            ]
            .map(String::from),
        );
        dualpipe(&train).ok();
        let schedule = dir.join("schedule.json");
        dualpipe([
            "schedule",
            "--schedule",
            "1f1b",
            "--ranks",
            "2",
            "--micro-batches",
            "4",
            "--format",
            "json",
            "--output",
            s(&schedule),
        ])
        .ok();
        let loads = dir.write("loads.csv", "1,2,3,4,5,6,7,8,9,10,11,12\n");
        let placement = dir.write(
            "placement.json",
            r#"{"jobs": [{"job": "a", "nodes": [{"node": "n0", "devices": 1}], "train": []}]}"#,
        );
        let trace = dir.write(
            "trace.csv",
            "job,arrival_s,gpus,duration_s,min_gpus,max_gpus,profile\nj0,0,2,100,,,\n",
        );
        // The repository's files are copied: a failing check must not write over them.
        let repo = |name: &str| {
            let from = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../testdata")
                .join(name);
            dir.write(
                name.replace('/', "-").as_str(),
                std::fs::read(from).unwrap(),
            )
        };
        let (topology, profile, cluster) = (
            repo("plan/hetero.json"),
            repo("plan/gpt32.json"),
            repo("cluster/small.json"),
        );
        Inputs {
            dir,
            data,
            weights,
            log,
            checkpoints,
            schedule,
            loads,
            placement,
            trace,
            topology,
            profile,
            cluster,
        }
    }

    /// The command line of `command` with every input it needs, each flag of `inputs` valid;
    /// `under_test` is left out (the caller adds it). Its inputs are returned by flag.
    fn command(&self, command: &str, under_test: &str) -> (Vec<String>, Vec<(String, PathBuf)>) {
        let mut args: Vec<String> = command.split(' ').map(String::from).collect();
        let mut inputs: Vec<(&str, PathBuf)> = Vec::new();
        match command {
            "schedule" => args.extend(
                ["--schedule", "1f1b", "--ranks", "2", "--micro-batches", "4"].map(String::from),
            ),
            "compare" => args.extend(["--ranks", "2", "--micro-batches", "4"].map(String::from)),
            "simulate" => inputs.push(("--schedule-file", self.schedule.clone())),
            "eplb" => {
                args.extend(
                    [
                        "--replicas",
                        "16",
                        "--groups",
                        "4",
                        "--nodes",
                        "2",
                        "--gpus",
                        "8",
                    ]
                    .map(String::from),
                );
                inputs.push(("--loads", self.loads.clone()));
            }
            "train" => {
                // A schedule file gives the ranks and micro-batches itself.
                let skip = if under_test == "--schedule-file" {
                    4
                } else {
                    0
                };
                let tiny = tiny();
                args.extend(
                    tiny[..6]
                        .iter()
                        .chain(&tiny[6 + skip..])
                        .map(|a| a.to_string()),
                );
                inputs.push(("--data", self.data.clone()));
                if under_test != "--schedule-file"
                    && under_test != "--plan"
                    && under_test != "--resume-from"
                {
                    inputs.push(("--init-from", self.weights.clone()));
                }
            }
            "eval" => inputs.extend([
                ("--weights", self.weights.clone()),
                ("--data", self.data.clone()),
            ]),
            "generate" => {
                inputs.push(("--weights", self.weights.clone()));
                if under_test != "--prompt-file" {
                    args.extend(["--prompt", "ab", "--max-tokens", "2"].map(String::from));
                }
            }
            "report" => inputs.push(("<log>", self.log.clone())),
            "checkpoint inspect" => inputs.push(("<dir>", self.checkpoints.clone())),
            "plan" => inputs.extend([
                ("--topology", self.topology.clone()),
                ("--profile", self.profile.clone()),
            ]),
            "cluster trace" => args.extend(["--jobs", "3"].map(String::from)),
            "cluster simulate" => {
                args.extend(["--policy", "static"].map(String::from));
                if under_test == "--placement-out" {
                    args.extend(["--placement-at", "0"].map(String::from));
                }
                inputs.extend([
                    ("--cluster", self.cluster.clone()),
                    ("--trace", self.trace.clone()),
                ]);
            }
            "cluster manifests" => inputs.push(("--placement", self.placement.clone())),
            // The token is read before any connection: no scheduler needs to listen.
            "cluster list" => args.extend(["--addr", "127.0.0.1:9"].map(String::from)),
            "cluster cancel" => {
                args.extend(["job-0001", "--addr", "127.0.0.1:9"].map(String::from))
            }
            "cluster submit" => args.extend(
                [
                    "--addr",
                    "127.0.0.1:9",
                    "--ranks",
                    "1",
                    "--",
                    "--model",
                    "mlp",
                ]
                .map(String::from),
            ),
            other => panic!("no command line for {other}: add one here"),
        }
        let inputs: Vec<(String, PathBuf)> = inputs
            .into_iter()
            .filter(|(f, _)| *f != under_test)
            .map(|(f, p)| (f.to_string(), p))
            .collect();
        for (flag, path) in &inputs {
            if !flag.starts_with('<') {
                args.push(flag.clone());
            }
            args.push(s(path).to_string());
        }
        (args, inputs)
    }
}

/// Runs `check` on every case, each on its own thread; the failures' messages.
fn in_parallel<T: Sync>(
    cases: &[T],
    check: impl Fn(&T) -> Result<(), String> + Sync,
) -> Vec<String> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|case| scope.spawn(|| check(case)))
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().unwrap().err())
            .collect()
    })
}

/// Adds `flag value` to `args`, before a `--` that starts a job's own arguments.
fn push_flag(args: &mut Vec<String>, flag: &str, value: &Path) {
    let at = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut added = vec![s(value).to_string()];
    if !flag.starts_with('<') {
        added.insert(0, flag.to_string());
    }
    args.splice(at..at, added);
}

#[test]
fn every_input_flag_refuses_a_fifo_without_blocking() {
    let inputs = Inputs::new();
    let fifo = inputs.dir.join("fifo");
    mkfifo(&fifo);
    let cases: Vec<_> = FILE_FLAGS
        .iter()
        .filter(|(_, _, role)| matches!(role, Role::Input | Role::InputDir))
        .collect();
    let failures = in_parallel(&cases, |(command, flag, _)| {
        let (mut args, _) = inputs.command(command, flag);
        push_flag(&mut args, flag, &fifo);
        let (code, err) = bounded(&args);
        let named = err.contains("FIFO") || err.contains("fifo");
        (code == Some(2) && named && err.lines().count() == 1)
            .then_some(())
            .ok_or(format!(
                "{command} {flag} FIFO: exit {code:?}, stderr {err:?}"
            ))
    });
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn every_output_flag_refuses_an_input_by_any_name_and_keeps_it() {
    let inputs = Inputs::new();
    let cases: Vec<_> = FILE_FLAGS
        .iter()
        .filter(|(_, _, role)| matches!(role, Role::Output | Role::OutputDir))
        .enumerate()
        .collect();
    let failures = in_parallel(&cases, |(i, (command, flag, role))| {
        let (mut args, given) = inputs.command(command, flag);
        let files: Vec<&(String, PathBuf)> = given.iter().filter(|(_, p)| p.is_file()).collect();
        let Some((input_flag, mut input)) = files.first().map(|(f, p)| (f, p.clone())) else {
            // No input file: the plan still refuses an output that is a folder.
            push_flag(&mut args, flag, inputs.dir.path());
            let (code, err) = bounded(&args);
            return (code == Some(2)).then_some(()).ok_or(format!(
                "{command} {flag} a folder: exit {code:?}, stderr {err:?}"
            ));
        };
        let name = format!("alias-{i}");
        let target = match (role, i % 4) {
            // A folder written into: the input placed there under the name the
            // command writes (manifests), or the input itself (train's folder).
            (Role::OutputDir, _) if *command == "cluster manifests" => {
                let dir = inputs.dir.join(&name);
                std::fs::create_dir(&dir).unwrap();
                let planted = dir.join("mpijob-dualpipe-a.yaml");
                std::fs::copy(&input, &planted).unwrap();
                let last = args.len() - 1;
                args[last] = s(&planted).to_string();
                input = planted;
                dir
            }
            (Role::OutputDir, _) => input.clone(),
            (_, 0) => input.clone(),
            (_, 1) => {
                let link = inputs.dir.join(&name);
                std::os::unix::fs::symlink(&input, &link).unwrap();
                link
            }
            (_, 2) => {
                let link = inputs.dir.join(&name);
                std::fs::hard_link(&input, &link).unwrap();
                link
            }
            _ => {
                let parent = input.parent().unwrap();
                parent
                    .join("..")
                    .join(parent.file_name().unwrap())
                    .join(input.file_name().unwrap())
            }
        };
        let before = std::fs::read(&input).unwrap();
        push_flag(&mut args, flag, &target);
        let (code, err) = bounded(&args);
        let kept = std::fs::read(&input).unwrap() == before;
        (code == Some(2) && kept && err.lines().count() == 1)
            .then_some(())
            .ok_or(format!(
                "{command} {flag} onto {input_flag} ({}): exit {code:?}, input kept \
                     {kept}, stderr {err:?}",
                target.display()
            ))
    });
    assert!(failures.is_empty(), "{failures:#?}");
}
