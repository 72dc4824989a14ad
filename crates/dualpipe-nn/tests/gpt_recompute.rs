//! Activation recomputation (f64): every gradient (each parameter's and a stage's input
//! gradient), every output and every loss are bit-identical to no recomputation, on a
//! multi-block stage and through whole DualPipe / DualPipeV steps; what a stage keeps
//! after its forwards drops to the blocks' inputs (full) or to those plus the attention's
//! tensors (selective).

use candle_core::{DType, Device, Tensor};
use dualpipe_nn::gpt::data::TextData;
use dualpipe_nn::gpt::pipeline::{build_stages, gradients_by_name};
use dualpipe_nn::gpt::{GptConfig, GptStage, GptWeights};
use dualpipe_nn::{Recompute, StagePosition};
use dualpipe_runtime::{
    run_step, sum_stage_copies, ExecOptions, ForwardInput, ForwardOutput, RankStages, Stage,
};
use dualpipe_schedule::{Chunk, ScheduleKind};

fn text() -> Vec<u8> {
    let line = b"the quick brown fox jumps over the lazy dog; 0123456789\n";
    line.iter().cycle().take(2000).copied().collect()
}

fn config(layers: usize) -> GptConfig {
    GptConfig {
        d_model: 8,
        heads: 2,
        layers,
        seq_len: 6,
        dtype: DType::F64,
        moe: None,
    }
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
        .into_iter()
        .map(f64::to_bits)
        .collect()
}

fn random(n: usize, d: usize, seed: u64) -> Tensor {
    let v: Vec<f64> = (0..n * d)
        .map(|i| (((i as u64 + 1) * 2654435761 + seed * 97) % 1000) as f64 / 500.0 - 1.0)
        .collect();
    Tensor::from_vec(v, (n, d), &Device::Cpu).unwrap()
}

/// Outputs, input gradients, parameter gradients and the bytes kept after every forward of
/// a middle stage of three blocks, two chunks forwarded before either backward.
fn middle_stage(recompute: Recompute) -> (Vec<Vec<u64>>, usize) {
    let c = config(3);
    let weights = GptWeights::random(&c, 5).unwrap();
    let data = TextData::new(&text(), c.seq_len, 0.0, None).unwrap();
    let position = StagePosition {
        dir: 0,
        model_stage: 1,
        micro_batches: 2,
        micro_batches_per_dir: 2,
    };
    let mut stage = GptStage::with_layers(&weights, 3, position, 0..3).unwrap();
    stage.set_recompute(recompute);
    stage.set_batch(data.batch(0, 2, 2));
    let n = 2 * c.seq_len;
    let mut out = Vec::new();
    for mb in 0..2 {
        let x = random(n, c.d_model, mb as u64);
        match stage
            .forward(Chunk::new(0, 1, mb), ForwardInput::Activation(x))
            .unwrap()
        {
            ForwardOutput::Activation(y) => out.push(bits(&y)),
            ForwardOutput::Loss(_) => panic!("a middle stage returned a loss"),
        }
    }
    let kept = stage.saved_bytes();
    for mb in [1, 0] {
        let chunk = Chunk::new(0, 1, mb);
        let g = stage
            .backward_input(chunk, Some(random(n, c.d_model, 10 + mb as u64)))
            .unwrap()
            .unwrap();
        out.push(bits(&g));
        stage.backward_weight(chunk).unwrap();
    }
    assert_eq!(stage.pending(), 0, "{recompute}: saved tensors left");
    assert_eq!(stage.saved_bytes(), 0, "{recompute}: saved bytes left");
    out.extend(stage.params().iter().map(|p| bits(&p.grad)));
    (out, kept)
}

#[test]
fn a_multi_block_stage_is_bit_identical_and_keeps_less() {
    let (want, none_bytes) = middle_stage(Recompute::None);
    let c = config(3);
    let (n, d, t) = (2 * c.seq_len, c.d_model, c.seq_len);
    let probs = 2 * c.heads * t * t;
    // Per block and chunk (elements): 16·N·d + 2N + probs saved; full keeps the input N·d;
    // selective the input, the attention's output, its input, q/k/v, its probabilities and
    // the projection's input: 7·N·d + probs.
    let per_chunk = |e: usize| 2 * 3 * e * 8;
    assert_eq!(none_bytes, per_chunk(16 * n * d + 2 * n + probs));
    for (mode, elements) in [
        (Recompute::Full, n * d),
        (Recompute::Selective, 7 * n * d + probs),
    ] {
        let (got, bytes) = middle_stage(mode);
        assert_eq!(got, want, "{mode}: outputs or gradients differ from none");
        assert_eq!(bytes, per_chunk(elements), "{mode}: bytes kept");
        assert!(bytes < none_bytes);
    }
}

/// The losses (bits) and every gradient (bits, by name) of one step of `kind` on 4 ranks.
fn pipeline_step(kind: ScheduleKind, recompute: Recompute) -> (Vec<u64>, Vec<(String, Vec<u64>)>) {
    let schedule = dualpipe_schedule::build(kind, 4, 8, kind.default_virtual_stages()).unwrap();
    let c = config(2 * schedule.placement.stages());
    let weights = GptWeights::random(&c, 21).unwrap();
    let data = TextData::new(&text(), c.seq_len, 0.1, None).unwrap();
    let batch = data.batch(0, 8, 2);
    let mut ranks = build_stages(&schedule, &weights).unwrap();
    for (_, s) in ranks.iter_mut().flat_map(RankStages::iter_mut) {
        s.set_batch(batch.clone());
        s.set_recompute(recompute);
    }
    let outcome = run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap();
    for (_, s) in ranks.iter().flat_map(RankStages::iter) {
        assert_eq!(s.pending(), 0);
    }
    sum_stage_copies(&schedule.placement, &mut ranks).unwrap();
    let mut losses: Vec<_> = outcome
        .losses
        .iter()
        .map(|l| (l.global_mb, l.loss))
        .collect();
    losses.sort_by_key(|l| l.0);
    let mut grads: Vec<_> = gradients_by_name(&ranks)
        .into_iter()
        .map(|(n, g)| (n, bits(&g)))
        .collect();
    grads.sort();
    (losses.into_iter().map(|l| l.1.to_bits()).collect(), grads)
}

#[test]
fn dualpipe_steps_are_bit_identical() {
    for kind in [ScheduleKind::DualPipe, ScheduleKind::DualPipeV] {
        let want = pipeline_step(kind, Recompute::None);
        for mode in [Recompute::Full, Recompute::Selective] {
            assert_eq!(pipeline_step(kind, mode), want, "{kind} with {mode}");
        }
    }
}
