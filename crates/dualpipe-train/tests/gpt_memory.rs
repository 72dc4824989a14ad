//! Peak activation memory per rank, measured against the simulator's prediction, for every
//! recomputation (none, selective, full), DualPipe and DualPipeV on 4 ranks, a GPT of 16
//! blocks at the default width (d_model 64, 4 heads, seq 32, 8 rows per micro-batch, 16
//! micro-batches, f32).
//!
//! Measured: every stage's `saved_bytes`, summed over the rank's stages and sampled after
//! each forward, input backward and weight backward the rank runs in the threaded step (a
//! `B` or an `FB` is sampled after each of its halves); the peak over the step.
//! Predicted: [`peak_activation_bytes`] walking the rank's program with what one chunk of
//! each stage keeps after its forward and after its input backward (measured on a fresh copy
//! of the stage, one chunk alone: the per-chunk sizes the simulator takes as input, as a
//! profile's `activation_bytes` and `w_bytes` are); and what `dualpipe plan` counts
//! ([`dualpipe_plan::rank_activation_bytes`]: the same walk plus one chunk's recomputed rest,
//! which the measurement does not sample). Run with `--nocapture` for the table
//! (docs/performance.md).

use std::sync::{Arc, Mutex};

use candle_core::{DType, Tensor};
use dualpipe_nn::gpt::data::TextData;
use dualpipe_nn::gpt::{GptConfig, GptStage, GptWeights, TokenBatch};
use dualpipe_nn::{Half, Recompute, StagePosition};
use dualpipe_runtime::{
    run_step, try_build_ranks, ExecOptions, ForwardInput, ForwardOutput, RankStages, Stage,
    StageError,
};
use dualpipe_schedule::{Chunk, Schedule, ScheduleKind};
use dualpipe_sim::{peak_activation_bytes, ChunkBytes};

const MICRO_BATCHES: usize = 16;
const ROWS: usize = 8;

/// A rank's live bytes and their peak.
#[derive(Default)]
struct Meter {
    live: i64,
    peak: i64,
}

/// A GPT stage that reports its saved bytes to its rank's meter after every call.
struct Measured {
    inner: GptStage,
    last: i64,
    meter: Arc<Mutex<Meter>>,
}

impl Measured {
    fn sample(&mut self) {
        let now = self.inner.saved_bytes() as i64;
        let mut m = self.meter.lock().unwrap();
        m.live += now - self.last;
        m.peak = m.peak.max(m.live);
        self.last = now;
    }
}

impl Stage for Measured {
    type Tensor = Tensor;

    fn forward(
        &mut self,
        chunk: Chunk,
        input: ForwardInput<Tensor>,
    ) -> Result<ForwardOutput<Tensor>, StageError> {
        let out = self.inner.forward(chunk, input)?;
        self.sample();
        Ok(out)
    }

    fn backward_input(
        &mut self,
        chunk: Chunk,
        grad_output: Option<Tensor>,
    ) -> Result<Option<Tensor>, StageError> {
        let g = self.inner.backward_input(chunk, grad_output)?;
        self.sample();
        Ok(g)
    }

    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), StageError> {
        self.inner.backward_weight(chunk)?;
        self.sample();
        Ok(())
    }
}

fn config(layers: usize) -> GptConfig {
    GptConfig {
        d_model: 64,
        heads: 4,
        layers,
        seq_len: 32,
        dtype: DType::F32,
        moe: None,
    }
}

fn stage(
    weights: &GptWeights,
    schedule: &Schedule,
    dir: usize,
    s: usize,
    recompute: Recompute,
    half: Option<Half>,
    batch: &TokenBatch,
) -> GptStage {
    let mut g = GptStage::new(
        weights,
        schedule.placement.stages(),
        StagePosition {
            dir,
            model_stage: s,
            micro_batches: schedule.micro_batches,
            micro_batches_per_dir: schedule.micro_batches_per_dir(),
        },
    )
    .unwrap();
    g.set_recompute(recompute);
    g.set_half(half).unwrap();
    g.set_batch(batch.clone());
    g
}

/// What one chunk of each model stage keeps after its forward and after its input backward.
fn chunk_bytes(
    weights: &GptWeights,
    schedule: &Schedule,
    recompute: Recompute,
    half: Option<Half>,
    batch: &TokenBatch,
) -> Vec<ChunkBytes> {
    let stages = schedule.placement.stages();
    let c = weights.config();
    let n = ROWS * c.seq_len;
    let hidden = || Tensor::ones((n, c.d_model), DType::F32, &candle_core::Device::Cpu).unwrap();
    (0..stages)
        .map(|s| {
            let mut g = stage(weights, schedule, 0, s, recompute, half, batch);
            let chunk = Chunk::new(0, s, 0);
            let input = if s == 0 {
                ForwardInput::MicroBatch { global_mb: 0 }
            } else {
                ForwardInput::Activation(hidden())
            };
            g.forward(chunk, input).unwrap();
            let forward = g.saved_bytes() as f64;
            let grad = (s + 1 < stages).then(hidden);
            g.backward_input(chunk, grad).unwrap();
            let backward = g.saved_bytes() as f64;
            g.backward_weight(chunk).unwrap();
            ChunkBytes { forward, backward }
        })
        .collect()
}

/// Per rank: measured peak, the simulator's and the planner formula's predictions.
fn measure(kind: ScheduleKind, recompute: Recompute, half: Option<Half>) -> Vec<(f64, f64, f64)> {
    let schedule =
        dualpipe_schedule::build(kind, 4, MICRO_BATCHES, kind.default_virtual_stages()).unwrap();
    let stages = schedule.placement.stages();
    let weights = GptWeights::random(&config(16), 7).unwrap();
    let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog; 0123456789\n"
        .iter()
        .cycle()
        .take(20000)
        .copied()
        .collect();
    let data = TextData::new(&text, 32, 0.1, None).unwrap();
    let batch = data.batch(0, MICRO_BATCHES, ROWS);
    let meters: Vec<Arc<Mutex<Meter>>> = (0..4).map(|_| Arc::default()).collect();
    let mut ranks: Vec<RankStages<Measured>> =
        try_build_ranks(&schedule.placement, |rank, dir, s| {
            Ok::<_, ()>(Measured {
                inner: stage(&weights, &schedule, dir, s, recompute, half, &batch),
                last: 0,
                meter: meters[rank].clone(),
            })
        })
        .unwrap();
    run_step(&schedule, &mut ranks, &ExecOptions::default()).unwrap();
    let bytes = chunk_bytes(&weights, &schedule, recompute, half, &batch);
    let none = chunk_bytes(&weights, &schedule, Recompute::None, half, &batch);
    assert_eq!(bytes.len(), stages);
    (0..4)
        .map(|r| {
            let ops: Vec<_> = schedule.programs[r]
                .iter()
                .filter(|op| op.is_compute())
                .collect();
            let sim = peak_activation_bytes(ops.iter().copied(), |s| bytes[s]);
            let planner = dualpipe_plan::rank_activation_bytes(ops.iter().copied(), |s| {
                (bytes[s], none[s].forward - bytes[s].forward)
            });
            let measured = meters[r].lock().unwrap().peak as f64;
            (measured, sim, planner)
        })
        .collect()
}

#[test]
fn peak_memory_per_rank_matches_the_simulator() {
    println!("| schedule | recompute | rank | measured MiB | simulator MiB | ratio | planner MiB | ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    for kind in [ScheduleKind::DualPipe, ScheduleKind::DualPipeV] {
        let mut base = Vec::new();
        for mode in [Recompute::None, Recompute::Selective, Recompute::Full] {
            let rows = measure(kind, mode, None);
            for (r, &(m, sim, planner)) in rows.iter().enumerate() {
                let mib = |b: f64| b / (1u64 << 20) as f64;
                println!(
                    "| {kind} | {mode} | {r} | {:.2} | {:.2} | {:.3} | {:.2} | {:.3} |",
                    mib(m),
                    mib(sim),
                    m / sim,
                    mib(planner),
                    m / planner
                );
                assert!(
                    (m / sim - 1.0).abs() <= 0.10,
                    "{kind} {mode} rank {r}: measured {m} vs simulated {sim}"
                );
                // The planner's count is the walk plus a recomputing chunk's transient: never
                // below what was measured, and within 10% of it without recomputation.
                assert!(
                    planner >= m * (1.0 - 1e-9),
                    "{kind} {mode} rank {r}: the planner counts {planner}, measured {m}"
                );
                if mode == Recompute::None {
                    assert!((m / planner - 1.0).abs() <= 0.10, "{kind} rank {r}");
                }
            }
            if mode == Recompute::None {
                base = rows.iter().map(|x| x.0).collect();
            } else {
                for (r, x) in rows.iter().enumerate() {
                    assert!(x.0 < base[r], "{kind} {mode} rank {r} keeps no less");
                }
            }
        }
    }
}

#[test]
fn bf16_peak_memory_per_rank_matches_the_simulator_and_is_below_f32() {
    println!("| schedule | recompute | rank | f32 measured MiB | bf16 measured MiB | bf16 simulator MiB | bf16 / simulator | bf16 / f32 |");
    println!("|---|---|---|---|---|---|---|---|");
    let kind = ScheduleKind::DualPipeV;
    for mode in [Recompute::None, Recompute::Full] {
        let full = measure(kind, mode, None);
        let half = measure(kind, mode, Some(Half::Bf16));
        for (r, (&(f, _, _), &(m, sim, _))) in full.iter().zip(&half).enumerate() {
            let mib = |b: f64| b / (1u64 << 20) as f64;
            println!(
                "| {kind} | {mode} | {r} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} |",
                mib(f),
                mib(m),
                mib(sim),
                m / sim,
                m / f
            );
            assert!(
                (m / sim - 1.0).abs() <= 0.10,
                "bf16 {mode} rank {r}: measured {m} vs simulated {sim}"
            );
            // Saving everything, about 5/8 of f32's bytes (the attention projections' inputs
            // and the norms' stay f32); full recomputation keeps each block's input in f32.
            let most = if mode == Recompute::None { 0.7 } else { 0.9 };
            assert!(
                m < most * f,
                "bf16 {mode} rank {r}: {m} bytes against f32's {f}"
            );
        }
    }
}
