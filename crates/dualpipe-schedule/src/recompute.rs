//! Activation recomputation: what a stage keeps between a chunk's forward and its input
//! backward, and what it runs again before that backward. The setting is shared by the
//! simulator (which charges its cost) and the models (which run it), so it lives here, below both.

use serde::{Deserialize, Serialize};

/// How a pipeline stage treats the tensors its blocks' forwards save.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Keep everything the forward saved until the backward (no recomputation).
    #[default]
    None,
    /// Keep only each block's input; run the block's saving forward again from it right
    /// before the chunk's input backward.
    Full,
    /// Keep each block's input and its attention's saved tensors (cheap to store, the
    /// expensive part to recompute); run the norms and the feed-forward part again.
    Selective,
}

impl Recompute {
    /// Every setting, in the order a planner tries them (least recomputation first).
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    /// The name a configuration spells it with: `none`, `full` or `selective`.
    pub fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Full => "full",
            Recompute::Selective => "selective",
        }
    }

    /// The setting named `name` (see [`Recompute::name`]), if any.
    pub fn from_name(name: &str) -> Option<Recompute> {
        Recompute::ALL.into_iter().find(|r| r.name() == name)
    }
}

impl Recompute {
    /// The share of a stage's forward that runs again before each backward: 0 (none), 1
    /// (full), or `1 - attention_share` (selective), where `attention_share` is the share of
    /// the forward spent in the attention, which selective does not rerun.
    pub fn forward_share(self, attention_share: f64) -> f64 {
        match self {
            Recompute::None => 0.0,
            Recompute::Full => 1.0,
            Recompute::Selective => (1.0 - attention_share).clamp(0.0, 1.0),
        }
    }
}

impl std::fmt::Display for Recompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for r in Recompute::ALL {
            assert_eq!(Recompute::from_name(r.name()), Some(r));
        }
        assert_eq!(Recompute::from_name("some"), None);
        assert_eq!(Recompute::default(), Recompute::None);
        assert_eq!(Recompute::Selective.forward_share(0.25), 0.75);
        assert_eq!(Recompute::Full.forward_share(0.25), 1.0);
        assert_eq!(Recompute::None.forward_share(0.25), 0.0);
    }
}
