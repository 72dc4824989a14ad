//! Mixed precision (bf16 and f16 with f32 master weights): a step's losses and gradients
//! follow f32's within the half format's rounding, the tensors a stage keeps for its backward
//! and the ones it sends take 2 bytes per value, and the wire carries them as such.

use candle_core::{DType, Device, Tensor};
use dualpipe_nn::distributed::{tensor_from_wire, tensor_to_wire};
use dualpipe_nn::gpt::data::TextData;
use dualpipe_nn::gpt::pipeline::sequential_step;
use dualpipe_nn::gpt::{GptConfig, GptStage, GptWeights};
use dualpipe_nn::{Half, StagePosition};
use dualpipe_runtime::transport::wire::WireDType;
use dualpipe_runtime::{ForwardInput, ForwardOutput, Stage};
use dualpipe_schedule::Chunk;

fn text() -> Vec<u8> {
    let line = b"the quick brown fox jumps over the lazy dog; 0123456789\n";
    line.iter().cycle().take(4000).copied().collect()
}

fn config(layers: usize, dtype: DType) -> GptConfig {
    GptConfig {
        d_model: 32,
        heads: 4,
        layers,
        seq_len: 16,
        dtype,
        moe: None,
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// `‖a − b‖ / ‖b‖`.
fn relative_error(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (values(a), values(b));
    let diff: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
    let norm: f64 = b.iter().map(|y| y * y).sum();
    (diff / norm).sqrt()
}

/// The losses and the gradients of one sequential step of the whole model (4 micro-batches).
fn whole_step(half: Option<Half>) -> (Vec<f64>, Vec<Tensor>) {
    whole_step_with(|stage| stage.set_half(half).unwrap())
}

/// [`whole_step`] with the precision set by `set`.
fn whole_step_with(set: impl FnOnce(&mut GptStage)) -> (Vec<f64>, Vec<Tensor>) {
    let c = config(2, DType::F32);
    let weights = GptWeights::random(&c, 3).unwrap();
    let data = TextData::new(&text(), c.seq_len, 0.0, None).unwrap();
    let mut stage = GptStage::whole(&weights).unwrap();
    set(&mut stage);
    let losses = sequential_step(&mut stage, data.batch(0, 4, 4)).unwrap();
    let grads = stage.params().iter().map(|p| p.grad.clone()).collect();
    (losses, grads)
}

#[test]
fn a_mixed_precision_step_follows_f32() {
    let (want_losses, want_grads) = whole_step(None);
    for (half, loss_tol, grad_tol) in [(Half::Bf16, 1e-2, 5e-2), (Half::F16, 2e-3, 1e-2)] {
        let (losses, grads) = whole_step(Some(half));
        for (got, want) in losses.iter().zip(&want_losses) {
            assert!(
                (got - want).abs() <= loss_tol * want.abs(),
                "{half:?}: loss {got} against f32 {want}"
            );
        }
        for (i, (got, want)) in grads.iter().zip(&want_grads).enumerate() {
            assert_eq!(got.dtype(), DType::F32, "gradients stay f32");
            let err = relative_error(got, want);
            assert!(err < grad_tol, "{half:?}: gradient {i} off by {err}");
            assert!(
                err > 0.0,
                "{half:?}: gradient {i} is f32's exactly: no half rounding"
            );
        }
    }
}

/// Bit for bit the same losses and gradients.
fn same(a: &(Vec<f64>, Vec<Tensor>), b: &(Vec<f64>, Vec<Tensor>)) -> bool {
    a.0 == b.0 && a.1.iter().zip(&b.1).all(|(x, y)| values(x) == values(y))
}

#[test]
fn half_projections_round_the_attention_projections_under_mixed_precision_only() {
    let f32_step = whole_step(None);
    let mixed = whole_step(Some(Half::Bf16));
    let autocast = whole_step_with(|s| {
        s.set_half(Some(Half::Bf16)).unwrap();
        s.set_half_projections(true).unwrap();
    });
    // The projections now read bf16 operands: every gradient moves (the projections' own and,
    // through the activations, the others'), and still follows f32 within bf16's rounding.
    for (i, ((got, def), want)) in autocast.1.iter().zip(&mixed.1).zip(&f32_step.1).enumerate() {
        assert_ne!(values(got), values(def), "gradient {i} did not change");
        let err = relative_error(got, want);
        assert!(err < 5e-2, "gradient {i} off f32's by {err}");
    }
    // Set before or after the format, switched off again, or without mixed precision: the
    // projections follow the setting and the format, nothing else.
    let before = whole_step_with(|s| {
        s.set_half_projections(true).unwrap();
        s.set_half(Some(Half::Bf16)).unwrap();
    });
    assert!(
        same(&before, &autocast),
        "order of the two settings matters"
    );
    let off_again = whole_step_with(|s| {
        s.set_half(Some(Half::Bf16)).unwrap();
        s.set_half_projections(true).unwrap();
        s.set_half_projections(false).unwrap();
    });
    assert!(
        same(&off_again, &mixed),
        "switched off, the projections are not f32 again"
    );
    let no_half = whole_step_with(|s| {
        s.set_half_projections(true).unwrap();
        s.set_half(None).unwrap();
    });
    assert!(
        same(&no_half, &f32_step),
        "without mixed precision the step is not f32's"
    );
}

/// A middle stage of one block: the bytes it keeps after one forward, its output and its
/// input gradient.
fn middle_stage(half: Option<Half>) -> (usize, Tensor, Tensor) {
    let c = config(3, DType::F32);
    let weights = GptWeights::random(&c, 5).unwrap();
    let data = TextData::new(&text(), c.seq_len, 0.0, None).unwrap();
    let position = StagePosition {
        dir: 0,
        model_stage: 1,
        micro_batches: 1,
        micro_batches_per_dir: 1,
    };
    let mut stage = GptStage::with_layers(&weights, 3, position, 1..2).unwrap();
    stage.set_half(half).unwrap();
    stage.set_batch(data.batch(0, 1, 2));
    let n = 2 * c.seq_len;
    let x = Tensor::randn(0f32, 1.0, (n, c.d_model), &Device::Cpu).unwrap();
    let chunk = Chunk::new(0, 1, 0);
    let y = match stage.forward(chunk, ForwardInput::Activation(x)).unwrap() {
        ForwardOutput::Activation(y) => y,
        ForwardOutput::Loss(_) => panic!("a middle stage returned a loss"),
    };
    let kept = stage.saved_bytes();
    let dy = Tensor::randn(0f32, 1.0, (n, c.d_model), &Device::Cpu).unwrap();
    let dx = stage.backward_input(chunk, Some(dy)).unwrap().unwrap();
    stage.backward_weight(chunk).unwrap();
    assert_eq!(stage.pending(), 0);
    (kept, y, dx)
}

#[test]
fn a_stage_keeps_and_sends_half_precision() {
    let c = config(3, DType::F32);
    let (n, d, t) = (2 * c.seq_len, c.d_model, c.seq_len);
    let probs = 2 * c.heads * t * t;
    let (f32_bytes, y, dx) = middle_stage(None);
    assert_eq!((y.dtype(), dx.dtype()), (DType::F32, DType::F32));
    // One block, one chunk: 16·N·d + 2N + probs f32 values saved.
    assert_eq!(f32_bytes, 4 * (16 * n * d + 2 * n + probs));
    for half in [Half::Bf16, Half::F16] {
        let (bytes, y, dx) = middle_stage(Some(half));
        // In half precision: the MLP's inputs (N·d and 4·N·d), GELU's derivative (4·N·d),
        // q, k, v (3·N·d) and the probabilities; in f32 the attention projections' inputs
        // (2·N·d: their GEMMs stay f32) and the two norms' inputs and inverse RMS (2·N·d + 2N).
        assert_eq!(
            bytes,
            2 * (12 * n * d + probs) + 4 * (4 * n * d + 2 * n),
            "{half:?}"
        );
        assert_eq!(y.dtype(), half.dtype(), "the activation sent");
        assert_eq!(dx.dtype(), half.dtype(), "the gradient sent");
    }
}

#[test]
fn the_wire_carries_half_precision_tensors() {
    for (half, wire) in [(Half::Bf16, WireDType::BF16), (Half::F16, WireDType::F16)] {
        let t = Tensor::randn(0f32, 3.0, (5, 7), &Device::Cpu)
            .unwrap()
            .to_dtype(half.dtype())
            .unwrap();
        let data = tensor_to_wire(&t).unwrap();
        assert_eq!((data.dtype, data.bytes.len()), (wire, 2 * 35));
        let back = tensor_from_wire(data).unwrap();
        assert_eq!(back.dtype(), half.dtype());
        assert_eq!(values(&back), values(&t));
    }
}

#[test]
fn mixed_precision_needs_f32_master_weights() {
    let weights = GptWeights::random(&config(1, DType::F64), 1).unwrap();
    let mut stage = GptStage::whole(&weights).unwrap();
    let err = stage.set_half(Some(Half::Bf16)).unwrap_err().to_string();
    assert!(err.contains("f32 master weights"), "{err}");
}
