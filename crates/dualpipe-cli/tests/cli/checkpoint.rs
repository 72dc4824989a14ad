//! Checkpoints end to end: `train --checkpoint-dir` / `--resume` / `--resume-from` continue
//! bit-identically (every schedule, both models, f32 and f64, data parallelism with 1-bit
//! compression and error feedback), resharding onto another grid, damage detection and
//! fallback, pruning that spares the user's files, `checkpoint inspect`, `--init-from DIR`.

use serde_json::Value;

use crate::{close, dualpipe, floats, s, TempDir};

/// A tiny run of `model` (2 ranks, 4 micro-batches of 2 rows, one block per stage).
fn tiny(model: &str) -> Vec<String> {
    let mut args: Vec<&str> = vec![
        "train",
        "--format",
        "json",
        "--quiet",
        "--model",
        model,
        "--micro-batch-size",
        "2",
        "--eval-every",
        "0",
    ];
    if model == "gpt" {
        args.extend(["--d-model", "16", "--heads", "2", "--seq-len", "8"]);
    } else {
        args.extend(["--hidden", "8"]);
    }
    args.into_iter().map(String::from).collect()
}

fn run_json(mut args: Vec<String>, extra: &[&str]) -> Value {
    args.extend(extra.iter().map(|a| a.to_string()));
    let run = dualpipe(&args);
    run.ok();
    run.json()
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// An uninterrupted 4-step run that checkpoints every 2 steps, then a run resumed from its
/// step-2 checkpoint: the resumed losses are the uninterrupted run's steps 3 and 4, bit for
/// bit.
fn check_resume(model: &str, flags: &[&str]) {
    let dir = TempDir::new("ckpt-resume");
    let ckpt = dir.join("ckpt");
    let mut full_flags = flags.to_vec();
    full_flags.extend([
        "--steps",
        "4",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "2",
    ]);
    let full = run_json(tiny(model), &full_flags);
    let full_losses = floats(&full["losses"]);
    assert_eq!(full_losses.len(), 4);
    assert_eq!(full["first_step"], 1);
    let plain = {
        let mut f = flags.to_vec();
        f.extend(["--steps", "4"]);
        run_json(tiny(model), &f)
    };
    assert_eq!(
        bits(&floats(&plain["losses"])),
        bits(&full_losses),
        "{model} {flags:?}: checkpointing changed the losses"
    );
    let step2 = ckpt.join("step-000002");
    assert!(step2.join("manifest.json").is_file(), "{model} {flags:?}");
    let mut resumed_flags = flags.to_vec();
    resumed_flags.extend(["--steps", "4", "--resume-from", s(&step2)]);
    let resumed = run_json(tiny(model), &resumed_flags);
    assert_eq!(resumed["first_step"], 3, "{model} {flags:?}");
    assert_eq!(
        bits(&floats(&resumed["losses"])),
        bits(&full_losses[2..]),
        "{model} {flags:?}: the resumed losses differ from the uninterrupted run's"
    );
}

const SCHEDULES: [&[&str]; 6] = [
    &[
        "--schedule",
        "dualpipe",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
    ],
    &[
        "--schedule",
        "dualpipev",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
    ],
    &["--schedule", "1f1b", "--ranks", "2", "--micro-batches", "4"],
    &[
        "--schedule",
        "gpipe",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
    ],
    &["--schedule", "zb1p", "--ranks", "2", "--micro-batches", "4"],
    &[
        "--schedule",
        "interleaved",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
    ],
];

#[test]
fn resume_is_bit_identical_for_every_schedule_mlp() {
    for schedule in SCHEDULES {
        for dtype in ["f32", "f64"] {
            let mut flags = schedule.to_vec();
            flags.extend(["--dtype", dtype]);
            check_resume("mlp", &flags);
        }
    }
}

#[test]
fn resume_is_bit_identical_for_every_schedule_gpt() {
    for schedule in SCHEDULES {
        for dtype in ["f32", "f64"] {
            let mut flags = schedule.to_vec();
            flags.extend(["--dtype", dtype]);
            check_resume("gpt", &flags);
        }
    }
}

#[test]
fn resume_is_bit_identical_with_sgd_and_with_data_parallel_one_bit_compression() {
    let dp = [
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
        "--data-parallel",
        "2",
        "--gradient-compression",
        "1bit",
        // No variance refresh: a refresh step exchanges the gradient in int8 and keeps no
        // error feedback, and these checks are of the feedback.
        "--variance-refresh",
        "0",
    ];
    for dtype in ["f32", "f64"] {
        let mut flags = dp.to_vec();
        flags.extend(["--dtype", dtype]);
        check_resume("mlp", &flags);
    }
    check_resume("gpt", &dp);
    check_resume(
        "mlp",
        &["--schedule", "1f1b", "--ranks", "2", "--optimizer", "sgd"],
    );
    // The error feedback is part of the checkpoint.
    let dir = TempDir::new("ckpt-feedback");
    let ckpt = dir.join("ckpt");
    let mut flags = dp.to_vec();
    flags.extend([
        "--steps",
        "2",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "2",
    ]);
    run_json(tiny("mlp"), &flags);
    assert!(ckpt.join("step-000002/feedback.safetensors").is_file());
}

/// The learning-rate schedule is a function of the step count the optimizer state carries,
/// so a resumed run continues the same warm-up and cosine; and the schedule is really applied
/// (from the second step on, the losses leave the constant rate's).
#[test]
fn a_resume_continues_the_learning_rate_schedule() {
    let scheduled = [
        "--lr-warmup",
        "3",
        "--lr-decay",
        "cosine",
        "--lr-min",
        "0.0001",
    ];
    for model in ["gpt", "mlp"] {
        check_resume(model, &scheduled);
        let mut flags = scheduled.to_vec();
        flags.extend(["--steps", "3"]);
        let with = run_json(tiny(model), &flags);
        assert_eq!(
            with["lr_schedule"], "warm-up 3, cosine to 0.0001",
            "{model}"
        );
        let constant = run_json(tiny(model), &["--steps", "3", "--lr-warmup", "0"]);
        assert!(constant.get("lr_schedule").is_none(), "{model}");
        // The GPT's default warms up over a tenth of the steps; the MLP's rate is constant.
        let default = run_json(tiny(model), &["--steps", "20"]);
        let words = if model == "gpt" { "warm-up 2" } else { "" };
        assert_eq!(default["lr_schedule"].as_str().unwrap_or(""), words);
        let (a, b) = (floats(&with["losses"]), floats(&constant["losses"]));
        assert_eq!(
            a[0].to_bits(),
            b[0].to_bits(),
            "{model}: step 1 is before any update"
        );
        assert_ne!(
            a[1].to_bits(),
            b[1].to_bits(),
            "{model}: the warm-up changed nothing"
        );
    }
    // The floor defaults to a tenth of the peak, in its shortest words.
    let floor = ["--steps", "1", "--lr", "0.003", "--lr-decay", "cosine"];
    assert_eq!(
        run_json(tiny("mlp"), &floor)["lr_schedule"],
        "cosine to 0.0003"
    );
}

/// An MoE model's checkpoint holds the routers' selection biases (model state beside the
/// weights), so its resume is bit-identical too (with expert parallelism as well); the bias
/// moves fast here so that a resume without it would show.
#[test]
fn an_moe_resume_is_bit_identical_with_its_selection_biases() {
    let moe = [
        "--experts",
        "4",
        "--top-k",
        "2",
        "--bias-update-rate",
        "0.05",
    ];
    for schedule in [SCHEDULES[0], SCHEDULES[2]] {
        for dtype in ["f32", "f64"] {
            let mut flags = schedule.to_vec();
            flags.extend(moe);
            flags.extend(["--dtype", dtype]);
            check_resume("gpt", &flags);
        }
    }
    // Expert parallelism: each worker stores only its experts; a re-placement after every
    // step moves them (and their optimizer state), and the resume takes the placement back.
    let mut flags = SCHEDULES[0].to_vec();
    flags.extend(moe);
    flags.extend(
        "--data-parallel 2 --expert-parallel --redundant-experts 2 --eplb-every 1".split(' '),
    );
    check_resume("gpt", &flags);
    let dir = TempDir::new("ckpt-moe");
    let ckpt = dir.join("ckpt");
    let mut flags = SCHEDULES[0].to_vec();
    flags.extend(moe);
    flags.extend([
        "--steps",
        "2",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "2",
    ]);
    run_json(tiny("gpt"), &flags);
    for l in 0..2 {
        let file =
            std::fs::read(ckpt.join(format!("step-000002/block-{l:04}.safetensors"))).unwrap();
        let name = format!("blocks.{l}.moe.router.selection_bias");
        assert!(
            file.windows(name.len()).any(|w| w == name.as_bytes()),
            "block {l}'s file lacks {name}"
        );
    }
}

/// Written under DualPipe on 4 ranks (2 blocks per stage, 2 replicas), resumed under 1F1B on 2
/// ranks (4 blocks per stage, 1 replica, twice the micro-batches): the same model and the same
/// global batches, so the losses continue within 1e-10 (f64).
#[test]
fn a_checkpoint_resumes_on_another_grid() {
    for model in ["mlp", "gpt"] {
        let dir = TempDir::new("ckpt-reshard");
        let ckpt = dir.join("ckpt");
        let written = [
            "--dtype",
            "f64",
            "--schedule",
            "dualpipe",
            "--ranks",
            "4",
            "--layers-per-stage",
            "2",
            "--micro-batches",
            "8",
            "--data-parallel",
            "2",
            "--steps",
            "4",
        ];
        let mut flags = written.to_vec();
        flags.extend(["--checkpoint-dir", s(&ckpt), "--checkpoint-every", "2"]);
        let full = floats(&run_json(tiny(model), &flags)["losses"]);
        let resumed = run_json(
            tiny(model),
            &[
                "--dtype",
                "f64",
                "--schedule",
                "1f1b",
                "--ranks",
                "2",
                "--layers-per-stage",
                "4",
                "--micro-batches",
                "16",
                "--steps",
                "4",
                "--resume-from",
                s(&ckpt.join("step-000002")),
            ],
        );
        let again = floats(&resumed["losses"]);
        assert_eq!(again.len(), 2);
        for (a, b) in again.iter().zip(&full[2..]) {
            assert!(close(*a, *b, 1e-10), "{model}: {again:?} vs {full:?}");
        }
    }
}

/// A 1-bit checkpoint of 2 replicas resumed on 4 (the same global batch: half the
/// micro-batches each) carries its error feedback over (worker residuals averaged, the
/// averaged buckets' residuals re-split) and says so; the resumed steps differ from a resume
/// that drops the feedback (a different `--bucket-mb` with the same single bucket), so the
/// residuals carried over are really used. 1-bit Adam after its default warm-up (one step in 50,
/// rounded up: step 1) is told of at the start of the run.
#[test]
fn a_one_bit_checkpoint_carries_its_error_feedback_to_another_data_parallel_degree() {
    let dir = TempDir::new("ckpt-regroup");
    let ckpt = dir.join("ckpt");
    let grid = |replicas: &'static str, micro_batches: &'static str| {
        [
            "--dtype",
            "f64",
            "--schedule",
            "1f1b",
            "--ranks",
            "2",
            "--gradient-compression",
            "1bit",
            "--data-parallel",
            replicas,
            "--micro-batches",
            micro_batches,
            "--steps",
            "4",
            // Every step after the warm-up in 1 bit (no int8 refresh step), so the resumed
            // steps use the feedback carried over.
            "--variance-refresh",
            "0",
        ]
    };
    let mut flags = grid("2", "4").to_vec();
    flags.extend(["--checkpoint-dir", s(&ckpt), "--checkpoint-every", "2"]);
    let mut args = tiny("mlp");
    args.retain(|a| a != "--quiet");
    args.extend(flags.iter().map(|f| f.to_string()));
    let first = dualpipe(&args);
    first.ok();
    assert!(
        first
            .stderr
            .contains("1-bit Adam: steps 1-1 of 4 exchange the gradient in int8"),
        "{}",
        first.stderr
    );
    let resume = |extra: &[&str]| {
        let mut args = tiny("mlp");
        args.retain(|a| a != "--quiet");
        args.extend(grid("4", "2").iter().map(|f| f.to_string()));
        args.extend(["--resume-from".into(), s(&ckpt.join("step-000002")).into()]);
        args.extend(extra.iter().map(|f| f.to_string()));
        let run = dualpipe(&args);
        run.ok();
        (floats(&run.json()["losses"]), run.stderr)
    };
    let (carried, said) = resume(&[]);
    assert!(
        said.contains("error feedback of 2 replicas carried over to 4"),
        "{said}"
    );
    let (dropped, said) = resume(&["--bucket-mb", "24"]);
    assert!(said.contains("starts from zeros"), "{said}");
    assert_eq!(carried.len(), 2);
    assert_eq!(
        carried[0].to_bits(),
        dropped[0].to_bits(),
        "step 3's forward"
    );
    assert_ne!(
        carried[1].to_bits(),
        dropped[1].to_bits(),
        "the carried-over feedback changed nothing"
    );
}

#[test]
fn damage_is_reported_and_the_previous_checkpoint_used() {
    let dir = TempDir::new("ckpt-damage");
    let ckpt = dir.join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    std::fs::write(ckpt.join("notes.txt"), "the user's own file").unwrap();
    let base = ["--schedule", "1f1b", "--ranks", "2", "--dtype", "f64"];
    let mut flags = base.to_vec();
    flags.extend([
        "--steps",
        "6",
        "--checkpoint-dir",
        s(&ckpt),
        "--checkpoint-every",
        "1",
        "--keep-checkpoints",
        "3",
    ]);
    let full = floats(&run_json(tiny("mlp"), &flags)["losses"]);
    let mut names: Vec<String> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ".lock",
            "latest",
            "notes.txt",
            "step-000004",
            "step-000005",
            "step-000006"
        ]
    );
    // Damage the latest (a truncated file): --resume reports it and uses step 5.
    let file = ckpt.join("step-000006/block-0001.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 8]).unwrap();
    let mut args = tiny("mlp");
    args.extend(base.iter().map(|a| a.to_string()));
    args.extend(
        [
            "--steps",
            "7",
            "--checkpoint-dir",
            s(&ckpt),
            "--checkpoint-every",
            "1",
            "--resume",
        ]
        .iter()
        .map(|a| a.to_string()),
    );
    let run = dualpipe(&args);
    run.ok();
    assert!(
        run.stderr.contains("step-000006") && run.stderr.contains("damaged"),
        "{}",
        run.stderr
    );
    let doc = run.json();
    assert_eq!(doc["first_step"], 6);
    assert_eq!(floats(&doc["losses"])[0].to_bits(), full[5].to_bits());
    // The resumed run rewrote step 6, wrote step 7 and pruned step 4. A missing manifest
    // (step 5), a truncated file (step 6) and a wrong hash (step 7): nothing left to fall
    // back to.
    assert!(!ckpt.join("step-000004").exists());
    std::fs::remove_file(ckpt.join("step-000005/manifest.json")).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 8]).unwrap();
    let seven = ckpt.join("step-000007/block-0000.safetensors");
    let mut bytes = std::fs::read(&seven).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&seven, &bytes).unwrap();
    let run = dualpipe(&args);
    run.usage_error(&["damaged", "step-000007", "crc-32"]);
    assert!(ckpt.join("notes.txt").is_file());
    // inspect names the damage of each.
    let inspect = dualpipe(["checkpoint", "inspect", s(&ckpt)]);
    inspect.ok();
    assert_eq!(
        inspect.stdout.matches("DAMAGED").count(),
        3,
        "{}",
        inspect.stdout
    );
}

#[test]
fn bad_resumes_are_one_line_and_exit_two() {
    let dir = TempDir::new("ckpt-bad");
    let missing = dir.join("missing");
    let mut args = tiny("mlp");
    args.extend(["--steps", "2", "--checkpoint-dir", s(&missing), "--resume"].map(String::from));
    dualpipe(&args).usage_error(&["--resume", "does not exist"]);
    let mut args = tiny("mlp");
    args.extend(["--steps", "2", "--resume-from", s(&missing)].map(String::from));
    dualpipe(&args).usage_error(&["--resume-from", "does not exist"]);
    // A checkpoint of the MLP does not fit the GPT, nor another width.
    let ckpt = dir.join("ckpt");
    run_json(
        tiny("mlp"),
        &[
            "--ranks",
            "2",
            "--micro-batches",
            "4",
            "--steps",
            "2",
            "--checkpoint-dir",
            s(&ckpt),
            "--checkpoint-every",
            "1",
        ],
    );
    let mut gpt = tiny("gpt");
    gpt.extend(["--steps", "3", "--resume-from", s(&ckpt)].map(String::from));
    dualpipe(&gpt).usage_error(&["does not fit", "model mlp"]);
    let mut wide: Vec<String> = tiny("mlp")
        .into_iter()
        .map(|a| if a == "8" { "16".to_string() } else { a })
        .collect();
    wide.extend(
        [
            "--ranks",
            "2",
            "--micro-batches",
            "4",
            "--steps",
            "3",
            "--resume-from",
            s(&ckpt),
        ]
        .map(String::from),
    );
    dualpipe(&wide).usage_error(&["does not fit", "hidden 8"]);
    let mut done = tiny("mlp");
    done.extend(
        [
            "--ranks",
            "2",
            "--micro-batches",
            "4",
            "--steps",
            "2",
            "--resume-from",
            s(&ckpt),
        ]
        .map(String::from),
    );
    dualpipe(&done).usage_error(&["raise --steps"]);
    // A directory without checkpoints under --resume: a fresh start.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let mut fresh = tiny("mlp");
    fresh.extend(["--steps", "1", "--checkpoint-dir", s(&empty), "--resume"].map(String::from));
    let run = dualpipe(&fresh);
    run.ok();
    assert_eq!(run.json()["first_step"], 1);
}

#[test]
fn inspect_lists_steps_shapes_sizes_and_init_from_reads_the_weights() {
    let dir = TempDir::new("ckpt-inspect");
    let ckpt = dir.join("ckpt");
    run_json(
        tiny("gpt"),
        &[
            "--schedule",
            "dualpipev",
            "--ranks",
            "2",
            "--micro-batches",
            "4",
            "--steps",
            "2",
            "--checkpoint-dir",
            s(&ckpt),
            "--checkpoint-every",
            "1",
        ],
    );
    let run = dualpipe(["checkpoint", "inspect", s(&ckpt), "--format", "json"]);
    run.ok();
    let doc = run.json();
    assert_eq!(doc["latest"], "step-000002");
    let list = doc["checkpoints"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[1]["step"], 2);
    assert_eq!(list[1]["ok"], true);
    assert_eq!(list[1]["schedule"]["kind"], "dualpipev");
    assert_eq!(list[1]["schedule"]["model_stages"], 4);
    assert!(list[1]["bytes"].as_u64().unwrap() > 0);
    let table = dualpipe(["checkpoint", "inspect", s(&ckpt)]);
    table.ok();
    assert!(
        table.stdout.contains("dualpipev") && table.stdout.contains("gpt d16 h2"),
        "{}",
        table.stdout
    );
    dualpipe(["checkpoint", "inspect", s(&dir.join("nope"))]).usage_error(&["not a directory"]);
    // --init-from a checkpoint: its weights (4 blocks), on another shape.
    let mut args = tiny("gpt");
    args.truncate(args.len() - 6); // the architecture comes from the checkpoint
    args.extend(
        [
            "--schedule",
            "1f1b",
            "--ranks",
            "2",
            "--steps",
            "1",
            "--init-from",
            s(&ckpt),
        ]
        .map(String::from),
    );
    let run = dualpipe(&args);
    run.ok();
    let doc = run.json();
    assert_eq!(doc["d_model"], 16);
    // 4 model stages of 2 blocks written, 2 stages of 4 read.
    assert_eq!(doc["layers_per_stage"], 4);
    assert_eq!(doc["first_step"], 1);
}

#[test]
fn mixed_precision_resumes_bit_identically_and_across_dtypes() {
    let v = [
        "--schedule",
        "dualpipev",
        "--ranks",
        "2",
        "--micro-batches",
        "4",
    ];
    for dtype in ["bf16", "f16"] {
        let mut flags = v.to_vec();
        flags.extend(["--dtype", dtype]);
        check_resume("gpt", &flags);
    }
    let mut mlp = v.to_vec();
    mlp.extend(["--dtype", "bf16"]);
    check_resume("mlp", &mlp);
    // The master weights are f32 in every dtype but f64: a checkpoint of one resumes in the
    // other, and continues close to the uninterrupted run.
    let dir = TempDir::new("ckpt-dtypes");
    for (from, to) in [("f32", "bf16"), ("bf16", "f32"), ("f16", "bf16")] {
        let ckpt = dir.join(&format!("{from}-{to}"));
        let mut first = v.to_vec();
        first.extend([
            "--dtype",
            from,
            "--steps",
            "4",
            "--checkpoint-dir",
            s(&ckpt),
        ]);
        first.extend(["--checkpoint-every", "2"]);
        let full = floats(&run_json(tiny("gpt"), &first)["losses"]);
        let mut then = v.to_vec();
        let step2 = ckpt.join("step-000002");
        then.extend(["--dtype", to, "--steps", "4", "--resume-from", s(&step2)]);
        let resumed = run_json(tiny("gpt"), &then);
        assert_eq!(resumed["first_step"], 3, "{from} -> {to}");
        assert_eq!(resumed["dtype"], to);
        for (got, want) in floats(&resumed["losses"]).iter().zip(&full[2..]) {
            assert!(
                (got - want).abs() < 0.02 * want,
                "{from} -> {to}: {got} against {want}"
            );
        }
    }
}

#[test]
fn f16_refuses_a_lossy_gradient_compression() {
    let mut args = tiny("gpt");
    args.extend(
        [
            "--dtype",
            "f16",
            "--data-parallel",
            "2",
            "--gradient-compression",
            "int8",
        ]
        .map(String::from),
    );
    dualpipe(&args).usage_error(&["--dtype f16", "--gradient-compression int8", "bf16"]);
}
