//! The GPT's stages run by the runtime's executor under every schedule (2 and 4 ranks, f64):
//! every micro-batch loss and every gradient equal a sequential single-thread run of the same
//! model to 1e-10 relative.

use candle_core::DType;
use dualpipe_nn::gpt::data::TextData;
use dualpipe_nn::gpt::pipeline::{build_stages, gradients_by_name, sequential_step};
use dualpipe_nn::gpt::{tensor_names, GptConfig, GptStage, GptWeights};
use dualpipe_nn::StagePosition;
use dualpipe_runtime::{run_step, sum_stage_copies, ExecOptions, RankStages};
use dualpipe_schedule::ScheduleKind;
use dualpipe_testutil::{assert_close, scalar_rel};

const TOL: f64 = 1e-10;
const MICRO_BATCHES: usize = 8;
const ROWS: usize = 2;

fn text() -> Vec<u8> {
    let line = b"the quick brown fox jumps over the lazy dog; 0123456789\n";
    line.iter().cycle().take(2000).copied().collect()
}

fn check(kind: ScheduleKind, ranks: usize) {
    let schedule =
        dualpipe_schedule::build(kind, ranks, MICRO_BATCHES, kind.default_virtual_stages())
            .unwrap();
    let stages = schedule.placement.stages();
    let config = GptConfig {
        d_model: 8,
        heads: 2,
        layers: stages,
        seq_len: 6,
        dtype: DType::F64,
        moe: None,
    };
    let weights = GptWeights::random(&config, 21).unwrap();
    let data = TextData::new(&text(), config.seq_len, 0.1, None).unwrap();
    let batch = data.batch(0, MICRO_BATCHES, ROWS);

    let mut ranks_stages = build_stages(&schedule, &weights).unwrap();
    for (_, s) in ranks_stages.iter_mut().flat_map(RankStages::iter_mut) {
        s.set_batch(batch.clone());
    }
    let outcome = run_step(&schedule, &mut ranks_stages, &ExecOptions::default())
        .unwrap_or_else(|e| panic!("{kind} on {ranks} ranks: {e}"));
    for (_, s) in ranks_stages.iter().flat_map(RankStages::iter) {
        assert_eq!(s.pending(), 0, "{kind}: a stage kept saved tensors");
        assert_eq!(s.saved_bytes(), 0, "{kind}: a stage reports saved bytes");
    }
    sum_stage_copies(&schedule.placement, &mut ranks_stages).unwrap();

    let mut whole = GptStage::new(
        &weights,
        1,
        StagePosition {
            dir: 0,
            model_stage: 0,
            micro_batches: MICRO_BATCHES,
            micro_batches_per_dir: MICRO_BATCHES,
        },
    )
    .unwrap();
    let losses = sequential_step(&mut whole, batch).unwrap();
    assert_eq!(outcome.losses.len(), MICRO_BATCHES);
    for l in &outcome.losses {
        let want = losses[l.global_mb];
        assert!(
            scalar_rel(l.loss, want) <= TOL,
            "{kind} on {ranks} ranks, micro-batch {}: {} vs sequential {want}",
            l.global_mb,
            l.loss
        );
    }
    let grads = gradients_by_name(&ranks_stages);
    let want: std::collections::HashMap<_, _> = whole
        .param_names()
        .into_iter()
        .zip(whole.params().into_iter().map(|p| p.grad.clone()))
        .collect();
    assert_eq!(grads.len(), tensor_names(&config).len());
    for (name, g) in &grads {
        assert_close(
            g,
            &want[name],
            TOL,
            &format!("{kind} on {ranks} ranks: {name}"),
        );
    }
}

#[test]
fn every_schedule_matches_the_sequential_run() {
    for kind in ScheduleKind::ALL {
        for ranks in [2, 4] {
            check(kind, ranks);
        }
    }
}

/// `saved_bytes` of a single-block middle stage counts exactly what the split backward keeps:
/// after F per block `16·N·d + 2N + rows·heads·T²` elements (N = rows·T tokens), after I
/// `20·N·d + 2N` (inputs and output gradients waiting for W), after W nothing.
#[test]
fn saved_bytes_follow_the_split_backward() {
    use candle_core::{Device, Tensor};
    use dualpipe_runtime::{ForwardInput, Stage};
    use dualpipe_schedule::Chunk;

    let (d, heads, seq, rows) = (8, 2, 6, ROWS);
    let config = GptConfig {
        d_model: d,
        heads,
        layers: 3,
        seq_len: seq,
        dtype: DType::F64,
        moe: None,
    };
    let weights = GptWeights::random(&config, 3).unwrap();
    let data = TextData::new(&text(), seq, 0.0, None).unwrap();
    let position = StagePosition {
        dir: 0,
        model_stage: 1,
        micro_batches: 1,
        micro_batches_per_dir: 1,
    };
    let mut stage = GptStage::new(&weights, 3, position).unwrap();
    stage.set_batch(data.batch(0, 1, rows));
    let n = rows * seq;
    let c = Chunk::new(0, 1, 0);
    let x = Tensor::ones((n, d), DType::F64, &Device::Cpu).unwrap();
    stage.forward(c, ForwardInput::Activation(x)).unwrap();
    assert_eq!(
        stage.saved_bytes(),
        (16 * n * d + 2 * n + rows * heads * seq * seq) * 8
    );
    let g = Tensor::ones((n, d), DType::F64, &Device::Cpu).unwrap();
    stage.backward_input(c, Some(g)).unwrap();
    assert_eq!(stage.saved_bytes(), (20 * n * d + 2 * n) * 8);
    stage.backward_weight(c).unwrap();
    assert_eq!(stage.saved_bytes(), 0);
}
