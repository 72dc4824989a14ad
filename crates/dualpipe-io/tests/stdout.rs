//! Standard output as a parent process leaves it: closed (`>&-`) is refused, while `/dev/null`
//! is accepted however it was opened: write-only as a shell's `> /dev/null` and Rust's
//! `Stdio::null()` do, or read-write as Python's `subprocess.DEVNULL` does (which is also what
//! Rust's runtime puts on a closed descriptor before `main`, so the state must be taken before).
//!
//! Each case re-runs this test binary as a child, with only [`probe`] selected and an
//! environment variable set; the child reports what `check_stdout` said on stderr.

use std::fs::File;
use std::process::{Command, Output, Stdio};

use dualpipe_io::{check_stdout, write_stdout, WriteError};

const PROBE_ENV: &str = "DUALPIPE_IO_STDOUT_PROBE";

/// In a child started by the tests below: prints `check_stdout: open` or `check_stdout:
/// closed` to stderr (and, for open, writes to stdout). In a plain test run: does nothing.
#[test]
fn probe() {
    if std::env::var_os(PROBE_ENV).is_none() {
        return;
    }
    match check_stdout() {
        Ok(()) => {
            write_stdout(b"written\n").expect("an open stdout takes the write");
            eprintln!("check_stdout: open");
        }
        Err(WriteError::StdoutClosed) => {
            assert!(matches!(
                write_stdout(b"lost\n"),
                Err(WriteError::StdoutClosed)
            ));
            eprintln!("check_stdout: closed");
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

fn probe_command() -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "probe", "--nocapture", "--test-threads=1"])
        .env(PROBE_ENV, "1");
    cmd
}

/// What the child said, checked to be one of the two answers.
fn verdict(out: &Output) -> &'static str {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the probe failed: {stderr}");
    if stderr.contains("check_stdout: open") {
        "open"
    } else if stderr.contains("check_stdout: closed") {
        "closed"
    } else {
        panic!("the probe did not run: {stderr}")
    }
}

/// Opens `/dev/null` read-write, as Python's `subprocess.DEVNULL` does.
fn dev_null_read_write() -> File {
    File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .unwrap()
}

/// The access mode (`O_ACCMODE` bits) of a child's descriptor 1 when given `stdout`, as the
/// kernel reports it in `/proc/PID/fdinfo/1` while the child (a `cat` waiting on its input)
/// runs, to show a case really is what its name says.
#[cfg(target_os = "linux")]
fn access_mode_of(stdout: Stdio) -> u32 {
    let mut child = Command::new("cat")
        .stdin(Stdio::piped())
        .stdout(stdout)
        .spawn()
        .unwrap();
    let info = std::fs::read_to_string(format!("/proc/{}/fdinfo/1", child.id())).unwrap();
    drop(child.stdin.take());
    child.wait().unwrap();
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .expect("fdinfo has a flags line")
        .trim();
    u32::from_str_radix(flags, 8).unwrap() & 0o3
}

#[test]
fn a_closed_stdout_is_refused() {
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"exec "$0" "$@" >&-"#)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "probe", "--nocapture", "--test-threads=1"])
        .env(PROBE_ENV, "1")
        .output()
        .unwrap();
    assert_eq!(verdict(&out), "closed");
}

#[test]
fn dev_null_opened_read_write_is_accepted_as_python_gives_it() {
    #[cfg(target_os = "linux")]
    assert_eq!(
        access_mode_of(Stdio::from(dev_null_read_write())),
        libc::O_RDWR as u32
    );
    let out = probe_command()
        .stdout(Stdio::from(dev_null_read_write()))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(verdict(&out), "open");
}

#[test]
fn dev_null_from_stdio_null_is_accepted() {
    let out = probe_command()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(verdict(&out), "open");
}

#[test]
fn dev_null_from_the_shell_is_accepted() {
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"exec "$0" "$@" > /dev/null"#)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "probe", "--nocapture", "--test-threads=1"])
        .env(PROBE_ENV, "1")
        .output()
        .unwrap();
    assert_eq!(verdict(&out), "open");
}

#[test]
fn a_pipe_is_accepted_and_receives_the_write() {
    let out = probe_command().output().unwrap();
    assert_eq!(verdict(&out), "open");
    assert!(String::from_utf8_lossy(&out.stdout).contains("written\n"));
}
