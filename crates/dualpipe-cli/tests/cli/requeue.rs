//! `train --resume-if-present`: one command line for a job's first run and every requeue
//! (docs/slurm.md): no checkpoint directory yet is a fresh run, said so; the same line again
//! continues the latest checkpoint with the uninterrupted run's losses; it conflicts with the
//! other resume flags and needs --checkpoint-dir.

use crate::{dualpipe, floats, s, TempDir};

/// A tiny MLP run of `steps` steps on 2 ranks, f64, checkpointing every 2 steps into `dir`.
fn run(dir: &std::path::Path, steps: &str, extra: &[&str]) -> Vec<String> {
    let flags = "train --format json --model mlp --ranks 2 --micro-batches 4 --micro-batch-size 2 \
                 --hidden 8 --dtype f64 --eval-every 0 --checkpoint-every 2";
    let mut args: Vec<String> = flags.split_whitespace().map(String::from).collect();
    args.extend(["--steps", steps, "--checkpoint-dir", s(dir)].map(String::from));
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

#[test]
fn resume_if_present_starts_fresh_then_continues_bit_for_bit() {
    let dir = TempDir::new("requeue");
    let ckpt = dir.join("not-yet").join("ckpt");
    // --resume refuses a directory that does not exist (a mistyped path)...
    dualpipe(run(&ckpt, "4", &["--resume"])).usage_error(&["does not exist"]);
    // ...--resume-if-present starts at step 1 and says so.
    let first = dualpipe(run(&ckpt, "4", &["--resume-if-present"]));
    first.ok();
    assert_eq!(first.json()["first_step"], 1);
    assert!(
        first.stderr.contains(&format!(
            "--resume-if-present: no checkpoint in {} yet; a fresh run, starting at step 1",
            ckpt.display()
        )),
        "{}",
        first.stderr
    );
    // The same line with more steps (a requeued job given its whole --steps) continues.
    let again = dualpipe(run(&ckpt, "6", &["--resume-if-present"]));
    again.ok();
    let resumed = again.json();
    assert_eq!(resumed["first_step"], 5, "{}", again.stderr);
    assert!(again.stderr.contains("resuming from"), "{}", again.stderr);
    let whole = dualpipe(run(&dir.join("whole"), "6", &[]));
    whole.ok();
    let whole = floats(&whole.json()["losses"]);
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut both = floats(&first.json()["losses"]);
    both.extend(floats(&resumed["losses"]));
    assert_eq!(bits(&both), bits(&whole));
}

#[test]
fn resume_if_present_conflicts_and_needs_a_directory() {
    let dir = TempDir::new("requeue-flags");
    let ckpt = dir.join("ckpt");
    for other in [["--resume", ""], ["--resume-from", s(&ckpt)]] {
        let mut args = run(&ckpt, "2", &["--resume-if-present", other[0]]);
        if !other[1].is_empty() {
            args.push(other[1].to_string());
        }
        let out = dualpipe(&args);
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert!(out.stderr.contains("cannot be used with"), "{}", out.stderr);
    }
    let out = dualpipe([
        "train",
        "--model",
        "mlp",
        "--steps",
        "1",
        "--resume-if-present",
    ]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--checkpoint-dir"), "{}", out.stderr);
}

/// Slurm preempts a job with two SIGTERMs a few milliseconds apart: the second must not end the
/// run before it reaches its step boundary and publishes its checkpoint.
#[test]
fn a_repeated_sigterm_still_stops_at_a_step_boundary_with_a_checkpoint() {
    let dir = TempDir::new("requeue-twice");
    let ckpt = dir.join("ckpt");
    let sigterm = [libc::SIGTERM, libc::SIGTERM];
    let out = crate::checkpoint_owner::interrupted(&ckpt, &["--resume-if-present"], &sigterm);
    assert_eq!(out.code, Some(143), "{}", out.stderr);
    assert!(
        out.stderr.contains("interrupted by SIGTERM after step")
            && out.stderr.contains("last checkpoint")
            // the requeue-safe setting is the one to give again
            && out.stderr.contains("(continue with --resume-if-present)"),
        "{}",
        out.stderr
    );
}
