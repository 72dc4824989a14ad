//! The writer on every kind of target, in a temp folder: regular files (new, existing, read-only,
//! behind a link), a planted link, a FIFO, a device node, descriptor paths, and batches.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use dualpipe_io::{check, write, Batch, Target, WriteError};

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_new_file_is_written_whole_with_the_usual_mode_and_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.json");
    write(&path, b"{\"a\":1}\n").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":1}\n");
    // SAFETY: umask only swaps the process mask; restored at once.
    let umask = unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    } as u32;
    assert_eq!(mode(&path), 0o666 & !umask, "not the 0600 of a temp file");
    assert_eq!(names(dir.path()), ["new.json"]);
}

#[test]
fn an_existing_file_keeps_its_permission_bits() {
    let dir = tempfile::tempdir().unwrap();
    for bits in [0o600, 0o640, 0o755] {
        let path = dir.path().join(format!("f{bits:o}"));
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(bits)).unwrap();
        write(&path, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(mode(&path), bits);
    }
}

#[test]
fn a_read_only_file_is_refused_not_replaced() {
    if is_root() {
        eprintln!("note: running as root, access(2) lets root write a 0444 file; check skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.txt");
    std::fs::write(&path, "keep").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    assert!(matches!(
        write(&path, b"x"),
        Err(WriteError::NotWritable { .. })
    ));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep");
}

#[test]
fn a_target_that_is_a_link_is_written_through_and_the_link_stays() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.txt");
    std::fs::write(&real, "old").unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = dir.path().join("link.txt");
    std::os::unix::fs::symlink("real.txt", &link).unwrap();
    write(&link, b"through").unwrap();
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(&real).unwrap(), "through");
    assert_eq!(mode(&real), 0o640);
    assert_eq!(names(dir.path()), ["link.txt", "real.txt"]);
    // A dangling link: its destination is created, as `cp` does.
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink("made.txt", &dangling).unwrap();
    write(&dangling, b"made").unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("made.txt")).unwrap(),
        "made"
    );
}

#[test]
fn planted_links_at_temp_names_are_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();
    // The names the old writer used (predictable) and names shaped like ours.
    for name in [
        format!(".plan.json.tmp-{}", std::process::id()),
        ".plan.json.tmp".into(),
        ".plan.json.AAAAAA.tmp".into(),
    ] {
        std::os::unix::fs::symlink(&victim, dir.path().join(name)).unwrap();
    }
    let before = names(dir.path());
    for _ in 0..20 {
        write(&dir.path().join("plan.json"), b"{}\n").unwrap();
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let mut expected = before.clone();
    expected.push("plan.json".into());
    expected.sort();
    assert_eq!(names(dir.path()), expected);
    assert!(std::fs::symlink_metadata(dir.path().join("plan.json"))
        .unwrap()
        .is_file());
}

#[test]
fn a_fifo_is_written_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(status.success());
    assert!(matches!(check(&fifo).unwrap(), Target::InPlace { .. }));
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut s = String::new();
            std::fs::File::open(&fifo)
                .unwrap()
                .read_to_string(&mut s)
                .unwrap();
            s
        })
    };
    write(&fifo, b"through the pipe\n").unwrap();
    assert_eq!(reader.join().unwrap(), "through the pipe\n");
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert_eq!(names(dir.path()), ["pipe"]);
}

#[test]
fn a_device_node_is_written_in_place_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("mynull");
    let made = std::process::Command::new("mknod")
        .arg(&node)
        .args(["c", "1", "3"])
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !made {
        eprintln!("note: cannot create a device node here (not root?); using /dev/null itself");
        let null = Path::new("/dev/null");
        assert!(matches!(check(null).unwrap(), Target::InPlace { .. }));
        write(null, b"discarded").unwrap();
        assert!(std::fs::metadata(null)
            .unwrap()
            .file_type()
            .is_char_device());
        return;
    }
    assert!(matches!(check(&node).unwrap(), Target::InPlace { .. }));
    write(&node, b"discarded").unwrap();
    assert!(std::fs::metadata(&node)
        .unwrap()
        .file_type()
        .is_char_device());
    assert_eq!(names(dir.path()), ["mynull"]);
}

#[test]
fn descriptor_paths_write_into_the_open_descriptor() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::File::create(dir.path().join("fd.txt")).unwrap();
    let path = format!("/dev/fd/{}", file.as_raw_fd());
    assert_eq!(
        check(Path::new(&path)).unwrap(),
        Target::InPlace {
            path: path.clone().into()
        }
    );
    write(Path::new(&path), b"via the descriptor").unwrap();
    drop(file);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("fd.txt")).unwrap(),
        "via the descriptor"
    );
    assert_eq!(
        names(dir.path()),
        ["fd.txt"],
        "no temp file, no replacement"
    );
    assert!(matches!(
        check(Path::new("/dev/fd/987654")),
        Err(WriteError::ClosedDescriptor { .. })
    ));
}

#[test]
fn a_batch_with_one_bad_path_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut batch = Batch::new();
    batch
        .add(&dir.path().join("a.svg"), b"<svg/>".to_vec())
        .unwrap();
    let err = batch
        .add(&dir.path().join("nodir/b.json"), b"{}".to_vec())
        .unwrap_err();
    assert!(err.to_string().contains("nodir"), "{err}");
    assert!(err.is_usage());
    drop(batch);
    assert!(names(dir.path()).is_empty());
    let mut batch = Batch::new();
    batch
        .add(&dir.path().join("a.svg"), b"<svg/>".to_vec())
        .unwrap();
    batch
        .add(&dir.path().join("b.json"), b"{}".to_vec())
        .unwrap();
    batch.commit().unwrap();
    assert_eq!(names(dir.path()), ["a.svg", "b.json"]);
}

#[test]
fn a_batch_that_fails_while_staging_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let mut batch = Batch::new();
    batch
        .add(&dir.path().join("first.svg"), b"<svg/>".to_vec())
        .unwrap();
    batch.add(&sub.join("second.json"), b"{}".to_vec()).unwrap();
    // The folder disappears between the check and the write.
    std::fs::remove_dir(&sub).unwrap();
    assert!(batch.commit().is_err());
    assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
}
