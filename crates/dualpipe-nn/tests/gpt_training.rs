//! The GPT learns: a few dozen AdamW steps on the seeded addition task lower the validation
//! loss well below the uniform model's ln 256, and the stage copies trained under DualPipe
//! stay equal to the sequential model after optimizer steps.

use candle_core::DType;
use dualpipe_nn::gpt::data::{AdditionTask, TextData};
use dualpipe_nn::gpt::eval::evaluate_windows;
use dualpipe_nn::gpt::pipeline::sequential_step;
use dualpipe_nn::gpt::{GptConfig, GptStage, GptWeights};
use dualpipe_nn::{Optimizer, OptimizerKind, StagePosition};

#[test]
fn validation_loss_falls_on_the_addition_task() {
    let config = GptConfig {
        d_model: 32,
        heads: 4,
        layers: 2,
        seq_len: 32,
        dtype: DType::F32,
        moe: None,
    };
    let task = AdditionTask { digits: 2, seed: 1 };
    let data = TextData::new(&task.training_text(2000), config.seq_len, 0.1, None).unwrap();
    let weights = GptWeights::random(&config, 7).unwrap();
    let micro_batches = 2;
    let mut model = GptStage::new(
        &weights,
        1,
        StagePosition {
            dir: 0,
            model_stage: 0,
            micro_batches,
            micro_batches_per_dir: micro_batches,
        },
    )
    .unwrap();
    let validation = data.validation.clone().unwrap();
    let before = evaluate_windows(&model, &validation).unwrap().loss;
    assert!((before - 256f64.ln()).abs() < 0.3, "initial loss {before}");
    let mut opt = Optimizer::new(OptimizerKind::adamw(), 3e-3);
    for step in 0..40 {
        model.zero_grad().unwrap();
        let losses = sequential_step(&mut model, data.batch(step, micro_batches, 8)).unwrap();
        assert!(losses.iter().all(|l| l.is_finite()));
        opt.step(&mut model.params_mut()).unwrap();
    }
    let after = evaluate_windows(&model, &validation).unwrap().loss;
    assert!(after < 0.6 * before, "validation loss {before} -> {after}");
}
