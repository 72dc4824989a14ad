//! Activation recomputation's memory: what one chunk keeps alive and the peak along a rank's
//! ops. The setting ([`Recompute`]) is defined in `dualpipe-schedule`.

use serde::{Deserialize, Serialize};

/// The setting itself lives in `dualpipe-schedule` (below the simulator and the models);
/// re-exported here so `dualpipe_sim::Recompute` keeps working.
pub use dualpipe_schedule::Recompute;

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

#[cfg(test)]
mod tests {
    use super::*;

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
