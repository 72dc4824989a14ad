//! Loads and shapes shared by `benches/eplb.rs` and `examples/side_by_side.rs` (included
//! with `#[path]`; a benchmark harness, not library API).

#![allow(dead_code)]

use dualpipe_eplb::LoadMatrix;

/// Deterministic skewed loads (splitmix64 -> exp of a sum of uniforms).
pub fn loads(layers: usize, experts: usize, seed: u64) -> LoadMatrix {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let data = (0..layers * experts)
        .map(|_| {
            let g: f64 = (0..4).map(|_| next()).sum::<f64>() - 2.0;
            (1.5 * g).exp() * 100.0
        })
        .collect();
    LoadMatrix::from_flat(layers, experts, data).expect("non-empty shape")
}

/// One planning input: the load matrix's shape and the layout.
pub struct Shape {
    /// Name in benchmark ids and tables.
    pub name: &'static str,
    /// MoE layers.
    pub layers: usize,
    /// Logical experts per layer.
    pub experts: usize,
    /// Physical expert slots per layer.
    pub replicas: usize,
    /// Expert groups.
    pub groups: usize,
    /// Nodes.
    pub nodes: usize,
    /// GPUs.
    pub gpus: usize,
}

const fn shape(
    name: &'static str,
    layers: usize,
    experts: usize,
    replicas: usize,
    groups: usize,
    nodes: usize,
    gpus: usize,
) -> Shape {
    Shape {
        name,
        layers,
        experts,
        replicas,
        groups,
        nodes,
        gpus,
    }
}

/// The sizes where the improved policy's local search used to run away: the three of the
/// hardening issue (65,536 and 1,048,576 replicas of 4 experts on 4 GPUs in 2 nodes; 16,384
/// experts on 16,384 GPUs in one node), DeepSeek-V3's two shapes, and large single-node
/// domains of 64 and 128 GPUs.
pub const SCALE: [Shape; 8] = [
    shape("2x4_p65536_n2_r4", 2, 4, 65_536, 2, 2, 4),
    shape("2x4_p1048576_n2_r4", 2, 4, 1_048_576, 2, 2, 4),
    shape("1x16384_p32768_r16384", 1, 16_384, 32_768, 1, 1, 16_384),
    shape("58x256_p288_n4_r32", 58, 256, 288, 8, 4, 32),
    shape("61x1024_p1152_n8_r128", 61, 1024, 1152, 16, 8, 128),
    shape("61x1024_p1280_n8_r128", 61, 1024, 1280, 16, 8, 128),
    shape("58x256_p320_n1_r64", 58, 256, 320, 8, 1, 64),
    shape("61x1024_p1280_n1_r128", 61, 1024, 1280, 16, 1, 128),
];
