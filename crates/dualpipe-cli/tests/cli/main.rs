//! End-to-end tests of the `dualpipe` binary: every subcommand run as a user runs it (a child
//! process with flags), checked on its exit code, stdout, stderr and the files it writes.
//!
//! One test binary (this folder) keeps link time down; each subcommand has its own module.

mod checkpoint;
mod checkpoint_owner;
mod cluster;
mod cluster_access;
mod cluster_serve;
mod compare;
mod eplb;
mod eplb_previous;
mod file_flags;
mod file_flags_table;
mod gpt;
mod help;
mod io_paths;
mod output;
mod output_targets;
mod plan;
mod plan_inputs;
mod report;
mod requeue;
mod resume_dtype;
mod schedule;
mod simulate;
mod stdout_null;
mod train;
mod train_gpt;
mod train_moe;
mod train_plan;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

/// What one run of the binary produced.
#[derive(Debug)]
pub struct Run {
    /// The flags it ran with (for messages).
    pub args: Vec<String>,
    /// Exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Everything written to stdout (not UTF-8 bytes shown as U+FFFD; `stdout_bytes` has them).
    pub stdout: String,
    /// Everything written to stdout, byte for byte (`generate` prints a byte-level model's bytes).
    pub stdout_bytes: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: String,
}

/// Runs `dualpipe ARGS...` with stdin closed and stdout/stderr captured (so neither is a
/// terminal: no colours, no progress bars).
pub fn dualpipe<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_dualpipe"))
        .args(&args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("the dualpipe binary starts");
    Run {
        args: args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stdout_bytes: out.stdout,
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

impl Run {
    /// Asserts a clean success (exit 0, no panic) and returns self.
    #[track_caller]
    pub fn ok(&self) -> &Self {
        self.no_panic();
        assert_eq!(
            self.code,
            Some(0),
            "dualpipe {:?} failed\nstdout:\n{}\nstderr:\n{}",
            self.args,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Asserts that nothing on stderr looks like a panic or a backtrace.
    #[track_caller]
    pub fn no_panic(&self) -> &Self {
        for bad in ["panicked", "RUST_BACKTRACE", "stack backtrace"] {
            assert!(
                !self.stderr.contains(bad),
                "dualpipe {:?}: stderr shows a panic ({bad}):\n{}",
                self.args,
                self.stderr
            );
        }
        self
    }

    /// Stdout parsed as one JSON document.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "dualpipe {:?}: stdout is not JSON ({e}):\n{}",
                self.args, self.stdout
            )
        })
    }

    /// The non-empty lines of stderr.
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    /// Asserts a usage error as our own code reports it: exit code 2, nothing on stdout, and
    /// exactly ONE line on stderr, starting `error:`, without runs of spaces, and containing
    /// every one of `needles` (case-insensitive).
    #[track_caller]
    pub fn usage_error(&self, needles: &[&str]) -> &Self {
        self.no_panic();
        assert_eq!(
            self.code,
            Some(2),
            "dualpipe {:?}: expected exit code 2 (usage error)\nstdout:\n{}\nstderr:\n{}",
            self.args,
            self.stdout,
            self.stderr
        );
        assert!(
            self.stdout.is_empty(),
            "dualpipe {:?}: a failing run printed to stdout:\n{}",
            self.args,
            self.stdout
        );
        let lines = self.stderr_lines();
        assert_eq!(
            lines.len(),
            1,
            "dualpipe {:?}: expected one line on stderr, got:\n{}",
            self.args,
            self.stderr
        );
        assert!(
            !lines[0].contains("   "),
            "dualpipe {:?}: a run of spaces inside the message: {}",
            self.args,
            lines[0]
        );
        self.first_line_names(needles)
    }

    /// Asserts a usage error found by the flag parser (clap): exit code 2, nothing on stdout,
    /// a first stderr line `error: ...`, and every one of `needles` in the message (clap
    /// spreads it over a few lines: the error, the flags concerned, a usage hint).
    #[track_caller]
    pub fn flag_error(&self, needles: &[&str]) -> &Self {
        self.no_panic();
        assert_eq!(
            self.code,
            Some(2),
            "dualpipe {:?}: expected exit code 2\nstderr:\n{}",
            self.args,
            self.stderr
        );
        assert!(self.stdout.is_empty(), "{:?}: {}", self.args, self.stdout);
        self.first_line_names(&[]);
        let lower = self.stderr.to_lowercase();
        for needle in needles {
            assert!(
                lower.contains(&needle.to_lowercase()),
                "dualpipe {:?}: the error should mention `{needle}`:\n{}",
                self.args,
                self.stderr
            );
        }
        self
    }

    #[track_caller]
    fn first_line_names(&self, needles: &[&str]) -> &Self {
        let first = self.stderr_lines().first().copied().unwrap_or("");
        assert!(
            first.starts_with("error: "),
            "dualpipe {:?}: the error line should start with `error: `: {first}",
            self.args
        );
        let lower = first.to_lowercase();
        for needle in needles {
            assert!(
                lower.contains(&needle.to_lowercase()),
                "dualpipe {:?}: the error line should mention `{needle}`: {first}",
                self.args
            );
        }
        self
    }
}

/// A fresh, empty directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `dualpipe-cli-e2e-<pid>-<n>-<name>`.
    pub fn new(name: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "dualpipe-cli-e2e-{}-{n}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Writes `text` into `name` and returns its path.
    pub fn write(&self, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
        let path = self.join(name);
        std::fs::write(&path, bytes).expect("write a test input");
        path
    }

    /// The names of everything in the directory, sorted (hidden temp files included).
    pub fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .expect("read the temp dir")
            .map(|e| {
                e.expect("dir entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A path as a `&str` argument.
pub fn s(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// The golden oracles kept in the repository (`testdata/golden/{sub}`); a missing folder fails.
#[track_caller]
pub fn golden_dir(sub: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/golden")
        .join(sub);
    assert!(dir.is_dir(), "no golden data at {}", dir.display());
    dir
}

/// A JSON array of numbers as `f64`s.
#[track_caller]
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected an array, got {v}"))
        .iter()
        .map(|x| {
            x.as_f64()
                .unwrap_or_else(|| panic!("expected a number, got {x}"))
        })
        .collect()
}

/// `|a - b| <= tol * max(1, |a|, |b|)`.
pub fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * 1f64.max(a.abs()).max(b.abs())
}
