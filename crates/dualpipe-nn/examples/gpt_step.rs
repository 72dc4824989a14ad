//! Tokens per second of one GPT training step (forward, I and W of every micro-batch) on one
//! thread, on the shapes: d 128, 4 heads, seq 64, 8 blocks, micro-batches of 16
//! sequences, f32. `cargo run --release -p dualpipe-nn --example gpt_step`.

use std::time::Instant;

use dualpipe_nn::gpt::data::{AdditionTask, TextData};
use dualpipe_nn::gpt::pipeline::sequential_step;
use dualpipe_nn::gpt::{DType, GptConfig, GptStage, GptWeights};
use dualpipe_nn::StagePosition;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = GptConfig {
        d_model: 128,
        heads: 4,
        layers: 8,
        seq_len: 64,
        dtype: DType::F32,
        moe: None,
    };
    let (micro_batches, rows, steps) = (8, 16, 3);
    let text = AdditionTask { digits: 3, seed: 0 }.training_text(20_000);
    let data = TextData::new(&text, config.seq_len, 0.0, None)?;
    let weights = GptWeights::random(&config, 0)?;
    let mut model = GptStage::new(
        &weights,
        1,
        StagePosition {
            dir: 0,
            model_stage: 0,
            micro_batches,
            micro_batches_per_dir: micro_batches,
        },
    )?;
    let mut best = f64::INFINITY;
    for step in 0..steps {
        model.zero_grad()?;
        let batch = data.batch(step, micro_batches, rows);
        let start = Instant::now();
        let losses = sequential_step(&mut model, batch)?;
        let secs = start.elapsed().as_secs_f64();
        best = best.min(secs);
        println!(
            "step {step}: loss {:.4}, {:.3} s",
            losses.iter().sum::<f64>() / losses.len() as f64,
            secs
        );
    }
    let tokens = micro_batches * rows * config.seq_len;
    println!(
        "{tokens} tokens per step, best {:.3} s: {:.0} tokens/s on one thread ({} parameters)",
        best,
        tokens as f64 / best,
        config.parameter_count()
    );
    Ok(())
}
