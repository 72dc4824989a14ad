//! Time of one residual block's split backward (forward, input gradient, weight gradient).
//! (The time of a whole training step is `dualpipe-train`'s `train_step` bench.)
//!
//! `cargo bench -p dualpipe-nn --bench train_step`.
//!
//! `mlp_block_128_rows/{forward,f_i_w}/{128,512}` time one block at the compare script's shape
//! (128 rows, f32) on one thread: the kernels the pipeline's ops are made of. Goal: level with
//! PyTorch on one thread at the same moment (measured on the development machine: forward
//! about 0.4 ms at width 128 and 6 ms at 512; forward + backward about 1.2 ms and 17 ms).

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use dualpipe_nn::layers::MlpBlock;
use dualpipe_nn::rng::{stream, Purpose};
use dualpipe_schedule::Chunk;

fn block_split_backward(c: &mut Criterion) {
    // The compare script's shape: 128 rows, one block of width 128 or 512, f32.
    let mut group = c.benchmark_group("mlp_block_128_rows");
    group.sample_size(20);
    for hidden in [128, 512] {
        let rows = 128;
        let mut rng = stream(0, Purpose::StageParams, 0, 0);
        let mut block = MlpBlock::random(&mut rng, hidden, 1.0, DType::F32).expect("block");
        let x = Tensor::ones((rows, hidden), DType::F32, &Device::Cpu).expect("input");
        let key = Chunk::new(0, 0, 0);
        // Forward alone (each call replaces the chunk's saved tensors), then one backward
        // clears them.
        group.bench_function(BenchmarkId::new("forward", hidden), |b| {
            b.iter(|| block.forward(key, &x).expect("forward"))
        });
        let y = block.forward(key, &x).expect("forward");
        block.backward_input(key, &y).expect("input gradient");
        block.backward_weight(key).expect("weight gradient");
        group.bench_function(BenchmarkId::new("f_i_w", hidden), |b| {
            b.iter(|| {
                let y = block.forward(key, &x).expect("forward");
                block.backward_input(key, &y).expect("input gradient");
                block.backward_weight(key).expect("weight gradient");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, block_split_backward);
criterion_main!(benches);
