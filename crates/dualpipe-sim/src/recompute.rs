//! Activation recomputation: what a stage keeps between a chunk's forward and its input
//! backward, and what it runs again before that backward.

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

/// What one chunk of a stage keeps alive, in bytes: from its forward to its input backward,
/// and from its input backward to its weight backward (the inputs and output gradients the
/// weight gradients need; recomputation does not change these).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChunkBytes {
    /// Kept after the forward (what recomputation reduces).
    pub forward: f64,
    /// Kept after the input backward, until the weight backward.
    pub backward: f64,
}

/// The peak bytes of live activations along one rank's compute ops in execution order,
/// sampled after each op (an `FB` after its forward half and after its backward, a `B`
/// after its input half and after its weight half), `bytes(stage)` giving what one chunk of
/// each stage keeps. A recomputing stage's transient (the recomputed tensors inside its
/// input backward) is not sampled; after the input backward only the weight backward's
/// tensors remain, as without recomputation.
pub fn peak_activation_bytes<'a>(
    ops: impl IntoIterator<Item = &'a dualpipe_schedule::Op>,
    bytes: impl Fn(usize) -> ChunkBytes,
) -> f64 {
    use dualpipe_schedule::Op;
    let mut live = 0.0f64;
    let mut peak = 0.0f64;
    let mut step = |delta: f64, live: &mut f64| {
        *live += delta;
        peak = peak.max(*live);
    };
    for op in ops {
        match *op {
            Op::F(c) => step(bytes(c.stage).forward, &mut live),
            Op::I(c) => {
                let b = bytes(c.stage);
                step(b.backward - b.forward, &mut live);
            }
            Op::W(c) => step(-bytes(c.stage).backward, &mut live),
            Op::B(c) => {
                let b = bytes(c.stage);
                step(b.backward - b.forward, &mut live);
                step(-b.backward, &mut live);
            }
            Op::FB { f, b } => {
                step(bytes(f.stage).forward, &mut live);
                let bb = bytes(b.stage);
                step(bb.backward - bb.forward, &mut live);
                step(-bb.backward, &mut live);
            }
            _ => {}
        }
    }
    peak
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

    #[test]
    fn peak_bytes_follow_forward_and_split_backward() {
        use dualpipe_schedule::{Chunk, Op};
        let c = |mb| Chunk::new(0, 0, mb);
        let bytes = |_| ChunkBytes {
            forward: 10.0,
            backward: 12.0,
        };
        // F F I: 10, 20, then the input backward of one turns 10 into 12.
        let ops = [
            Op::F(c(0)),
            Op::F(c(1)),
            Op::I(c(0)),
            Op::W(c(0)),
            Op::B(c(1)),
        ];
        assert_eq!(peak_activation_bytes(&ops, bytes), 22.0);
        // Recomputing keeps 1 after the forward: 1, 2, then the input backward 12 + 1.
        let small = |_| ChunkBytes {
            forward: 1.0,
            backward: 12.0,
        };
        assert_eq!(peak_activation_bytes(&ops, small), 13.0);
        let fb = [Op::F(c(0)), Op::FB { f: c(1), b: c(0) }];
        assert_eq!(peak_activation_bytes(&fb, bytes), 22.0);
    }
}
