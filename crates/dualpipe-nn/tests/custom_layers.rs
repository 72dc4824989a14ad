//! `dualpipe_nn::custom`: an autograd layer's gradients equal the hand-written split backward
//! of the same function, and a stage of layers drives them in the stage contract's order.

use candle_core::{DType, Device, Tensor};
use dualpipe_nn::custom::{
    AutogradLayer, Layer, LayerStage, Loss, MeanSquaredError, SoftmaxCrossEntropy,
};
use dualpipe_nn::data::MicroBatch;
use dualpipe_nn::layers::Linear;
use dualpipe_nn::rng::{self, Purpose};
use dualpipe_nn::stage::to_f64_vec;
use dualpipe_nn::{ModelStage, StagePosition, StepBatch};
use dualpipe_runtime::{ForwardInput, ForwardOutput};
use dualpipe_schedule::Chunk;

fn values(t: &Tensor) -> Vec<f64> {
    to_f64_vec(t).unwrap()
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-12 * y.abs().max(1.0), "{x} vs {y}");
    }
}

#[test]
fn autograd_gradients_equal_the_split_backward_of_linear() {
    let mut r = rng::stream(3, Purpose::StageParams, 0, 0);
    let mut linear = Linear::random(&mut r, 5, 3, true, 1.0, DType::F64).unwrap();
    let params: Vec<(String, Tensor)> = Layer::param_names(&linear)
        .into_iter()
        .zip(Layer::params(&linear))
        .map(|(n, p)| (n, p.value.clone()))
        .collect();
    let mut auto =
        AutogradLayer::new(params, |x, p| x.matmul(&p[0].t()?)?.broadcast_add(&p[1])).unwrap();
    let x = Tensor::from_vec(rng::uniform(&mut r, 4 * 5, 1.0), (4, 5), &Device::Cpu).unwrap();
    let g = Tensor::from_vec(rng::uniform(&mut r, 4 * 3, 1.0), (4, 3), &Device::Cpu).unwrap();
    for mb in 0..2 {
        let chunk = Chunk {
            dir: 0,
            stage: 0,
            mb,
        };
        let (a, b) = (
            Layer::forward(&mut linear, chunk, &x).unwrap(),
            auto.forward(chunk, &x).unwrap(),
        );
        close(&values(&a), &values(&b));
        assert_eq!(auto.pending(), 1);
        let dx_linear = Layer::backward_input(&mut linear, chunk, &g).unwrap();
        let dx_auto = auto.backward_input(chunk, &g).unwrap();
        close(&values(&dx_linear), &values(&dx_auto));
        Layer::backward_weight(&mut linear, chunk).unwrap();
        auto.backward_weight(chunk).unwrap();
        assert_eq!(auto.pending(), 0);
    }
    for (p, q) in Layer::params(&linear).iter().zip(auto.params()) {
        close(&values(&p.grad), &values(&q.grad));
        assert!(values(&q.grad).iter().any(|v| *v != 0.0));
    }
    let infer = auto.infer(&x).unwrap();
    close(&values(&infer), &values(&linear.apply(&x).unwrap()));
}

#[test]
fn softmax_cross_entropy_refuses_targets_that_are_not_class_ids() {
    let logits = Tensor::zeros((2, 3), DType::F64, &Device::Cpu).unwrap();
    let (loss, grad) = SoftmaxCrossEntropy
        .loss(
            &logits,
            &Tensor::new(&[0.0f64, 2.0], &Device::Cpu).unwrap(),
            1.0,
        )
        .unwrap();
    assert!((loss - 3f64.ln()).abs() < 1e-12);
    assert_eq!(grad.dims(), &[2, 3]);
    let bad = Tensor::new(&[0.5f64, 1.0], &Device::Cpu).unwrap();
    let err = SoftmaxCrossEntropy.loss(&logits, &bad, 1.0).unwrap_err();
    assert!(err.to_string().contains("not a class id"), "{err}");
}

#[test]
fn a_two_stage_model_of_layers_runs_its_chunks_and_names_its_parameters() {
    let position = |model_stage| StagePosition {
        dir: 0,
        model_stage,
        micro_batches: 1,
        micro_batches_per_dir: 1,
    };
    let layer = |seed| -> Box<dyn Layer> {
        Box::new(
            Linear::random(
                &mut rng::stream(seed, Purpose::StageParams, 0, 0),
                2,
                2,
                true,
                1.0,
                DType::F64,
            )
            .unwrap(),
        )
    };
    let loss = std::sync::Arc::new(MeanSquaredError);
    let first = LayerStage::new(position(0), 2, 0, vec![layer(1)], loss.clone()).unwrap();
    let last = LayerStage::new(position(1), 2, 1, vec![layer(2), layer(3)], loss).unwrap();
    let (mut first, mut last) = (ModelStage::new(first), ModelStage::new(last));
    assert_eq!(
        last.param_names(),
        [
            "layers.1.weight",
            "layers.1.bias",
            "layers.2.weight",
            "layers.2.bias"
        ]
    );
    let batch = StepBatch::custom(vec![MicroBatch {
        inputs: Tensor::ones((3, 2), DType::F64, &Device::Cpu).unwrap(),
        targets: Tensor::zeros((3, 2), DType::F64, &Device::Cpu).unwrap(),
    }]);
    first.set_batch(batch.clone()).unwrap();
    last.set_batch(batch).unwrap();
    let (c0, c1) = (
        Chunk {
            dir: 0,
            stage: 0,
            mb: 0,
        },
        Chunk {
            dir: 0,
            stage: 1,
            mb: 0,
        },
    );
    let ForwardOutput::Activation(h) = first
        .stage_mut()
        .forward(c0, ForwardInput::MicroBatch { global_mb: 0 })
        .unwrap()
    else {
        panic!("the first stage passes an activation on")
    };
    let ForwardOutput::Loss(l) = last
        .stage_mut()
        .forward(c1, ForwardInput::Activation(h))
        .unwrap()
    else {
        panic!("the last stage computes the loss")
    };
    assert!(l > 0.0);
    let g = last.stage_mut().backward_input(c1, None).unwrap().unwrap();
    last.stage_mut().backward_weight(c1).unwrap();
    assert!(first
        .stage_mut()
        .backward_input(c0, Some(g))
        .unwrap()
        .is_none());
    first.stage_mut().backward_weight(c0).unwrap();
    assert_eq!(first.pending() + last.pending(), 0);
    let err = first
        .set_batch(StepBatch::Gpt(std::sync::Arc::new(Vec::new())))
        .unwrap_err();
    assert!(err.to_string().contains("GPT batch"), "{err}");
    let err = first.stage_mut().backward_input(c0, None).unwrap_err();
    assert!(
        err.to_string().contains("before its forward")
            || err.to_string().contains("the last stage"),
        "{err}"
    );
}
