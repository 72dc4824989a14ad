//! How much memory a run may take: the documented cap and what this machine has available.

/// The most memory a configuration may ask for (parameters with optimizer state, or one
/// step's activations) before [`TrainConfig::check`](crate::TrainConfig::check) refuses it
/// instead of failing to allocate: 256 GiB, whatever the machine. A machine with less
/// available memory refuses less (see [`available_bytes`]).
pub const MEMORY_LIMIT_BYTES: u128 = 256 << 30;

/// Bytes a configuration needs, from
/// [`TrainConfig::memory_bytes`](crate::TrainConfig::memory_bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Parameters, gradients and optimizer moments of every stage copy.
    pub parameters: u128,
    /// One step's saved activations.
    pub activations: u128,
}

impl MemoryEstimate {
    /// Parameters and activations together.
    pub fn total(&self) -> u128 {
        self.parameters.saturating_add(self.activations)
    }
}

/// The memory this machine can still give a process (Linux: `MemAvailable` of
/// `/proc/meminfo`); `None` where it cannot be read, and only the cap applies.
pub fn available_bytes() -> Option<u128> {
    // The kernel's own file, not a user input (so not through `dualpipe_io::open_regular`).
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

fn parse_mem_available(meminfo: &str) -> Option<u128> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u128 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_available() {
        let text = "MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_mem_available(text), Some(2048 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
    }
}
