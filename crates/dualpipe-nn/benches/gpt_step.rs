//! One GPT pipeline step (forward and split backward of every micro-batch, the copies' gradient
//! sum; no optimizer) at the shapes of issue 13's comparison with PyTorch by default: d 128,
//! 4 heads, seq 64, 8 blocks, 8 micro-batches of 16 sequences, f32.
//!
//! The environment changes the shapes and the precision (issue 30): `GPT_STEP_D_MODEL`,
//! `GPT_STEP_HEADS`, `GPT_STEP_SEQ`, `GPT_STEP_ROWS` (sequences per micro-batch) and
//! `GPT_STEP_DTYPE=f32|bf16` (bf16: every stage switched to mixed precision with
//! `GptStage::set_half(Some(Half::Bf16))`, f32 master weights); `GPT_STEP_HALF_PROJECTIONS=1`
//! runs the attention projections in bf16 too (`GptStage::set_half_projections`, PyTorch
//! autocast's recipe). The blocks (8), micro-batches (8) and ranks (4) stay.
//!
//! - `cargo bench -p dualpipe-nn --bench gpt_step`: criterion timings of `dualpipev_4_ranks`
//!   (one block per stage, 8 stages over 4 rank threads) and `sequential` (the whole model on
//!   the calling thread, the single-thread oracle);
//! - `GPT_STEP_JSON=FILE [GPT_STEP_STEPS=N] cargo bench -p dualpipe-nn --bench gpt_step`: no
//!   criterion; times N steps of each (after one warm-up step) and writes one JSON object with
//!   every step's seconds (wall clock, and the CPU seconds of all the process's threads), the
//!   median's tokens per second, and the activation memory per rank:
//!   the most bytes of saved tensors the rank's stages held at once (measured after every op),
//!   against the simulator's peak-activation count times the bytes one micro-batch leaves at
//!   one single-block stage. `scripts/torch_gpt_perf.py` runs this beside PyTorch.
//!   `GPT_STEP_ONLY=sequential` (or `dualpipev`) builds and measures that one alone (for a
//!   profiler); the other's measured members are then empty.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Tensor};
use criterion::Criterion;
use dualpipe_nn::gpt::data::TextData;
use dualpipe_nn::gpt::pipeline::sequential_step;
use dualpipe_nn::gpt::{GptConfig, GptStage, GptWeights, TokenBatch};
use dualpipe_nn::{Half, StagePosition};
use dualpipe_runtime::{
    run_step, sum_stage_copies, try_build_ranks, ExecOptions, ForwardInput, ForwardOutput,
    RankStages, Stage, StageError,
};
use dualpipe_schedule::{Chunk, Schedule, ScheduleKind};

const LAYERS: usize = 8;
const MICRO_BATCHES: usize = 8;
const RANKS: usize = 4;

/// The shapes and precision of the run, from the environment (defaults: issue 13's).
#[derive(Clone, Copy, Debug)]
struct Shape {
    d_model: usize,
    heads: usize,
    seq: usize,
    /// Sequences per micro-batch.
    rows: usize,
    /// `None`: f32 throughout; `Some`: mixed precision in this format.
    half: Option<Half>,
    /// Whether the attention projections follow `half` too.
    half_projections: bool,
}

impl Shape {
    fn from_env() -> Shape {
        fn var(name: &str, default: usize) -> usize {
            match std::env::var(name) {
                Ok(v) => v
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v}: not a whole number")),
                Err(_) => default,
            }
        }
        let half = match std::env::var("GPT_STEP_DTYPE").as_deref() {
            Err(_) | Ok("f32") => None,
            Ok("bf16") => Some(Half::Bf16),
            Ok(other) => panic!("GPT_STEP_DTYPE={other}: use f32 or bf16"),
        };
        Shape {
            d_model: var("GPT_STEP_D_MODEL", 128),
            heads: var("GPT_STEP_HEADS", 4),
            seq: var("GPT_STEP_SEQ", 64),
            rows: var("GPT_STEP_ROWS", 16),
            half,
            half_projections: var("GPT_STEP_HALF_PROJECTIONS", 0) != 0,
        }
    }

    fn tokens_per_step(&self) -> usize {
        MICRO_BATCHES * self.rows * self.seq
    }

    fn dtype_name(&self) -> &'static str {
        match self.half {
            None => "f32",
            Some(Half::Bf16) => "bf16",
            Some(Half::F16) => "f16",
        }
    }
}

/// Switches `stage` to the run's precision.
fn set_precision(stage: &mut GptStage, shape: &Shape) {
    if shape.half.is_some() {
        stage.set_half(shape.half).expect("mixed precision");
        stage
            .set_half_projections(shape.half_projections)
            .expect("half projections");
    }
}

/// A stage that records, after every op, the bytes of saved tensors of all stages of its rank
/// (the rank's stages run on one thread, so the shared counter is updated in program order).
struct Tracked {
    inner: GptStage,
    /// This stage's saved bytes at its last op.
    mine: usize,
    live: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl Tracked {
    fn note(&mut self) {
        let now = self.inner.saved_bytes();
        let live = self.live.load(Ordering::Relaxed) + now - self.mine;
        self.mine = now;
        self.live.store(live, Ordering::Relaxed);
        self.peak.fetch_max(live, Ordering::Relaxed);
    }
}

impl Stage for Tracked {
    type Tensor = Tensor;

    fn forward(
        &mut self,
        chunk: Chunk,
        input: ForwardInput<Tensor>,
    ) -> Result<ForwardOutput<Tensor>, StageError> {
        let out = self.inner.forward(chunk, input);
        self.note();
        out
    }

    fn backward_input(
        &mut self,
        chunk: Chunk,
        grad_output: Option<Tensor>,
    ) -> Result<Option<Tensor>, StageError> {
        let out = self.inner.backward_input(chunk, grad_output);
        self.note();
        out
    }

    fn backward_weight(&mut self, chunk: Chunk) -> Result<(), StageError> {
        let out = self.inner.backward_weight(chunk);
        self.note();
        out
    }

    fn gradients(&self) -> Vec<Tensor> {
        self.inner.gradients()
    }

    fn add_gradients(&mut self, other: &[Tensor]) -> Result<(), StageError> {
        self.inner.add_gradients(other)
    }
}

fn config(shape: &Shape) -> GptConfig {
    GptConfig {
        d_model: shape.d_model,
        heads: shape.heads,
        layers: LAYERS,
        seq_len: shape.seq,
        dtype: DType::F32,
        moe: None,
    }
}

/// Seeded bytes (a few words repeated with seeded noise): the timing does not depend on them.
fn text() -> Vec<u8> {
    let words = b"the quick brown fox jumps over the lazy dog; ";
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..400_000)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if state.is_multiple_of(8) {
                (state >> 32) as u8
            } else {
                words[i % words.len()]
            }
        })
        .collect()
}

struct Setup {
    shape: Shape,
    schedule: Schedule,
    weights: GptWeights,
    data: TextData,
}

fn setup() -> Setup {
    let shape = Shape::from_env();
    let schedule = dualpipe_schedule::build(
        ScheduleKind::DualPipeV,
        RANKS,
        MICRO_BATCHES,
        ScheduleKind::DualPipeV.default_virtual_stages(),
    )
    .expect("schedule");
    assert_eq!(schedule.placement.stages(), LAYERS, "one block per stage");
    Setup {
        shape,
        schedule,
        weights: GptWeights::random(&config(&shape), 0).expect("weights"),
        data: TextData::new(&text(), shape.seq, 0.0, None).expect("data"),
    }
}

/// The pipeline's stages, each wrapped to track its rank's saved bytes; the rank's peaks.
fn tracked_stages(s: &Setup) -> (Vec<RankStages<Tracked>>, Vec<Arc<AtomicUsize>>) {
    let per_dir = s.schedule.micro_batches_per_dir();
    let trackers: Vec<(Arc<AtomicUsize>, Arc<AtomicUsize>)> = (0..s.schedule.ranks)
        .map(|_| (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))))
        .collect();
    let ranks = try_build_ranks(&s.schedule.placement, |rank, dir, stage| {
        let position = StagePosition {
            dir,
            model_stage: stage,
            micro_batches: s.schedule.micro_batches,
            micro_batches_per_dir: per_dir,
        };
        GptStage::new(&s.weights, s.schedule.placement.stages(), position).map(|mut inner| {
            set_precision(&mut inner, &s.shape);
            Tracked {
                inner,
                mine: 0,
                live: trackers[rank].0.clone(),
                peak: trackers[rank].1.clone(),
            }
        })
    })
    .expect("stages");
    let peaks = trackers.into_iter().map(|(_, p)| p).collect();
    (ranks, peaks)
}

fn pipeline_step(s: &Setup, ranks: &mut [RankStages<Tracked>], batch: &TokenBatch) -> f64 {
    let start = Instant::now();
    for (_, st) in ranks.iter_mut().flat_map(RankStages::iter_mut) {
        st.inner.zero_grad().expect("zero grad");
        st.inner.set_batch(batch.clone());
    }
    run_step(&s.schedule, ranks, &ExecOptions::default()).expect("step");
    sum_stage_copies(&s.schedule.placement, ranks).expect("gradient sum");
    start.elapsed().as_secs_f64()
}

fn whole(s: &Setup) -> GptStage {
    let mut stage = GptStage::new(
        &s.weights,
        1,
        StagePosition {
            dir: 0,
            model_stage: 0,
            micro_batches: MICRO_BATCHES,
            micro_batches_per_dir: MICRO_BATCHES,
        },
    )
    .expect("whole model");
    set_precision(&mut stage, &s.shape);
    stage
}

fn sequential(stage: &mut GptStage, batch: &TokenBatch) -> f64 {
    let start = Instant::now();
    stage.zero_grad().expect("zero grad");
    sequential_step(stage, batch.clone()).expect("sequential step");
    start.elapsed().as_secs_f64()
}

/// Bytes one micro-batch leaves saved after its forward at a single-block stage (stage 1).
fn one_micro_batch_bytes(s: &Setup, batch: &TokenBatch) -> usize {
    let position = StagePosition {
        dir: 0,
        model_stage: 1,
        micro_batches: MICRO_BATCHES,
        micro_batches_per_dir: MICRO_BATCHES,
    };
    let mut stage = GptStage::new(&s.weights, LAYERS, position).expect("stage 1");
    set_precision(&mut stage, &s.shape);
    stage.set_batch(batch.clone());
    let x = Tensor::zeros(
        (s.shape.rows * s.shape.seq, s.shape.d_model),
        DType::F32,
        &candle_core::Device::Cpu,
    )
    .expect("input");
    stage
        .forward(Chunk::new(0, 1, 0), ForwardInput::Activation(x))
        .expect("forward");
    stage.saved_bytes()
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// VmHWM of this process in bytes (Linux), if readable.
fn vm_hwm() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU seconds this process has used, all its threads (those that ended too), if readable.
fn process_cpu_seconds() -> Option<f64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec for clock_gettime to write.
        if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0 {
            return Some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9);
        }
    }
    None
}

/// CPU seconds used since `start` (from [`process_cpu_seconds`]), as JSON (`null` if unknown).
fn cpu_since(start: Option<f64>) -> String {
    match (start, process_cpu_seconds()) {
        (Some(a), Some(b)) => format!("{}", b - a),
        _ => "null".to_string(),
    }
}

fn list<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
}

fn measure_json(path: &str) {
    let steps: usize = std::env::var("GPT_STEP_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
        .max(1);
    let s = setup();
    let batches: Vec<TokenBatch> = (0..=steps)
        .map(|t| s.data.batch(t, MICRO_BATCHES, s.shape.rows))
        .collect();

    let only = std::env::var("GPT_STEP_ONLY").ok();
    let runs = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if let Some(o) = only
        .as_deref()
        .filter(|o| !["sequential", "dualpipev"].contains(o))
    {
        panic!("GPT_STEP_ONLY={o}: use sequential or dualpipev");
    }
    // A contender not run leaves its members empty.
    let (mut pipe, mut pipe_cpu, mut peak_bytes) = (Vec::new(), Vec::new(), Vec::new());
    if runs("dualpipev") {
        let (mut ranks, peaks) = tracked_stages(&s);
        for (t, b) in batches.iter().enumerate() {
            let cpu = process_cpu_seconds();
            let secs = pipeline_step(&s, &mut ranks, b);
            if t > 0 {
                pipe.push(secs);
                pipe_cpu.push(cpu_since(cpu));
            }
        }
        peak_bytes = peaks.iter().map(|p| p.load(Ordering::Relaxed)).collect();
    }
    let cost = dualpipe_sim::CostModel::uniform(1.0, 2.0, 1.0, 3.0);
    let timeline = dualpipe_sim::simulate(&s.schedule, &cost).expect("simulate");
    let sim = dualpipe_sim::metrics(&timeline, &s.schedule.placement);
    let unit = one_micro_batch_bytes(&s, &batches[0]);
    let predicted: Vec<usize> = sim
        .peak_activations_per_rank
        .iter()
        .map(|&n| n * unit)
        .collect();

    let (mut seq, mut seq_cpu) = (Vec::new(), Vec::new());
    if runs("sequential") {
        let mut stage = whole(&s);
        for (t, b) in batches.iter().enumerate() {
            let cpu = process_cpu_seconds();
            let secs = sequential(&mut stage, b);
            if t > 0 {
                seq.push(secs);
                seq_cpu.push(cpu_since(cpu));
            }
        }
    }
    let tps = |v: &[f64]| {
        if v.is_empty() {
            "null".to_string()
        } else {
            (s.shape.tokens_per_step() as f64 / median(v)).to_string()
        }
    };
    let json = format!(
        concat!(
            "{{\"d_model\": {}, \"heads\": {}, \"seq_len\": {}, \"layers\": {}, ",
            "\"micro_batches\": {}, \"rows\": {}, \"ranks\": {}, \"dtype\": \"{}\", \"half_projections\": {}, ",
            "\"tokens_per_step\": {}, \"steps\": {},\n",
            " \"dualpipev\": {{\"step_seconds\": [{}], \"cpu_seconds\": [{}], \"tokens_per_second\": {}, ",
            "\"peak_saved_bytes_per_rank\": [{}], \"sim_peak_activations_per_rank\": [{}], ",
            "\"micro_batch_stage_bytes\": {}, \"predicted_bytes_per_rank\": [{}]}},\n",
            " \"sequential\": {{\"step_seconds\": [{}], \"cpu_seconds\": [{}], \"tokens_per_second\": {}}},\n",
            " \"vm_hwm_bytes\": {}}}\n"
        ),
        s.shape.d_model,
        s.shape.heads,
        s.shape.seq,
        LAYERS,
        MICRO_BATCHES,
        s.shape.rows,
        RANKS,
        s.shape.dtype_name(),
        s.shape.half.is_some() && s.shape.half_projections,
        s.shape.tokens_per_step(),
        steps,
        list(&pipe),
        list(&pipe_cpu),
        tps(&pipe),
        list(&peak_bytes),
        list(&sim.peak_activations_per_rank),
        unit,
        list(&predicted),
        list(&seq),
        list(&seq_cpu),
        tps(&seq),
        vm_hwm().map_or("null".to_string(), |b| b.to_string()),
    );
    std::fs::write(path, json).expect("write the JSON");
}

fn bench(c: &mut Criterion) {
    let s = setup();
    let batch = s.data.batch(0, MICRO_BATCHES, s.shape.rows);
    let suffix = match s.shape.half {
        None => String::new(),
        Some(_) => format!("_{}", s.shape.dtype_name()),
    };
    let mut group = c.benchmark_group(format!(
        "gpt_step_d{}_seq{}_{}x{}{suffix}",
        s.shape.d_model, s.shape.seq, MICRO_BATCHES, s.shape.rows
    ));
    group.sample_size(10);
    let (mut ranks, _) = tracked_stages(&s);
    group.bench_function("dualpipev_4_ranks", |b| {
        b.iter(|| pipeline_step(&s, &mut ranks, &batch))
    });
    let mut stage = whole(&s);
    group.bench_function("sequential", |b| b.iter(|| sequential(&mut stage, &batch)));
    group.finish();
}

fn main() {
    if let Ok(path) = std::env::var("GPT_STEP_JSON") {
        measure_json(&path);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
