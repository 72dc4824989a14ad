//! Issue 26, part B: what the user gave is never clobbered, the run log survives resumes,
//! second writers and full disks, inputs that are not files never hang a command, and
//! `generate` streams the model's exact bytes.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{dualpipe, s, TempDir};

/// A tiny GPT run's flags (as train_gpt.rs's, without validation between steps), ending with
/// `--steps` (the caller gives the count).
pub const TINY: [&str; 18] = [
    "--d-model",
    "16",
    "--heads",
    "2",
    "--seq-len",
    "8",
    "--ranks",
    "2",
    "--micro-batches",
    "4",
    "--micro-batch-size",
    "2",
    "--layers-per-stage",
    "1",
    "--eval-every",
    "0",
    "--quiet",
    "--steps",
];

fn train(steps: &str, extra: &[&str]) -> crate::Run {
    let mut args = vec!["train"];
    args.extend_from_slice(&TINY);
    args.push(steps);
    args.extend_from_slice(extra);
    dualpipe(args)
}

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(s(path)).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// The text every test trains on: 4,000 bytes.
fn corpus(dir: &TempDir) -> std::path::PathBuf {
    let text: Vec<u8> = (0..4000u32)
        .map(|i| b"abcdefgh "[(i % 9) as usize])
        .collect();
    dir.write("data.txt", text)
}

#[test]
fn an_output_onto_an_input_is_refused_before_any_work_and_the_input_kept() {
    let dir = TempDir::new("clash");
    let data = corpus(&dir);
    let before = std::fs::read(&data).unwrap();
    let init = dir.write("init.safetensors", b"not read: the clash is found first");
    for flag in ["--log", "--save", "--output", "--trace", "--svg"] {
        train("2", &["--data", s(&data), flag, s(&data)]).usage_error(&[
            flag,
            "--data",
            "same file",
        ]);
        assert_eq!(std::fs::read(&data).unwrap(), before, "{flag}");
    }
    // A hard link and a `./` spelling are the same file too.
    let link = dir.join("hard.txt");
    std::fs::hard_link(&data, &link).unwrap();
    train("2", &["--data", s(&data), "--log", s(&link)]).usage_error(&["--log", "--data"]);
    train("2", &["--init-from", s(&init), "--log", s(&init)])
        .usage_error(&["--log", "--init-from"]);
    assert_eq!(
        std::fs::read(&init).unwrap(),
        b"not read: the clash is found first"
    );
    // report, plan, simulate, eplb: the same check.
    let log = dir.write("r.jsonl", "{}\n");
    dualpipe(["report", s(&log), "-o", s(&log)]).usage_error(&["--output", "run log"]);
    dualpipe(["report", s(&log), "--svg", s(&log)]).usage_error(&["--svg", "run log"]);
    let topo = dir.write("t.json", "{}");
    let profile = dir.write("p.json", "{}");
    dualpipe([
        "plan",
        "--topology",
        s(&topo),
        "--profile",
        s(&profile),
        "--output",
        s(&topo),
    ])
    .usage_error(&["--output", "--topology"]);
    let csv = dir.write("s.csv", "0F0,0B0\n");
    dualpipe(["simulate", "--schedule-file", s(&csv), "--output", s(&csv)])
        .usage_error(&["--output", "--schedule-file"]);
    let loads = dir.write("loads.json", "[[1,2]]");
    dualpipe([
        "eplb",
        "--loads",
        s(&loads),
        "--replicas",
        "2",
        "--groups",
        "1",
        "--nodes",
        "1",
        "--gpus",
        "1",
        "--output",
        s(&loads),
    ])
    .usage_error(&["--output", "--loads"]);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "{}\n");
    assert_eq!(std::fs::read_to_string(&topo).unwrap(), "{}");
    assert_eq!(std::fs::read_to_string(&csv).unwrap(), "0F0,0B0\n");
}

#[test]
fn two_outputs_on_one_file_and_a_log_on_redirected_stdout_are_refused() {
    let dir = TempDir::new("clash-out");
    let out = dir.join("x");
    train("2", &["--log", s(&out), "--save", s(&out)]).usage_error(&["--log", "--save"]);
    train("2", &["--log", s(&out), "--output", s(&out)]).usage_error(&["--log", "--output"]);
    assert!(!out.exists());
    // `--log /dev/stdout` while the summary goes to the same file on stdout.
    let file = std::fs::File::create(dir.join("stdout.txt")).unwrap();
    let mut args: Vec<&str> = vec!["train"];
    args.extend_from_slice(&TINY);
    args.extend_from_slice(&["2", "--log", "/dev/stdout"]);
    let run = Command::new(env!("CARGO_BIN_EXE_dualpipe"))
        .args(&args)
        .stdout(file)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("standard output and --log /dev/stdout"),
        "{stderr}"
    );
    // With the summary elsewhere, the log on stdout is fine.
    let summary = dir.join("summary.txt");
    let file = std::fs::File::create(dir.join("stdout2.txt")).unwrap();
    args.extend_from_slice(&["--output", s(&summary)]);
    let run = Command::new(env!("CARGO_BIN_EXE_dualpipe"))
        .args(&args)
        .stdout(file)
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0));
    let log = std::fs::read_to_string(dir.join("stdout2.txt")).unwrap();
    assert_eq!(log.lines().count(), 2, "{log}");
}

/// The steps of a run log, in order.
fn steps(path: &std::path::Path) -> Vec<u64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn resume_keeps_the_log_before_the_checkpoint_and_drops_what_is_run_again() {
    let dir = TempDir::new("log-resume");
    let (ck, log) = (dir.join("ck"), dir.join("run.jsonl"));
    let common = [
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "3",
        "--log",
        s(&log),
    ];
    train("6", &common).ok();
    assert_eq!(steps(&log), (1..=6).collect::<Vec<_>>());
    let kept = std::fs::read_to_string(&log).unwrap();
    // The run went on past its last checkpoint (step 6) and was killed mid-line.
    let last = kept.lines().last().unwrap().to_string();
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    for step in 7..=8 {
        let line = last.replacen("\"step\":6", &format!("\"step\":{step}"), 1);
        writeln!(f, "{line}").unwrap();
    }
    f.write_all(b"{\"step\":9,\"elapsed").unwrap();
    drop(f);
    // Resumed from step 6's checkpoint: 7 and 8 are run again, the torn line is gone.
    let mut flags = common.to_vec();
    flags.push("--resume");
    train("9", &flags).ok();
    assert_eq!(steps(&log), (1..=9).collect::<Vec<_>>());
    assert!(std::fs::read_to_string(&log).unwrap().starts_with(&kept));
    dualpipe(["report", s(&log)]).ok();
}

#[test]
fn a_log_held_by_another_run_is_refused_and_left_alone() {
    let dir = TempDir::new("log-lock");
    let log = dir.write("run.jsonl", "the other run's line\n");
    let holder = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    holder.try_lock().unwrap();
    train("2", &["--log", s(&log)]).usage_error(&["--log", "another run"]);
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "the other run's line\n"
    );
    drop(holder);
    train("2", &["--log", s(&log)]).ok();
    assert_eq!(steps(&log), vec![1, 2]);
}

#[test]
fn a_log_that_cannot_be_written_is_dropped_and_training_goes_on() {
    let dir = TempDir::new("log-full");
    let save = dir.join("w.safetensors");
    let run = train("3", &["--log", "/dev/full", "--save", s(&save)]);
    run.ok();
    let warnings: Vec<&str> = run
        .stderr_lines()
        .into_iter()
        .filter(|l| l.contains("run log"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", run.stderr);
    assert!(
        warnings[0].contains("No space left on device"),
        "{}",
        run.stderr
    );
    assert!(!warnings[0].contains("os error"), "{}", run.stderr);
    assert!(run.stdout.contains("final"), "{}", run.stdout);
    assert!(save.exists());
}

/// Runs `dualpipe ARGS` and fails the test if it has not ended within 20 s.
fn within_20s(args: &[&str]) -> crate::Run {
    let start = Instant::now();
    let run = dualpipe(args);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{args:?} took too long"
    );
    run
}

#[test]
fn fifos_and_devices_never_hang_a_command() {
    let dir = TempDir::new("fifo");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let mut args = vec!["train"];
    args.extend_from_slice(&TINY);
    args.push("2");
    for data in [s(&fifo), "/dev/zero"] {
        let mut a = args.clone();
        a.extend_from_slice(&["--data", data]);
        within_20s(&a).usage_error(&["--data", "not a regular file"]);
    }
    let mut a = args.clone();
    a.extend_from_slice(&["--log", s(&fifo)]);
    within_20s(&a).usage_error(&["--log", "no process reads"]);
    within_20s(&["report", s(&fifo)]).usage_error(&["a FIFO, not a regular file"]);
    within_20s(&["report", "/dev/zero"]).usage_error(&["device"]);
    // JSON and CSV inputs of plan and cluster simulate: refused before any read
    let profile = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/plan/gpt32.json"
    );
    within_20s(&["plan", "--topology", s(&fifo), "--profile", profile])
        .usage_error(&["--topology", "not a regular file"]);
    within_20s(&[
        "cluster",
        "simulate",
        "--cluster",
        "/dev/zero",
        "--trace",
        s(&fifo),
        "--policy",
        "static",
    ])
    .usage_error(&["--cluster", "not a regular file"]);
}

#[test]
fn report_skips_a_torn_last_line_and_refuses_two_runs_in_one_file() {
    let dir = TempDir::new("report-torn");
    let log = dir.join("run.jsonl");
    train("3", &["--log", s(&log)]).ok();
    let whole = std::fs::read_to_string(&log).unwrap();
    let torn = dir.write("torn.jsonl", format!("\u{feff}{whole}{{\"step\":4,\"ela"));
    let run = dualpipe(["report", s(&torn)]);
    run.ok();
    assert!(run.stdout.contains("3 steps"), "{}", run.stdout);
    assert!(
        run.stderr.contains("line 4 is an incomplete last line"),
        "{}",
        run.stderr
    );
    let twice = dir.write("twice.jsonl", format!("{whole}{whole}"));
    dualpipe(["report", s(&twice)]).usage_error(&["line 4", "step 1 follows step 3"]);
}

#[test]
fn validation_none_and_short_data_name_the_fraction() {
    let dir = TempDir::new("valfrac");
    let data = corpus(&dir);
    let run = train("2", &["--data", s(&data), "--validation-fraction", "0"]);
    run.ok();
    assert!(
        run.stdout.contains("loss none (nothing held out"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("NaN"), "{}", run.stdout);
    let forty = dir.write("forty", [b'a'; 40]);
    train("2", &["--data", s(&forty)]).usage_error(&["--validation-fraction"]);
}

#[test]
fn an_unwritable_save_path_is_one_cause_and_exit_2_before_training() {
    let dir = TempDir::new("unwritable");
    let file = dir.write("afile", "x");
    let under = file.join("w.safetensors");
    let run = train("2", &["--save", s(&under)]);
    run.usage_error(&["afile"]);
    assert_eq!(
        run.stderr.matches("Not a directory").count(),
        1,
        "{}",
        run.stderr
    );
}

#[test]
fn a_schedule_file_over_64_mib_is_refused_before_reading() {
    let dir = TempDir::new("bigsched");
    let big = dir.join("big.csv");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((64 << 20) + 1)
        .unwrap();
    dualpipe(["simulate", "--schedule-file", s(&big)]).usage_error(&["64 MiB"]);
    // (no --ranks or --micro-batches: the schedule file gives them)
    dualpipe([
        "train",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--seq-len",
        "8",
        "--steps",
        "2",
        "--quiet",
        "--schedule-file",
        s(&big),
    ])
    .usage_error(&["64 MiB"]);
}

#[test]
fn generate_streams_exact_bytes_with_a_capped_count_and_range_messages() {
    let dir = TempDir::new("generate");
    let weights = dir.join("w.safetensors");
    train("2", &["--save", s(&weights)]).ok();
    let w = s(&weights);
    for (flag, value, needle) in [
        ("--max-tokens", "-1", "cannot be negative"),
        ("--max-tokens", "1000001", "1000000"),
        ("--temperature", "-1", "finite number"),
        ("--seed", "-1", "not a seed"),
    ] {
        let run = dualpipe(["generate", "--weights", w, "--prompt", "a", flag, value]);
        assert_eq!(run.code, Some(2), "{flag} {value}: {}", run.stderr);
        assert!(
            run.stderr.contains(needle),
            "{flag} {value}: {}",
            run.stderr
        );
        assert!(
            !run.stderr.contains("unexpected argument"),
            "{}",
            run.stderr
        );
    }
    // A prompt that is not UTF-8 comes back byte for byte, and so does every generated byte.
    let prompt = dir.write("prompt.bin", [0xff, 0xfe, 0x80, b'a']);
    let out = Command::new(env!("CARGO_BIN_EXE_dualpipe"))
        .args([
            "generate",
            "--weights",
            w,
            "--prompt-file",
            s(&prompt),
            "--max-tokens",
            "50",
            "--temperature",
            "5",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(&out.stdout[..4], &[0xff, 0xfe, 0x80, b'a']);
    assert_eq!(out.stdout.len(), 4 + 50 + 1, "no byte replaced by U+FFFD");
}
