//! The sequential reference (our layers, stage by stage, moved here with the training
//! configuration) against candle's autograd of the whole model written as one expression.

use candle_core::{DType, Tensor, Var};
use dualpipe_schedule::ScheduleKind;
use dualpipe_testutil::{assert_close, scalar_rel};
use dualpipe_train::{ModelSection, OptimizerSection, ScheduleSection};
use dualpipe_train::{OptimizerKind, Reference, TrainConfig};

/// GELU built from elementary ops so candle's autograd differentiates it exactly
/// (candle's own `gelu_erf` backward uses a rounded 1/√(2π)).
fn gelu_oracle(x: &Tensor) -> Tensor {
    let cdf = x
        .affine(std::f64::consts::FRAC_1_SQRT_2, 0.0)
        .unwrap()
        .erf()
        .unwrap()
        .affine(0.5, 0.5)
        .unwrap();
    (x * cdf).unwrap()
}

fn linear_oracle(x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
    x.matmul(&w.t().unwrap()).unwrap().broadcast_add(b).unwrap()
}

/// One residual block `x + fc2(gelu(fc1 x))`, parameters `[w1, b1, w2, b2]`.
fn block_oracle(x: &Tensor, p: &[Tensor]) -> Tensor {
    let h = gelu_oracle(&linear_oracle(x, &p[0], &p[1]));
    (x + linear_oracle(&h, &p[2], &p[3])).unwrap()
}

/// The sequential reference (our layers, stage by stage) against candle's autograd of the
/// whole model written as one expression: losses and every parameter gradient.
#[test]
fn reference_matches_autograd_of_the_whole_model() {
    let config = TrainConfig {
        model: ModelSection {
            hidden: 4,
            layers_per_stage: 2,
            dtype: dualpipe_train::DType::F64,
            ..TrainConfig::MLP.model
        },
        schedule: ScheduleSection::new(ScheduleKind::OneFOneB, 3, 3, 2),
        optimizer: OptimizerSection {
            kind: OptimizerKind::sgd(),
            lr: 0.1,
            ..TrainConfig::MLP.optimizer
        },
        seed: 5,
        ..TrainConfig::MLP
    };
    let mut reference = Reference::new(&config).unwrap();
    let params = reference.parameters();
    let vars: Vec<Vec<Var>> = params
        .iter()
        .map(|s| s.iter().map(|t| Var::from_tensor(t).unwrap()).collect())
        .collect();
    let data = dualpipe_nn::data::DataSet::new(5, 4, 2, DType::F64).unwrap();
    let mut total: Option<Tensor> = None;
    let mut losses = Vec::new();
    for mb in 0..3 {
        let batch = data.micro_batch(0, mb).unwrap();
        let mut x = batch.inputs.clone();
        for stage in &vars {
            for block in stage.chunks(4) {
                let p: Vec<Tensor> = block.iter().map(|v| v.as_tensor().clone()).collect();
                x = block_oracle(&x, &p);
            }
        }
        let mse = (&x - &batch.targets)
            .unwrap()
            .sqr()
            .unwrap()
            .mean_all()
            .unwrap();
        losses.push(mse.to_scalar::<f64>().unwrap());
        let term = mse.affine(1.0 / 3.0, 0.0).unwrap();
        total = Some(match total {
            None => term,
            Some(t) => (t + term).unwrap(),
        });
    }
    let grads = total.unwrap().backward().unwrap();
    let step = reference.step().unwrap();
    for (mb, (a, b)) in step.losses.iter().zip(&losses).enumerate() {
        assert!(
            scalar_rel(*a, *b) < 1e-13,
            "loss of micro-batch {mb}: {a} vs {b}"
        );
    }
    for (s, (ours, stage_vars)) in step.gradients.iter().zip(&vars).enumerate() {
        for (i, (g, v)) in ours.iter().zip(stage_vars).enumerate() {
            assert_close(
                g,
                grads.get(v).unwrap(),
                1e-12,
                &format!("stage {s} param {i}"),
            );
        }
    }
}
