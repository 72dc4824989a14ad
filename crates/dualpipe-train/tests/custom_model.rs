//! The custom-model example's network (examples/custom_model.rs) through the public strategy:
//! in f64, every gradient of a DualPipe step on 4 ranks x 2 replicas equals a sequential
//! single-thread run of the same layers over the same micro-batches.

#[allow(dead_code)]
#[path = "../examples/custom_model.rs"]
mod example;

use std::collections::HashMap;

use candle_core::{DType, Tensor};
use dualpipe_nn::custom::{Layer, Loss, SoftmaxCrossEntropy};
use dualpipe_nn::stage::to_f64_vec;
use dualpipe_nn::OptimizerKind;
use dualpipe_schedule::Chunk;
use dualpipe_train::{Compression, Partition, TrainError};

const SEED: u64 = 11;
const ROWS: usize = 4;

fn batch(step: u64, count: usize) -> Vec<dualpipe_nn::data::MicroBatch> {
    (0..count as u64)
        .map(|m| example::images(SEED, step, m * ROWS as u64, ROWS, DType::F64).unwrap())
        .collect()
}

/// Gradients by name of one sequential pass over `micro_batches` (each loss scaled by
/// `1 / micro_batches.len()`), one layer after the other on this thread.
fn sequential(micro_batches: &[dualpipe_nn::data::MicroBatch]) -> HashMap<String, Vec<f64>> {
    let mut layers: Vec<Box<dyn Layer>> = (0..example::LAYERS)
        .map(|l| example::layer(SEED, l, DType::F64).unwrap())
        .collect();
    let scale = 1.0 / micro_batches.len() as f64;
    for (mb, data) in micro_batches.iter().enumerate() {
        let chunk = Chunk {
            dir: 0,
            stage: 0,
            mb,
        };
        let mut x = data.inputs.clone();
        for layer in &mut layers {
            x = layer.forward(chunk, &x).unwrap();
        }
        let (_, mut g) = SoftmaxCrossEntropy.loss(&x, &data.targets, scale).unwrap();
        for layer in layers.iter_mut().rev() {
            g = layer.backward_input(chunk, &g).unwrap();
            layer.backward_weight(chunk).unwrap();
        }
    }
    let mut out = HashMap::new();
    for (l, layer) in layers.iter().enumerate() {
        for (name, p) in layer.param_names().into_iter().zip(layer.params()) {
            out.insert(format!("layers.{l}.{name}"), to_f64_vec(&p.grad).unwrap());
        }
    }
    out
}

#[test]
fn every_gradient_matches_a_sequential_run_in_f64() {
    let mut s = example::strategy(SEED, dualpipe_train::DType::F64)
        .optimizer(OptimizerKind::sgd(), 0.1)
        .build()
        .unwrap();
    let data = batch(0, s.micro_batches_per_step());
    let report = s.step(data.clone()).unwrap();
    assert_eq!(report.losses.len(), 16);
    let expected = sequential(&data);
    let got = s.parameters();
    assert_eq!(got.len(), expected.len(), "every parameter is reported");
    for (name, _, grad) in &got {
        let want = &expected[name];
        let grad = to_f64_vec(grad).unwrap();
        assert_eq!(grad.len(), want.len(), "{name}");
        let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        for (a, b) in grad.iter().zip(want) {
            assert!((a - b).abs() <= 1e-10 * scale, "{name}: {a} vs {b}");
        }
        assert!(grad.iter().any(|v| *v != 0.0), "{name} has a gradient");
    }
}

#[test]
fn explicit_partition_trains_the_same_gradients() {
    let mut even = example::strategy(SEED, dualpipe_train::DType::F64)
        .build()
        .unwrap();
    let mut uneven = example::strategy(SEED, dualpipe_train::DType::F64)
        .partition(Partition::Layers(vec![1, 3, 3, 1]))
        .build()
        .unwrap();
    let data = batch(1, even.micro_batches_per_step());
    even.step(data.clone()).unwrap();
    uneven.step(data).unwrap();
    let a: HashMap<String, Vec<f64>> = even
        .parameters()
        .into_iter()
        .map(|(n, _, g)| (n, to_f64_vec(&g).unwrap()))
        .collect();
    for (name, _, g) in uneven.parameters() {
        let g = to_f64_vec(&g).unwrap();
        for (x, y) in g.iter().zip(&a[&name]) {
            assert!((x - y).abs() <= 1e-12 * y.abs().max(1e-3), "{name}");
        }
    }
}

#[test]
fn bad_partitions_and_batches_are_refused_in_words() {
    let err = example::strategy(SEED, dualpipe_train::DType::F64)
        .partition(Partition::Layers(vec![2, 2, 2]))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("give 4 stages"), "{err}");
    let mut s = example::strategy(SEED, dualpipe_train::DType::F64)
        .build()
        .unwrap();
    let err = s.step(batch(0, 3)).unwrap_err();
    assert!(matches!(err, TrainError::Config(_)), "{err}");
    assert!(err.to_string().contains("= 16"), "{err}");
}

#[test]
fn one_bit_training_with_checkpoints_resumes_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = dualpipe_train::CheckpointOptions::new(dir.path().join("ckpt"));
    options.every = 2;
    let build = || {
        example::strategy(SEED, dualpipe_train::DType::F64)
            .optimizer(OptimizerKind::adamw(), 3e-3)
            .compression(Compression::OneBit)
            .steps(4)
    };
    let mut s = build().checkpoints(options).build().unwrap();
    let mut losses = Vec::new();
    for step in 0..4 {
        losses.push(s.step(batch(step, 16)).unwrap().loss);
    }
    let weights: Vec<(String, Tensor, Tensor)> = s.parameters();
    let saved = s.finish().unwrap();
    assert_eq!(saved.len(), 2, "checkpoints after steps 2 and 4");
    // Resuming from step 2's checkpoint repeats steps 3 and 4 bit for bit (weights, AdamW
    // moments, 1-bit error feedback restored).
    let ckpt = dualpipe_train::Checkpoint::read(&saved[0]).unwrap();
    let mut back = build().build().unwrap();
    assert_eq!(back.restore(&ckpt).unwrap().step, 2);
    for step in 2..4 {
        let loss = back.step(batch(step, 16)).unwrap().loss;
        assert_eq!(
            loss.to_bits(),
            losses[step as usize].to_bits(),
            "step {}",
            step + 1
        );
    }
    for ((n, v, _), (m, w, _)) in weights.iter().zip(back.parameters()) {
        assert_eq!(n, &m);
        assert_eq!(to_f64_vec(v).unwrap(), to_f64_vec(&w).unwrap(), "{n}");
    }
    assert!(losses.iter().all(|l| l.is_finite()));
}

/// Counts the events a watch hears, and stops the run when told to.
#[derive(Default)]
struct Counting {
    events: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop_at: Option<usize>,
}

impl dualpipe_train::job::watch::Watch for Counting {
    fn on_event(&mut self, event: dualpipe_train::StepEvent<'_>) -> Result<(), String> {
        let line = match event {
            dualpipe_train::StepEvent::Starting { step } => format!("start {step}"),
            dualpipe_train::StepEvent::Finished { report, .. } => format!("end {}", report.step),
        };
        self.events.lock().unwrap().push(line);
        match (event, self.stop_at) {
            (dualpipe_train::StepEvent::Starting { step }, Some(s)) if step == s => {
                Err("stopped by the watch".into())
            }
            _ => Ok(()),
        }
    }
}

#[test]
fn the_watch_hears_every_step_and_can_stop_the_run() {
    let events = std::sync::Arc::default();
    let watch = Counting {
        events: std::sync::Arc::clone(&events),
        stop_at: Some(2),
    };
    let mut s = example::strategy(SEED, dualpipe_train::DType::F64)
        .watch(watch)
        .build()
        .unwrap();
    for step in 0..2 {
        s.step(batch(step, 16)).unwrap();
    }
    let err = s.step(batch(2, 16)).unwrap_err();
    assert!(
        matches!(err, TrainError::Stopped(ref r) if r == "stopped by the watch"),
        "{err}"
    );
    assert_eq!(
        *events.lock().unwrap(),
        ["start 0", "end 0", "start 1", "end 1", "start 2"]
    );
}
