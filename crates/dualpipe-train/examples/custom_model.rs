//! A user's own network under DualPipe: a small MLP-mixer classifying seeded synthetic 8x8
//! images (four stripe orientations under heavy noise), trained on 4 pipeline ranks x 2
//! replicas with 1-bit compression and checkpoints. docs/custom-model.md walks through it:
//! `cargo run --release -p dualpipe-train --example custom_model`.

use candle_core::{DType, Device, Tensor};
use dualpipe_nn::custom::{seeded_params, AutogradLayer, Layer, SoftmaxCrossEntropy};
use dualpipe_nn::data::MicroBatch;
use dualpipe_nn::layers::Linear;
use dualpipe_nn::rng::{self, Purpose};
use dualpipe_nn::{NnError, OptimizerKind};
use dualpipe_schedule::ScheduleKind;
use dualpipe_train::{CheckpointOptions, Compression, DualPipeStrategy, StrategyBuilder};

/// Patches per image (2 x 2 of 4x4 pixels), pixels per patch, channels, classes.
const PATCHES: usize = 4;
const PIXELS: usize = 16;
const CHANNELS: usize = 16;
const CLASSES: usize = 4;
/// The layers: patch embedding, three (token mixing, channel mixing) pairs, the head.
pub const LAYERS: usize = 8;

/// `gelu(x W1ᵀ + b1) W2ᵀ + b2` over the last dimension.
fn mlp(x: &Tensor, p: &[Tensor]) -> candle_core::Result<Tensor> {
    let h = x
        .broadcast_matmul(&p[0].t()?)?
        .broadcast_add(&p[1])?
        .gelu_erf()?;
    h.broadcast_matmul(&p[2].t()?)?.broadcast_add(&p[3])
}

/// A residual MLP of width `w` (hidden 2w) as an autograd layer computing `f`.
fn mixing(
    seed: u64,
    l: usize,
    w: usize,
    dtype: DType,
    f: fn(&Tensor, &[Tensor]) -> candle_core::Result<Tensor>,
) -> Result<Box<dyn Layer>, NnError> {
    let shapes: [(&str, &[usize]); 4] = [
        ("w1", &[2 * w, w]),
        ("b1", &[2 * w]),
        ("w2", &[w, 2 * w]),
        ("b2", &[w]),
    ];
    Ok(Box::new(AutogradLayer::new(
        seeded_params(seed, l, &shapes, dtype)?,
        f,
    )?))
}

/// Layer `l` of the model; activations are `[rows · PATCHES, CHANNELS]`.
pub fn layer(seed: u64, l: usize, dtype: DType) -> Result<Box<dyn Layer>, NnError> {
    match l {
        // The patch embedding: our Linear, whose backward is split by hand (W deferred).
        0 => Ok(Box::new(Linear::random(
            &mut rng::stream(seed, Purpose::StageParams, 0, 1),
            PIXELS,
            CHANNELS,
            true,
            1.0,
            dtype,
        )?)),
        // The head: the mean over patches, then the logits (candle's autograd from here on).
        7 => {
            let shapes: [(&str, &[usize]); 2] =
                [("weight", &[CLASSES, CHANNELS]), ("bias", &[CLASSES])];
            Ok(Box::new(AutogradLayer::new(
                seeded_params(seed, l, &shapes, dtype)?,
                |x, p| {
                    let pooled = x
                        .reshape((x.dim(0)? / PATCHES, PATCHES, CHANNELS))?
                        .mean(1)?;
                    pooled.matmul(&p[0].t()?)?.broadcast_add(&p[1])
                },
            )?))
        }
        // Token mixing: across the patches of each image, channel by channel.
        l if l % 2 == 1 => mixing(seed, l, PATCHES, dtype, |x, p| {
            let rows = x.dim(0)? / PATCHES;
            let t = x
                .reshape((rows, PATCHES, CHANNELS))?
                .transpose(1, 2)?
                .contiguous()?;
            x + mlp(&t, p)?
                .transpose(1, 2)?
                .contiguous()?
                .reshape((rows * PATCHES, CHANNELS))?
        }),
        // Channel mixing: across the channels of each patch.
        _ => mixing(seed, l, CHANNELS, dtype, |x, p| x + mlp(x, p)?),
    }
}

/// `rows` images from `first` on of stream `stream`: stripes at one of four orientations (the
/// class) with a random phase, under uniform noise of 2.5 times their amplitude. Inputs are
/// `[rows · PATCHES, PIXELS]` (patch by patch), targets the class ids.
pub fn images(
    seed: u64,
    stream: u64,
    first: u64,
    rows: usize,
    dtype: DType,
) -> Result<MicroBatch, NnError> {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for i in first..first + rows as u64 {
        let u = rng::uniform(&mut rng::stream(seed, Purpose::Inputs, stream, i), 66, 1.0);
        let class = (((u[0] + 1.0) * 2.0) as usize).min(CLASSES - 1);
        for k in 0..PATCHES * PIXELS {
            let (p, q) = (k / PIXELS, k % PIXELS);
            let (y, x) = ((p / 2 * 4 + q / 4) as f64, (p % 2 * 4 + q % 4) as f64);
            let along = [y, x, x + y, x - y][class];
            xs.push((along * std::f64::consts::FRAC_PI_2 + u[1] * 3.2).sin() + 2.5 * u[2 + k]);
        }
        ys.push(class as f64);
    }
    let t = |v, shape: &[usize]| Tensor::from_vec(v, shape, &Device::Cpu)?.to_dtype(dtype);
    let inputs = t(xs, &[rows * PATCHES, PIXELS]).map_err(|e| NnError::tensor("images", e))?;
    let targets = t(ys, &[rows]).map_err(|e| NnError::tensor("labels", e))?;
    Ok(MicroBatch { inputs, targets })
}

/// The model and its pipeline: DualPipe on 4 ranks x 2 replicas, 8 micro-batches each.
pub fn strategy(seed: u64, dtype: dualpipe_train::DType) -> StrategyBuilder {
    DualPipeStrategy::builder()
        .layers(LAYERS, move |l| layer(seed, l, dtype.candle()))
        .loss(SoftmaxCrossEntropy)
        .schedule(ScheduleKind::DualPipe)
        .pipeline_stages(4)
        .data_parallel(2)
        .micro_batches(8)
        .dtype(dtype)
}

/// Classification accuracy on `n` held-out images (a stream no step draws from).
pub fn accuracy(
    s: &mut DualPipeStrategy,
    seed: u64,
    n: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let test = images(seed, u64::MAX, 0, n, DType::F32)?;
    let guess = s
        .predict(&test.inputs)?
        .argmax(1)?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    let truth = test.targets.to_vec1::<f32>()?;
    Ok(guess.iter().zip(&truth).filter(|(a, b)| a == b).count() as f64 / n as f64)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (seed, steps, rows) = (7, 120, 16);
    let dir = tempfile::tempdir()?;
    let mut options = CheckpointOptions::new(dir.path().join("checkpoints"));
    options.every = 40;
    let mut s = strategy(seed, dualpipe_train::DType::F32)
        .optimizer(OptimizerKind::adamw(), 2e-3)
        .compression(Compression::OneBit)
        .steps(steps)
        .checkpoints(options)
        .build()?;
    println!(
        "held-out accuracy before training: {:.3}",
        accuracy(&mut s, seed, 1024)?
    );
    for step in 0..steps {
        let batch = (0..s.micro_batches_per_step() as u64)
            .map(|m| images(seed, step as u64, m * rows as u64, rows, DType::F32))
            .collect::<Result<Vec<_>, _>>()?;
        let report = s.step(batch)?;
        if (step + 1) % 20 == 0 {
            let acc = accuracy(&mut s, seed, 1024)?;
            println!(
                "step {:>3}  loss {:.4}  held-out accuracy {acc:.3}",
                step + 1,
                report.loss
            );
        }
    }
    for saved in s.finish()? {
        println!("checkpoint {}", saved.strip_prefix(dir.path())?.display());
    }
    Ok(())
}
