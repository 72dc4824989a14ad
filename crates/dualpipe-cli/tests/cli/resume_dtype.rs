//! Probe 3's L15: `--resume` across a dtype change. f32, bf16 and f16 checkpoints hold the same
//! f32 state and interchange, with a one-line note on stderr naming the change (even under
//! `--quiet`); a change into or out of f64 (the exact mode) is refused like any changed
//! setting, unless `--allow-changed-settings`.

use crate::{dualpipe, s, TempDir};

fn train(dir: &std::path::Path, steps: &str, dtype: &str, extra: &[&str]) -> crate::Run {
    let mut args = vec!["train"];
    args.extend_from_slice(&crate::io_paths::TINY);
    args.extend_from_slice(&[steps, "--dtype", dtype, "--checkpoint-every", "1"]);
    args.extend_from_slice(&["--checkpoint-dir", s(dir)]);
    args.extend_from_slice(extra);
    dualpipe(args)
}

#[test]
fn a_resume_in_another_dtype_is_said_and_f64_changes_are_refused() {
    let dir = TempDir::new("resume-dtype");
    let half = dir.join("half");
    train(&half, "1", "f32", &[]).ok();
    let run = train(&half, "2", "bf16", &["--resume"]);
    run.ok();
    assert!(
        run.stderr
            .contains("the checkpoint was trained with --dtype f32; this run continues in bf16"),
        "{}",
        run.stderr
    );
    let exact = dir.join("exact");
    train(&exact, "1", "f64", &[]).ok();
    train(&exact, "2", "f16", &["--resume"])
        .usage_error(&["--dtype f16 (the checkpoint's: f64; f64 is the exact mode)"]);
    let run = train(
        &exact,
        "2",
        "f16",
        &["--resume", "--allow-changed-settings"],
    );
    run.ok();
    assert!(
        run.stderr.contains("trained with --dtype f64"),
        "{}",
        run.stderr
    );
    // The same dtype: nothing said.
    let run = train(&exact, "3", "f16", &["--resume"]);
    run.ok();
    assert!(!run.stderr.contains("--dtype"), "{}", run.stderr);
}
