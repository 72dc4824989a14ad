//! Checkpoint directories owned by one run, and nothing the user has touched (issue 26):
//! `latest` never written through a link or over a user's file, a fresh run refusing another
//! run's directory, a lock against a second writer, pruning only our own directories, dead
//! runs' temp directories removed, `--resume` refusing changed settings, non-finite weights
//! never published, saved or loaded, and Ctrl-C / SIGTERM stopping at a step boundary with a
//! final checkpoint that resumes bit-identically.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::{dualpipe, floats, s, Run, TempDir};

/// A tiny MLP run in f64 (2 ranks, 4 micro-batches of 2 rows), JSON summary, quiet.
fn mlp(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "--format",
        "json",
        "--quiet",
        "--model",
        "mlp",
        "--hidden",
        "8",
        "--micro-batch-size",
        "2",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--schedule",
        "1f1b",
        "--dtype",
        "f64",
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// A tiny GPT run (d 16, 2 heads, seq 8).
fn gpt(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "--format",
        "json",
        "--quiet",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--seq-len",
        "8",
        "--micro-batch-size",
        "2",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--layers-per-stage",
        "1",
        "--eval-every",
        "0",
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(s(path)).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// CRC-32 (IEEE), as the manifest writes it.
fn crc32(bytes: &[u8]) -> String {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    format!("{:08x}", !crc)
}

/// Overwrites the first 8 bytes of a safetensors file's data with 0xff (NaN in f32 and f64).
fn poison(bytes: &mut [u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[8 + n..8 + n + 8].fill(0xff);
}

#[test]
fn latest_is_never_written_through_a_link_nor_over_a_users_file() {
    let dir = TempDir::new("own-latest");
    let victim = dir.write("notes.txt", "my notes, do not lose\n");
    let run1 = dir.join("run1");
    std::fs::create_dir_all(&run1).unwrap();
    std::os::unix::fs::symlink(&victim, run1.join("latest")).unwrap();
    let train = mlp(&["--steps", "2", "--checkpoint-dir", s(&run1)]);
    dualpipe(&train).usage_error(&["latest", "symbolic link", "not replaced"]);
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "my notes, do not lose\n"
    );
    // A user's own file named `latest`.
    let run2 = dir.join("run2");
    std::fs::create_dir_all(&run2).unwrap();
    std::fs::write(run2.join("latest"), "my notes: the latest results\n").unwrap();
    let train = mlp(&["--steps", "2", "--checkpoint-dir", s(&run2)]);
    dualpipe(&train).usage_error(&["latest", "does not hold"]);
    assert_eq!(
        std::fs::read_to_string(run2.join("latest")).unwrap(),
        "my notes: the latest results\n"
    );
    // `latest` a directory: refused before training.
    let run3 = dir.join("run3");
    std::fs::create_dir_all(run3.join("latest")).unwrap();
    let train = mlp(&["--steps", "2", "--checkpoint-dir", s(&run3)]);
    dualpipe(&train).usage_error(&["latest", "a directory"]);
    // A FIFO named `latest` is never opened: inspect and --resume do not block.
    let run4 = dir.join("run4");
    let train = mlp(&[
        "--steps",
        "2",
        "--checkpoint-dir",
        s(&run4),
        "--checkpoint-every",
        "1",
    ]);
    dualpipe(&train).ok();
    std::fs::remove_file(run4.join("latest")).unwrap();
    mkfifo(&run4.join("latest"));
    let inspect = dualpipe(["checkpoint", "inspect", s(&run4)]);
    inspect.ok();
    assert!(
        inspect.stdout.contains("not a pointer"),
        "{}",
        inspect.stdout
    );
    let resume = mlp(&["--steps", "3", "--checkpoint-dir", s(&run4), "--resume"]);
    // The resume finds step 2 by the directories, and refuses to replace the FIFO.
    dualpipe(&resume).usage_error(&["latest", "FIFO"]);
}

#[test]
fn a_directory_is_owned_by_one_run() {
    let dir = TempDir::new("own-run");
    let ckpt = dir.join("ckpt");
    let a = mlp(&[
        "--steps",
        "4",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "2",
    ]);
    dualpipe(&a).ok();
    let state = || std::fs::read_to_string(ckpt.join("step-000004/state.json")).unwrap();
    let before = state();
    let manifest = std::fs::read_to_string(ckpt.join("step-000004/manifest.json")).unwrap();
    assert!(manifest.contains("\"run\""), "{manifest}");
    // A fresh run (another seed) is refused, naming --resume; nothing of run A is touched.
    let mut b = mlp(&[
        "--steps",
        "6",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "2",
    ]);
    b.extend(["--seed", "5"].map(String::from));
    dualpipe(&b).usage_error(&["already holds checkpoints", "step-000004", "--resume"]);
    assert_eq!(state(), before);
    assert!(ckpt.join("step-000002").is_dir());
    // Another process holding the lock: refused, naming the holder.
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(ckpt.join(".lock"))
        .unwrap();
    use std::os::unix::io::AsRawFd;
    assert_eq!(
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    std::fs::write(ckpt.join(".lock"), "process 4242 (run feedc0de)\n").unwrap();
    let again = mlp(&[
        "--steps",
        "6",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "2",
        "--resume",
    ]);
    dualpipe(&again).usage_error(&["in use", "process 4242"]);
    drop(lock);
    // Resumed by its own run: fine.
    let run = dualpipe(&again);
    run.ok();
    assert_eq!(run.json()["first_step"], 5);
}

#[test]
fn only_our_directories_are_pruned_and_dead_runs_temps_removed() {
    let dir = TempDir::new("own-prune");
    let ckpt = dir.join("ckpt");
    std::fs::create_dir_all(ckpt.join("step-000001")).unwrap();
    std::fs::write(ckpt.join("step-000001/notes.txt"), "my own file").unwrap();
    // A killed run's temp directory (a process id that cannot exist), and a live one's.
    let dead = ckpt.join(".step-000002.tmp-2147483600-5");
    let live = ckpt.join(format!(".step-000002.tmp-{}-5", std::process::id()));
    std::fs::create_dir_all(&dead).unwrap();
    std::fs::create_dir_all(&live).unwrap();
    let train = mlp(&[
        "--steps",
        "8",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "2",
        "--keep-checkpoints",
        "1",
    ]);
    dualpipe(&train).ok();
    assert!(ckpt.join("step-000001/notes.txt").is_file());
    assert!(ckpt.join("step-000008").is_dir() && !ckpt.join("step-000006").exists());
    assert!(!dead.exists(), "a dead run's temp directory was kept");
    assert!(live.exists(), "a live process's temp directory was removed");
}

#[test]
fn resume_refuses_changed_settings_unless_allowed() {
    let dir = TempDir::new("own-settings");
    let ckpt = dir.join("ckpt");
    let base = gpt(&[
        "--steps",
        "2",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "2",
    ]);
    dualpipe(&base).ok();
    let resumed = |extra: &[&str]| {
        let mut args = gpt(&["--steps", "3", "--checkpoint-dir", s(&ckpt), "--resume"]);
        args.extend(extra.iter().map(|a| a.to_string()));
        dualpipe(&args)
    };
    resumed(&["--seed", "5", "--shuffle", "false"]).usage_error(&[
        "changed",
        "--seed 5",
        "--shuffle false",
        "--allow-changed-settings",
    ]);
    resumed(&["--task", "addition"]).usage_error(&["--task addition"]);
    resumed(&["--validation-fraction", "0.5"]).usage_error(&["--validation-fraction 0.5"]);
    let data = dir.write("text.txt", "hello world, a text to train on. ".repeat(40));
    resumed(&["--data", s(&data)]).usage_error(&["--data"]);
    let allowed = resumed(&["--seed", "5", "--allow-changed-settings"]);
    allowed.ok();
    assert_eq!(allowed.json()["first_step"], 3);
    // --resume with --init-from: refused.
    let mut both = gpt(&["--steps", "3", "--checkpoint-dir", s(&ckpt), "--resume"]);
    both.extend(["--init-from", s(&ckpt)].map(String::from));
    let run = dualpipe(&both);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("--init-from"), "{}", run.stderr);
}

#[test]
fn non_finite_weights_are_never_published_saved_or_loaded() {
    let dir = TempDir::new("own-nan");
    let ckpt = dir.join("ckpt");
    let saved = dir.join("w.safetensors");
    let diverge = gpt(&[
        "--steps",
        "10",
        "--optimizer",
        "sgd",
        "--lr",
        "1e30",
        "--lr-warmup",
        "0",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "1",
        "--keep-checkpoints",
        "1",
        "--save",
        s(&saved),
    ]);
    let run = dualpipe(&diverge);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("not a finite number") || run.stderr.contains("diverged"),
        "{}",
        run.stderr
    );
    assert!(!saved.exists(), "--save wrote non-finite weights");
    // The published checkpoint (and the only one kept) is finite.
    let inspect = dualpipe(["checkpoint", "inspect", s(&ckpt)]);
    inspect.ok();
    assert!(!inspect.stdout.contains("DAMAGED"), "{}", inspect.stdout);
    assert!(ckpt.join("step-000001/manifest.json").is_file());
    // --save of a run that diverges only in its weights (loss still finite at the end).
    let only_save = gpt(&[
        "--steps",
        "2",
        "--optimizer",
        "sgd",
        "--lr",
        "1e30",
        "--lr-warmup",
        "0",
        "--save",
        s(&saved),
    ]);
    let run = dualpipe(&only_save);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("diverged"), "{}", run.stderr);
    assert!(!saved.exists());
    // A weights file holding NaN: eval, generate and --init-from name the tensor, exit 2.
    let good = dir.join("good.safetensors");
    dualpipe(gpt(&["--steps", "1", "--save", s(&good)])).ok();
    let mut bytes = std::fs::read(&good).unwrap();
    poison(&mut bytes);
    let bad = dir.write("bad.safetensors", &bytes);
    let text = dir.write(
        "text.txt",
        "some text to evaluate on, again and again. ".repeat(10),
    );
    dualpipe(["eval", "--weights", s(&bad), "--data", s(&text)])
        .usage_error(&["tensor", "not a finite number"]);
    dualpipe(["generate", "--weights", s(&bad), "--prompt", "hi"])
        .usage_error(&["tensor", "not a finite number"]);
    let init = vec![
        "train",
        "--quiet",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--steps",
        "1",
        "--micro-batch-size",
        "2",
        "--eval-every",
        "0",
        "--init-from",
        s(&bad),
    ];
    dualpipe(&init).usage_error(&["--init-from", "not a finite number"]);
    // A non-regular file as weights: refused up front, never read (no hang, no memory).
    dualpipe(["eval", "--weights", "/dev/zero", "--data", s(&text)])
        .usage_error(&["/dev/zero", "not a regular file"]);
    let fifo = dir.join("fifo.safetensors");
    mkfifo(&fifo);
    dualpipe(["generate", "--weights", s(&fifo), "--prompt", "hi"])
        .usage_error(&["not a regular file"]);
    let init = vec![
        "train",
        "--quiet",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--steps",
        "1",
        "--micro-batch-size",
        "2",
        "--eval-every",
        "0",
        "--init-from",
        s(&fifo),
    ];
    dualpipe(&init).usage_error(&["not a regular file"]);
}

#[test]
fn a_non_finite_checkpoint_is_damaged_and_the_previous_used() {
    let dir = TempDir::new("own-nan-resume");
    let ckpt = dir.join("ckpt");
    let base = gpt(&[
        "--dtype",
        "f64",
        "--steps",
        "4",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "2",
    ]);
    let full = floats(&dualpipe(&base).ok().json()["losses"]);
    // Poison step 4's first block and make its manifest agree (a diverged run's checkpoint).
    let step4 = ckpt.join("step-000004");
    let poison_step4 = || {
        let file = step4.join("block-0000.safetensors");
        let mut bytes = std::fs::read(&file).unwrap();
        let old_crc = crc32(&bytes);
        poison(&mut bytes);
        std::fs::write(&file, &bytes).unwrap();
        let manifest = std::fs::read_to_string(step4.join("manifest.json")).unwrap();
        assert!(manifest.contains(&old_crc));
        let manifest = manifest.replace(&old_crc, &crc32(&bytes));
        std::fs::write(step4.join("manifest.json"), manifest).unwrap();
    };
    poison_step4();
    let inspect = dualpipe(["checkpoint", "inspect", s(&ckpt)]);
    inspect.ok();
    assert!(
        inspect.stdout.contains("DAMAGED") && inspect.stdout.contains("not a finite number"),
        "{}",
        inspect.stdout
    );
    let mut resume = base.clone();
    resume.extend(["--resume"].map(String::from));
    let run = dualpipe(&resume);
    run.ok();
    assert!(
        run.stderr.contains("step-000004") && run.stderr.contains("previous"),
        "{}",
        run.stderr
    );
    let doc = run.json();
    assert_eq!(doc["first_step"], 3);
    assert_eq!(bits(&floats(&doc["losses"])), bits(&full[2..]));
    // --init-from the directory: the same warning, and the checkpoint read is named (the
    // resumed run rewrote a good step 4: poison it again).
    poison_step4();
    let init = vec![
        "train",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--steps",
        "1",
        "--micro-batch-size",
        "2",
        "--eval-every",
        "0",
        "--init-from",
        s(&ckpt),
    ];
    let run = dualpipe(&init);
    run.ok();
    assert!(
        run.stderr.contains("warning") && run.stderr.contains("step-000004"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("step-000002"), "{}", run.stderr);
}

#[test]
fn checkpoint_path_messages_say_what_is_wrong() {
    let dir = TempDir::new("own-paths");
    let file = dir.write("afile", "x");
    dualpipe(mlp(&["--steps", "1", "--checkpoint-dir", s(&file)]))
        .usage_error(&["afile", "is a file"]);
    dualpipe(mlp(&[
        "--steps",
        "1",
        "--checkpoint-dir",
        s(&file),
        "--resume",
    ]))
    .usage_error(&["afile", "is a file"]);
    dualpipe(mlp(&[
        "--steps",
        "1",
        "--resume-from",
        s(&dir.join("nothere/step-000002")),
    ]))
    .usage_error(&["nothere", "does not exist"]);
    // A manifest that leaves out a file: damaged, and the previous checkpoint used.
    let ckpt = dir.join("ckpt");
    let base = gpt(&[
        "--steps",
        "4",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "2",
    ]);
    dualpipe(&base).ok();
    let path = ckpt.join("step-000004/manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest["files"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f["name"] != "head.safetensors");
    std::fs::write(&path, manifest.to_string()).unwrap();
    let resume = gpt(&["--steps", "5", "--checkpoint-dir", s(&ckpt), "--resume"]);
    let run = dualpipe(&resume);
    run.ok();
    assert!(run.stderr.contains("norm_f.weight"), "{}", run.stderr);
    assert_eq!(run.json()["first_step"], 3);
}

/// Starts a long f64 run that checkpoints every 5 steps, waits for its first checkpoint,
/// sends `signals` one after another (10 ms apart), and returns the finished run.
pub(crate) fn interrupted(ckpt: &Path, extra: &[&str], signals: &[i32]) -> Run {
    let mut args = mlp(&[
        "--steps",
        "1000000",
        "--checkpoint-dir",
        s(ckpt),
        "--checkpoint-every",
        "5",
    ]);
    args.extend(extra.iter().map(|a| a.to_string()));
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_dualpipe"))
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let began = Instant::now();
    while !ckpt.join("latest").exists() {
        assert!(began.elapsed() < Duration::from_secs(120), "no checkpoint");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(50));
    for &signal in signals {
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        // Apart, as Slurm's two are: two pending signals of one kind would merge into one.
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    Run {
        args,
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stdout_bytes: out.stdout,
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

#[test]
fn sigterm_and_ctrl_c_stop_at_a_step_boundary_with_a_checkpoint_that_resumes_exactly() {
    for (signal, code, name, extra) in [
        (libc::SIGTERM, 143, "SIGTERM", &[][..]),
        (libc::SIGINT, 130, "SIGINT", &["--data-parallel", "2"][..]),
    ] {
        let dir = TempDir::new("own-signal");
        let ckpt = dir.join("ckpt");
        let run = interrupted(&ckpt, extra, &[signal]);
        assert_eq!(run.code, Some(code), "{}", run.stderr);
        assert!(run.stdout.is_empty());
        let line = run
            .stderr_lines()
            .last()
            .copied()
            .unwrap_or_default()
            .to_string();
        assert!(
            line.contains(name) && line.contains("last checkpoint"),
            "{}",
            run.stderr
        );
        // The final checkpoint is of the step the run stopped after, complete.
        let pointer = std::fs::read_to_string(ckpt.join("latest")).unwrap();
        let step: usize = pointer.trim().trim_start_matches("step-").parse().unwrap();
        assert!(
            line.contains(&format!("after step {step} ")),
            "{line} vs {pointer}"
        );
        assert!(ckpt.join(pointer.trim()).join("manifest.json").is_file());
        let names: Vec<String> = std::fs::read_dir(&ckpt)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
        // Resumed, it gives the uninterrupted run's losses bit for bit.
        let total = (step + 3).to_string();
        let mut resume = mlp(&["--steps", &total, "--checkpoint-dir", s(&ckpt), "--resume"]);
        resume.extend(extra.iter().map(|a| a.to_string()));
        let resumed = dualpipe(&resume);
        resumed.ok();
        let mut plain = mlp(&["--steps", &total]);
        plain.extend(extra.iter().map(|a| a.to_string()));
        let full = floats(&dualpipe(&plain).ok().json()["losses"]);
        let again = floats(&resumed.json()["losses"]);
        assert_eq!(again.len(), 3);
        assert_eq!(bits(&again), bits(&full[step..]), "{name}");
    }
}
