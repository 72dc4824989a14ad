//! The flags of what `dualpipe train` shows and exports while it trains ([`ObserveArgs`]):
//! the progress bar, the Prometheus metrics server and the JSONL run log (the figures and
//! formats are `dualpipe_metrics`'s).

use std::path::PathBuf;

use crate::TrainError;

/// The flags of what a run shows and exports while it trains.
#[derive(clap::Args, Debug, Default)]
pub struct ObserveArgs {
    /// Serve Prometheus metrics on HOST:PORT while training (port 0 picks a free one; the
    /// address is printed as `metrics: http://HOST:PORT/metrics`). With --transport mpi each
    /// process serves PORT + its rank.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Write one JSON line per step (every metric) into FILE, as the run goes; read it back
    /// with `dualpipe report FILE`. With --transport mpi rank 0 writes it (every rank sees
    /// every rank's figures).
    #[arg(long, value_name = "FILE.jsonl")]
    pub log: Option<PathBuf>,
    /// No progress bar and no per-step lines (the summary is still printed).
    #[arg(long)]
    pub quiet: bool,
}

/// The address process `rank` serves on: `addr` with its port moved up by `rank` (port 0
/// stays 0: every process picks its own free port).
pub fn rank_addr(addr: &str, rank: usize) -> Result<String, TrainError> {
    let bad = |why: &str| {
        TrainError::Config(format!(
            "--metrics-addr {addr:?}: {why}; give HOST:PORT such as 127.0.0.1:9400 (port 0 picks \
             a free one)"
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
            let err = rank_addr(addr, 0).unwrap_err().to_string();
            assert!(err.contains(want), "{addr:?}: {err}");
            assert!(err.contains("--metrics-addr"), "{err}");
        }
        assert_eq!(rank_addr("127.0.0.1:9400", 2).unwrap(), "127.0.0.1:9402");
        assert_eq!(rank_addr("[::1]:0", 3).unwrap(), "[::1]:0");
    }
}
