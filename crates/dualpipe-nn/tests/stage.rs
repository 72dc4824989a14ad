//! The stage contract: weight gradients run only in W, W may come in any order after I,
//! gradients are scaled by 1/micro_batches, misuse gives errors.

use std::sync::Arc;

use candle_core::DType;
use dualpipe_nn::data::DataSet;
use dualpipe_nn::{MlpStage, ModelConfig, StagePosition};
use dualpipe_runtime::{ForwardInput, ForwardOutput, Stage};
use dualpipe_schedule::Chunk;
use dualpipe_testutil::{assert_close, values};

fn model(stages: usize) -> ModelConfig {
    ModelConfig {
        seed: 3,
        hidden: 4,
        layers_per_stage: 2,
        stages,
        dtype: DType::F64,
    }
}

fn only_stage(micro_batches: usize) -> MlpStage {
    let mut stage = MlpStage::new(
        &model(1),
        StagePosition {
            dir: 0,
            model_stage: 0,
            micro_batches,
            micro_batches_per_dir: micro_batches,
        },
    )
    .unwrap();
    let data = DataSet::new(3, 4, 2, DType::F64).unwrap();
    stage.set_batch(data.batch(0, micro_batches).unwrap());
    stage
}

fn run(stage: &mut MlpStage, order_of_w: &[usize]) -> Vec<Vec<f64>> {
    let n = order_of_w.len();
    for mb in 0..n {
        let c = Chunk::new(0, 0, mb);
        let out = stage
            .forward(c, ForwardInput::MicroBatch { global_mb: mb })
            .unwrap();
        assert!(matches!(out, ForwardOutput::Loss(l) if l > 0.0));
    }
    for mb in 0..n {
        assert!(stage
            .backward_input(Chunk::new(0, 0, mb), None)
            .unwrap()
            .is_none());
    }
    assert!(
        stage
            .gradients()
            .iter()
            .all(|g| values(g).iter().all(|v| *v == 0.0)),
        "no weight gradient before W"
    );
    for &mb in order_of_w {
        stage.backward_weight(Chunk::new(0, 0, mb)).unwrap();
    }
    assert_eq!(stage.pending(), 0);
    stage.gradients().iter().map(values).collect()
}

#[test]
fn weight_gradients_do_not_depend_on_w_order() {
    let fifo = run(&mut only_stage(3), &[0, 1, 2]);
    let other = run(&mut only_stage(3), &[2, 0, 1]);
    for (a, b) in fifo.iter().zip(&other) {
        assert!(dualpipe_testutil::rel_err(a, b) < 1e-14);
    }
}

#[test]
fn gradients_are_scaled_by_one_over_micro_batches() {
    // Same first micro-batch; 1 vs 2 micro-batches in the step with only mb 0 computed.
    let mut one = only_stage(1);
    let mut two = only_stage(2);
    let g1 = run(&mut one, &[0]);
    let c = Chunk::new(0, 0, 0);
    two.forward(c, ForwardInput::MicroBatch { global_mb: 0 })
        .unwrap();
    two.backward_input(c, None).unwrap();
    two.backward_weight(c).unwrap();
    let g2: Vec<Vec<f64>> = two.gradients().iter().map(values).collect();
    for (a, b) in g1.iter().zip(&g2) {
        let halved: Vec<f64> = a.iter().map(|v| v / 2.0).collect();
        assert!(dualpipe_testutil::rel_err(b, &halved) < 1e-14);
    }
}

#[test]
fn copies_of_a_stage_sum_their_gradients() {
    let mut a = only_stage(2);
    let mut b = only_stage(2);
    run(&mut a, &[0, 1]);
    run(&mut b, &[1, 0]);
    let ga = a.gradients();
    let gb = b.gradients();
    a.add_gradients(&gb).unwrap();
    b.add_gradients(&ga).unwrap();
    for (x, y) in a.gradients().iter().zip(b.gradients()) {
        assert_eq!(values(x), values(&y), "a + b and b + a are bit-identical");
    }
    let summed = (&ga[0] + &gb[0]).unwrap();
    assert_close(&a.gradients()[0], &summed, 0.0, "the sum of both copies");
    assert!(
        a.add_gradients(&gb[..1]).is_err(),
        "a wrong count is an error"
    );
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let mut first = MlpStage::new(
        &model(2),
        StagePosition {
            dir: 0,
            model_stage: 0,
            micro_batches: 2,
            micro_batches_per_dir: 2,
        },
    )
    .unwrap();
    let c = Chunk::new(0, 0, 0);
    // No batch yet.
    assert!(first
        .forward(c, ForwardInput::MicroBatch { global_mb: 0 })
        .is_err());
    first.set_batch(Arc::new(Vec::new()));
    // Micro-batch not in the batch.
    assert!(first
        .forward(c, ForwardInput::MicroBatch { global_mb: 0 })
        .is_err());
    // Wrong chunk.
    assert!(first.backward_weight(Chunk::new(0, 1, 0)).is_err());
    // Backward before forward.
    let g = candle_core::Tensor::zeros((2, 4), DType::F64, &candle_core::Device::Cpu).unwrap();
    assert!(first.backward_input(c, Some(g)).is_err());
    assert!(first.backward_weight(c).is_err());
    // A model stage that does not exist.
    assert!(MlpStage::new(
        &model(2),
        StagePosition {
            dir: 0,
            model_stage: 2,
            micro_batches: 1,
            micro_batches_per_dir: 1
        }
    )
    .is_err());
}

#[test]
fn parameter_count_matches_the_stage() {
    let m = model(2);
    let stage = MlpStage::new(
        &m,
        StagePosition {
            dir: 0,
            model_stage: 1,
            micro_batches: 1,
            micro_batches_per_dir: 1,
        },
    )
    .unwrap();
    let counted: usize = stage.params().iter().map(|p| p.value.elem_count()).sum();
    assert_eq!(counted, m.parameters_per_stage());
    assert_eq!(m.parameter_count(), 2 * counted);
}
