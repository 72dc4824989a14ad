//! The metrics address of each process of a job ([`rank_addr`]).

use crate::{Field, Naming, TrainError};

/// The address process `rank` serves on: `addr` with its port moved up by `rank` (port 0
/// stays 0: every process picks its own free port). A bad address is a
/// [`TrainError::Config`] naming the field as `naming` says.
pub fn rank_addr(addr: &str, rank: usize, naming: Naming) -> Result<String, TrainError> {
    let bad = |why: &str| {
        TrainError::Config(format!(
            "{} {addr:?}: {why}; give HOST:PORT such as 127.0.0.1:9400 (port 0 picks a free \
             one)",
            Field::MetricsAddr.name(naming)
        ))
    };
    if addr.ends_with(char::is_whitespace) {
        return Err(bad("it ends with a space (drop the trailing space)"));
    }
    if addr.starts_with(char::is_whitespace) || addr.contains(char::is_whitespace) {
        return Err(bad("it holds a space (drop it)"));
    }
    if let Some((scheme, _)) = addr.split_once("://") {
        return Err(bad(&format!("an address, not a URL: drop \"{scheme}://\"")));
    }
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let port: u16 = port.parse().map_err(|_| bad("the port is not 0-65535"))?;
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if port == 0 || rank == 0 {
        return Ok(addr.to_string());
    }
    let shifted = u16::try_from(rank)
        .ok()
        .and_then(|r| port.checked_add(r))
        .ok_or_else(|| bad(&format!("port {port} + rank {rank} passes 65535")))?;
    Ok(format!("{host}:{shifted}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_with_spaces_or_a_scheme_say_so() {
        for (addr, want) in [
            ("127.0.0.1:0 ", "\"127.0.0.1:0 \": it ends with a space"),
            (" 127.0.0.1:0", "holds a space"),
            ("127.0.0.1 :0", "holds a space"),
            ("http://127.0.0.1:0", "not a URL: drop \"http://\""),
            ("127.0.0.1:99999", "the port is not 0-65535"),
            ("127.0.0.1", "no port"),
        ] {
            let err = rank_addr(addr, 0, Naming::Fields).unwrap_err().to_string();
            assert!(err.contains(want), "{addr:?}: {err}");
            assert!(err.contains("metrics_addr"), "{err}");
        }
        let err = rank_addr("x", 0, Naming::Flags).unwrap_err().to_string();
        assert!(err.contains("--metrics-addr \"x\""), "{err}");
        assert_eq!(
            rank_addr("127.0.0.1:9400", 2, Naming::Fields).unwrap(),
            "127.0.0.1:9402"
        );
        assert_eq!(rank_addr("[::1]:0", 3, Naming::Fields).unwrap(), "[::1]:0");
    }
}
