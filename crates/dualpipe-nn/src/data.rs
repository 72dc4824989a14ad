//! Teacher-student regression data.
//!
//! Inputs are uniform in `[-√3, √3)` (zero mean, unit variance) and drawn from the stream
//! (seed, step, global micro-batch); targets are a fixed random *teacher* — one residual MLP
//! block of the same width with unit-gain weights, drawn from its own seed stream — applied to
//! the inputs. The student can represent the teacher exactly, so the loss can fall towards zero.
//! Inputs are drawn in f64 and cast; the teacher's weights are drawn in f64 and cast to the
//! run's element type, in which the targets are computed (an f32 run's targets are the f32
//! teacher's, so data generation runs at f32 speed; f64 runs are exact).

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use crate::error::{NnError, TensorContext};
use crate::layers::MlpBlock;
use crate::rng::{self, Purpose};

/// Gain of the teacher's weights (uniform in `±gain/√fan_in`; √3 gives unit variance gain).
const TEACHER_GAIN: f64 = 1.732_050_807_568_877_2;

/// The inputs and targets of one micro-batch, `[micro_batch_size, hidden]` each.
#[derive(Clone, Debug)]
pub struct MicroBatch {
    /// Inputs of the first stage.
    pub inputs: Tensor,
    /// Targets the last stage's output is compared to.
    pub targets: Tensor,
}

/// Every micro-batch of one training step, indexed by global micro-batch.
pub type Batch = Arc<Vec<MicroBatch>>;

/// The data source: a seeded teacher and seeded inputs.
#[derive(Debug)]
pub struct DataSet {
    seed: u64,
    hidden: usize,
    micro_batch_size: usize,
    dtype: DType,
    teacher: MlpBlock,
}

impl DataSet {
    /// The data set of `seed` for width `hidden` and `micro_batch_size` rows per micro-batch,
    /// delivered in `dtype` (F32 or F64).
    pub fn new(
        seed: u64,
        hidden: usize,
        micro_batch_size: usize,
        dtype: DType,
    ) -> Result<Self, NnError> {
        if hidden == 0 || micro_batch_size == 0 {
            return Err(NnError::Config(format!(
                "hidden ({hidden}) and micro_batch_size ({micro_batch_size}) must be at least 1"
            )));
        }
        let mut rng = rng::stream(seed, Purpose::Teacher, 0, 0);
        let teacher = MlpBlock::random(&mut rng, hidden, TEACHER_GAIN, dtype)?;
        Ok(DataSet {
            seed,
            hidden,
            micro_batch_size,
            dtype,
            teacher,
        })
    }

    /// Micro-batch `global_mb` of step `step`.
    pub fn micro_batch(&self, step: usize, global_mb: usize) -> Result<MicroBatch, NnError> {
        let mut rng = rng::stream(self.seed, Purpose::Inputs, step as u64, global_mb as u64);
        let count = self.micro_batch_size * self.hidden;
        let x = Tensor::from_vec(
            rng::uniform(&mut rng, count, 3f64.sqrt()),
            (self.micro_batch_size, self.hidden),
            &Device::Cpu,
        )
        .and_then(|x| x.to_dtype(self.dtype))
        .ctx("DataSet inputs")?;
        let targets = self.teacher.apply(&x)?;
        Ok(MicroBatch { inputs: x, targets })
    }

    /// All `micro_batches` micro-batches of step `step`.
    pub fn batch(&self, step: usize, micro_batches: usize) -> Result<Batch, NnError> {
        self.batch_from(step, 0, micro_batches)
    }

    /// Micro-batches `first .. first + micro_batches` of step `step` (a data-parallel
    /// replica's share of the global batch), as micro-batches `0 .. micro_batches`.
    pub fn batch_from(
        &self,
        step: usize,
        first: usize,
        micro_batches: usize,
    ) -> Result<Batch, NnError> {
        // Micro-batches are independent: draw them on a few threads (same result in any order).
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .clamp(1, micro_batches.max(1));
        let per_thread = micro_batches.div_ceil(threads);
        let parts: Vec<Result<Vec<MicroBatch>, NnError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let range = t * per_thread..((t + 1) * per_thread).min(micro_batches);
                    scope
                        .spawn(move || range.map(|mb| self.micro_batch(step, first + mb)).collect())
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(NnError::Stage("drawing a micro-batch panicked".into()))
                    })
                })
                .collect()
        });
        let mut mbs = Vec::with_capacity(micro_batches);
        for part in parts {
            mbs.extend(part?);
        }
        Ok(Arc::new(mbs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_data_other_step_other_data() {
        let d = DataSet::new(3, 4, 2, DType::F64).unwrap();
        let a = d.micro_batch(1, 2).unwrap();
        let b = d.micro_batch(1, 2).unwrap();
        let c = d.micro_batch(2, 2).unwrap();
        let v = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        assert_eq!(v(&a.inputs), v(&b.inputs));
        assert_eq!(v(&a.targets), v(&b.targets));
        assert_ne!(v(&a.inputs), v(&c.inputs));
        assert_eq!(a.inputs.dims(), &[2, 4]);
        // A replica's share: micro-batches 2.. of the step are batch_from(step, 2, ..).
        let whole = d.batch(1, 4).unwrap();
        let share = d.batch_from(1, 2, 2).unwrap();
        assert_eq!(share.len(), 2);
        for m in 0..2 {
            assert_eq!(v(&share[m].inputs), v(&whole[2 + m].inputs));
            assert_eq!(v(&share[m].targets), v(&whole[2 + m].targets));
        }
    }
}
