//! Who may use the scheduler's API: the token that `serve` keeps in its state directory
//! (`DIR/token`, readable by its owner only) and that clients send as
//! `Authorization: Bearer TOKEN`, and the rule that the API listens on loopback only unless
//! the operator opts in (docs/cluster.md, "Trust model").

use std::io::{Read, Write};
use std::net::ToSocketAddrs;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Hex digits of a token (32 random bytes).
const TOKEN_HEX: usize = 64;

/// The token file of state directory `dir`.
pub fn token_path(dir: &Path) -> PathBuf {
    dir.join("token")
}

/// The token of state directory `dir`: the one there if it is a regular file of this user
/// readable by nobody else and well formed, else a new one (32 bytes from `/dev/urandom`),
/// written owner-only (mode 0600) through a temp file and a rename. The error is one line.
pub fn ensure_token(dir: &Path) -> Result<String, String> {
    let path = token_path(dir);
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        // SAFETY: geteuid(2) has no failure and touches no memory.
        let me = unsafe { libc::geteuid() };
        let private = meta.file_type().is_file()
            && meta.uid() == me
            && meta.permissions().mode() & 0o077 == 0;
        if private {
            if let Ok(token) = read_token(&path) {
                return Ok(token);
            }
        }
    }
    let mut bytes = [0u8; TOKEN_HEX / 2];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("cannot draw a token from /dev/urandom: {e}"))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = dir.join(format!(".token.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(format!("{token}\n").as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "{}: cannot write the API token: {e}",
            path.display()
        ));
    }
    Ok(token)
}

/// Reads a token file (a client's `--token-file`, or `DIR/token`). The error is one line.
pub fn read_token(path: &Path) -> Result<String, String> {
    let bytes = dualpipe_io::read_regular(
        path,
        dualpipe_io::limits::Limit::new(4096, "a token is 64 characters"),
        "the API token",
    )
    .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&bytes);
    let token = text.trim();
    if token.len() != TOKEN_HEX || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "{}: not an API token (64 hex digits, as `dualpipe cluster serve` writes)",
            path.display()
        ));
    }
    Ok(token.to_string())
}

/// Whether an `Authorization` header carries `token` (compared in constant time).
pub fn authorized(header: Option<&str>, token: &str) -> bool {
    let Some(given) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
        return false;
    };
    let (a, b) = (given.trim().as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether every address `addr` (`HOST:PORT`) resolves to is a loopback one. The error is
/// one line.
pub fn loopback_only(addr: &str) -> Result<bool, String> {
    let resolved: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| format!("`addr` {addr}: cannot listen: {e}; give HOST:PORT"))?
        .collect();
    Ok(!resolved.is_empty() && resolved.iter().all(|a| a.ip().is_loopback()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_private_kept_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let token = ensure_token(dir.path()).unwrap();
        let meta = std::fs::metadata(token_path(dir.path())).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            ensure_token(dir.path()).unwrap(),
            token,
            "kept across starts"
        );
        assert_eq!(read_token(&token_path(dir.path())).unwrap(), token);
        assert!(authorized(Some(&format!("Bearer {token}")), &token));
        assert!(!authorized(
            Some(&format!("Bearer {}", &token[1..])),
            &token
        ));
        assert!(!authorized(Some(&token), &token));
        assert!(!authorized(None, &token));
        // A token file others can read is replaced.
        std::fs::set_permissions(
            token_path(dir.path()),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let fresh = ensure_token(dir.path()).unwrap();
        assert_ne!(fresh, token);
        let meta = std::fs::metadata(token_path(dir.path())).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn loopback_addresses_are_told_apart() {
        assert_eq!(loopback_only("127.0.0.1:0"), Ok(true));
        assert_eq!(loopback_only("[::1]:0"), Ok(true));
        assert_eq!(loopback_only("0.0.0.0:0"), Ok(false));
        assert!(loopback_only("nonsense").is_err());
    }
}
