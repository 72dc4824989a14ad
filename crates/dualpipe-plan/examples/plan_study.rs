//! Regenerates docs/planning.md's studies (heterogeneous devices, two datacenters) and their
//! pictures from the simulator: a maintainer's tool, not part of the `dualpipe` binary.
//!
//! ```sh
//! cargo run --release -p dualpipe-plan --example plan_study -- docs/img
//! ```
//!
//! Writes planning-study.md and the SVG pictures into the folder (created if missing), all or
//! none of them, and prints the study's tables.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out] = args.as_slice() else {
        eprintln!("usage: plan_study OUT_DIR (the folder for planning-study.md and the pictures)");
        return ExitCode::from(2);
    };
    let out = PathBuf::from(out);
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("error: {}: cannot create it: {e}", out.display());
        return ExitCode::from(2);
    }
    let (md, files) = match dualpipe_plan::study::run_all() {
        Ok(study) => study,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut batch = dualpipe_io::Batch::new();
    for (name, text) in files {
        if let Err(e) = batch.add(&out.join(name), text.into_bytes()) {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    if let Err(e) = batch.commit() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    print!("{md}");
    ExitCode::SUCCESS
}
